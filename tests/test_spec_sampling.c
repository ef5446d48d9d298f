/* Speculative sampling leaves the target's distribution unchanged on real models, not only in the
 * rule's own test (test_speculative's test_verify_rule). Many seeded runs of kvq_spec_step from
 * one prompt: the first token is the target's plain draw, the second is verified against a draft
 * (accepted, or resampled from the residual), and the caches are rolled back before the next run.
 * The counts of each (first, second) pair must match the exact distribution computed from the
 * target's own logits (chi-square, 99.9%). Cases: brown-llama fp16 as target with its AQLM 2x8
 * (the demo model) as draft (needs ../shared), and prompt lookup on the demo model. Both branches
 * of the rule must occur often, and for the draft model the test checks that it could tell: a
 * sampler that kept every draft would exceed the bound several times over. KVQ_TEST_BACKEND /
 * KVQ_TEST_NGL: Vulkan and offload (not in CI: lavapipe takes 8 minutes for it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

#define TOPK 4 /* the sampler keeps at most this many tokens: at most TOPK * TOPK pairs */
#define TRIALS 1500
#define MAX_CELLS (TOPK * TOPK + 1) /* a cell per pair and the lump */

static const char *g_backend;
static int g_skip; /* the backend asked for does not start here */

/* chi-square quantile at 99.9% for 1..20 degrees of freedom */
static const double k_chi999[21] = {0,     10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59,
                                    31.26, 32.91, 34.53, 36.12, 37.70, 39.25, 40.79, 42.31, 43.82, 45.31};

static int setup(void **state) {
    (void)state;
    g_skip = !tu_env_backend(&g_backend);
    return 0;
}

static kvq_model *load(const char *dir) {
    if (g_skip) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    mp.n_gpu_layers = tu_env_gpu_layers();
    mp.n_threads = 1;
    kvq_model *m = NULL;
    if (kvq_model_load(dir, &mp, &m) != KVQ_OK) fail_msg("load %s: %s", dir, kvq_last_error());
    return m;
}

static kvq_context *new_ctx(kvq_model *m, kvq_cache_type t) {
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = 128;
    cp.type_k = cp.type_v = t;
    kvq_context *c = NULL;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

static kvq_sampler *new_sampler(uint64_t seed) {
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 1.0f;
    sp.top_k = TOPK;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.0f;
    sp.seed = seed;
    return kvq_sampler_new(&sp);
}

/* The kept tokens of m's sampling distribution after ids[0..n): tok[0..k), prob[0..k). */
static int dist_after(kvq_model *m, kvq_cache_type t, const int32_t *ids, int n, int32_t *tok, double *prob) {
    kvq_context *c = new_ctx(m, t);
    assert_int_equal(kvq_eval(c, ids, n), KVQ_OK);
    int nv = kvq_model_n_vocab(m), k = 0;
    float *p = malloc(sizeof *p * (size_t)nv);
    assert_non_null(p);
    kvq_sampler *s = new_sampler(1);
    assert_int_equal(kvq_sampler_dist(s, kvq_logits(c), nv, p), KVQ_OK);
    for (int i = 0; i < nv; i++)
        if (p[i] > 0) {
            assert_true(k < TOPK);
            tok[k] = i, prob[k++] = p[i];
        }
    kvq_sampler_free(s);
    free(p);
    kvq_context_free(c);
    return k;
}

/* Every pair of tokens the target can give as its first two after the prompt, with its exact
 * probability; pairs expected fewer than 5 times in TRIALS share one lumped cell. */
typedef struct {
    int n;                   /* pairs */
    int32_t a[TOPK * TOPK], b[TOPK * TOPK];
    double e[TOPK * TOPK];   /* exact probability */
    double alt[TOPK * TOPK]; /* the same under a sampler that kept every draft (draft model only) */
    int cell[TOPK * TOPK];   /* its chi-square cell: its own, or n_cells - 1 (the lump) */
    int n_cells;
    double ce[MAX_CELLS], calt[MAX_CELLS]; /* e and alt summed per cell */
    double alt_outside;                    /* that sampler's mass on pairs the target never gives */
} pairs;

/* The exact joint distribution of the first two tokens after ids[0..n) under the target (and,
 * with drf, the one a sampler that kept every draft token would give). */
static void exact_pairs(kvq_model *tgt, kvq_model *drf, kvq_cache_type t, const int32_t *ids, int n, pairs *c) {
    memset(c, 0, sizeof *c);
    int32_t tok0[TOPK], tok1[TOPK], qt[TOPK], ext[130];
    double p0[TOPK], p1[TOPK], q1[TOPK];
    int k0 = dist_after(tgt, t, ids, n, tok0, p0);
    assert_true(n < 128);
    memcpy(ext, ids, sizeof *ext * (size_t)n);
    for (int i = 0; i < k0; i++) {
        ext[n] = tok0[i];
        int k1 = dist_after(tgt, t, ext, n + 1, tok1, p1), kq = drf ? dist_after(drf, t, ext, n + 1, qt, q1) : 0;
        for (int j = 0; j < k1; j++) {
            double alt = 0;
            for (int q = 0; q < kq; q++)
                if (qt[q] == tok1[j]) alt = p0[i] * q1[q];
            c->a[c->n] = tok0[i], c->b[c->n] = tok1[j], c->e[c->n] = p0[i] * p1[j], c->alt[c->n++] = alt;
        }
        for (int q = 0; q < kq; q++) {
            int in = 0;
            for (int j = 0; j < k1; j++) in |= qt[q] == tok1[j];
            if (!in) c->alt_outside += p0[i] * q1[q];
        }
    }
    int lumped = 0;
    for (int i = 0; i < c->n; i++) c->cell[i] = c->e[i] * TRIALS >= 5 ? c->n_cells++ : -1;
    for (int i = 0; i < c->n; i++)
        if (c->cell[i] < 0) c->cell[i] = c->n_cells, lumped = 1;
    c->n_cells += lumped;
    for (int i = 0; i < c->n; i++) c->ce[c->cell[i]] += c->e[i], c->calt[c->cell[i]] += c->alt[i];
}

/* TRIALS runs of the first two tokens through kvq_spec_step, each from the same prompt after a
 * rollback of both caches; the chi-square against c (*dof degrees of freedom) and the number of
 * pairs the target cannot give. */
static double run_trials(kvq_context *tc, kvq_spec *s, const int32_t *ids, int n, const pairs *c, int *dof,
                         int *impossible) {
    long cnt[MAX_CELLS] = {0};
    kvq_sampler *smp = new_sampler(12345);
    *impossible = 0;
    for (int r = 0; r < TRIALS; r++) {
        /* back to the prompt: the target holds ids[0..n) with ids[n-1]'s logits current */
        assert_int_equal(kvq_kv_truncate(tc, n - 1), KVQ_OK);
        assert_int_equal(kvq_eval(tc, ids + n - 1, 1), KVQ_OK);
        assert_int_equal(kvq_spec_sync(s, ids, n), KVQ_OK);
        kvq_sampler_reset(smp);
        int32_t out[3];
        int got = kvq_spec_step(s, smp, out, 3);
        if (got < 2) fail_msg("step gave %d tokens: %s", got, kvq_last_error());
        int i = 0;
        while (i < c->n && !(c->a[i] == out[0] && c->b[i] == out[1])) i++;
        if (i == c->n) ++*impossible;
        else cnt[c->cell[i]]++;
    }
    double chi = 0;
    *dof = -1;
    for (int i = 0; i < c->n_cells; i++) {
        double e = c->ce[i] * TRIALS;
        if (e < 5) continue; /* a lump too small for the approximation is left out */
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
        ++*dof;
    }
    kvq_sampler_free(smp);
    return chi;
}

static int tokens(kvq_model *m, const char *text, int32_t *ids) {
    int n = kvq_tokenize(kvq_model_tokenizer(m), text, strlen(text), 1, ids, 128);
    assert_true(n > 1);
    return n;
}

/* The first two tokens after text through kvq_spec_step, target tgt with t caches, drafted by drf
 * or (drf NULL) by prompt lookup of lookup_n tokens, against the exact distribution. */
static void check_spec(const char *name, kvq_model *tgt, kvq_model *drf, int lookup_n, kvq_cache_type t,
                       const char *text) {
    int32_t ids[128];
    int n = tokens(tgt, text, ids);
    pairs c;
    exact_pairs(tgt, drf, t, ids, n, &c);
    kvq_context *tc = new_ctx(tgt, t), *dc = drf ? new_ctx(drf, t) : NULL;
    kvq_spec_params p = kvq_spec_default_params();
    p.draft = dc;
    p.lookup_n = lookup_n;
    p.draft_max = 4;
    kvq_spec *s = NULL;
    if (kvq_spec_new(tc, &p, &s) != KVQ_OK) fail_msg("spec: %s", kvq_last_error());
    assert_int_equal(kvq_spec_prompt(s, ids, n), KVQ_OK);
    int dof, impossible;
    double chi = run_trials(tc, s, ids, n, &c, &dof, &impossible);
    uint64_t drafted = 0, accepted = 0;
    kvq_spec_stats(s, &drafted, &accepted);
    double acc = drafted ? (double)accepted / (double)drafted : -1;
    print_message("%s: %d pairs in %d cells, chi2 %.2f (%d dof, 99.9%%: %.2f), %llu drafts, accept %.3f\n", name, c.n,
                  c.n_cells, chi, dof, k_chi999[dof], (unsigned long long)drafted, acc);
    assert_true(dof >= 3 && dof <= 20);
    assert_int_equal(impossible, 0);
    assert_true(chi < k_chi999[dof]);
    assert_true(drafted > TRIALS / 4);
    assert_true(accepted >= 30 && drafted - accepted >= 30); /* both branches of the rule, often */
    if (drf) {
        /* the test could tell: what a sampler that kept every draft would score, N * sum (alt - e)^2 / e
         * over the cells plus the degrees of freedom, or the pairs it gives that the target cannot */
        double nc = 0;
        for (int i = 0; i < c.n_cells; i++)
            if (c.ce[i] * TRIALS >= 5) nc += TRIALS * (c.calt[i] - c.ce[i]) * (c.calt[i] - c.ce[i]) / c.ce[i];
        print_message("%s: keeping every draft would score ~%.1f and give %.1f%% impossible pairs\n", name, nc + dof,
                      100 * c.alt_outside);
        assert_true(nc + dof > 3 * k_chi999[dof] || c.alt_outside > 0.02);
    }
    kvq_spec_free(s);
    kvq_context_free(tc);
    kvq_context_free(dc);
}

/* brown-llama fp16 as target, its AQLM 2x8 (the demo model) as draft, q8 caches. */
static void test_draft_model(void **state) {
    (void)state;
    const char *dir = tu_fixture("models/brown-llama-fp16");
    TU_NEED_FIXTURE(dir);
    kvq_model *tgt = load(dir), *drf = load(KVQ_SOURCE_DIR "/models/demo");
    check_spec("draft model", tgt, drf, 0, KVQ_CACHE_Q8, "The jury further said in term end presentments that the");
    kvq_model_free(tgt);
    kvq_model_free(drf);
}

/* Prompt lookup on the demo model (a point mass as draft), q4 caches: the prompt repeats a
 * passage, and "of" and "important", two of the likely first tokens, occurred in it before. */
static void test_lookup(void **state) {
    (void)state;
    kvq_model *m = load(KVQ_SOURCE_DIR "/models/demo");
    check_spec("lookup", m, NULL, 1, KVQ_CACHE_Q4,
               "It is one of the most important things in the world. It is one of the most");
    kvq_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_model),
        cmocka_unit_test(test_lookup),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
