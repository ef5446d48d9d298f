/* Speculative decoding (src/speculative.c) on the demo model, as target and as its own draft:
 * greedy output equals plain decode token for token with a draft model and with prompt lookup
 * for every cache type; the accept/resample rule keeps the target's distribution (chi-square);
 * a draft_max past kvq_model_exact_rows is capped there (and stays exact); a mismatched
 * vocabulary is refused. KVQ_TEST_BACKEND / KVQ_TEST_NGL: Vulkan and offload. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

#define N_GEN 24

static const char *g_backend;
static kvq_model *g_m;

static int setup(void **state) {
    (void)state;
    if (!tu_env_backend(&g_backend)) return 0;
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    mp.n_gpu_layers = tu_env_gpu_layers();
    mp.n_threads = 1;
    if (kvq_model_load(KVQ_SOURCE_DIR "/models/demo", &mp, &g_m) != KVQ_OK) fail_msg("load: %s", kvq_last_error());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kvq_model_free(g_m);
    return 0;
}

static kvq_context *new_ctx(kvq_cache_type t) {
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = 256;
    cp.type_k = cp.type_v = t;
    kvq_context *c = NULL;
    if (kvq_context_new(g_m, &cp, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

/* A prompt that repeats a passage, so lookup has something to find. */
static int prompt(int32_t *ids) {
    const char *t = "The jury said that the city of Atlanta should take steps. The jury said that the city of";
    return kvq_tokenize(kvq_model_tokenizer(g_m), t, strlen(t), 1, ids, 128);
}

static void greedy_plain(kvq_cache_type t, int32_t *out) {
    int32_t ids[128];
    int n = prompt(ids);
    kvq_context *c = new_ctx(t);
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 0;
    kvq_sampler *smp = kvq_sampler_new(&sp);
    assert_int_equal(kvq_eval(c, ids, n), KVQ_OK);
    for (int i = 0; i < N_GEN; i++) {
        out[i] = kvq_sample(smp, kvq_logits(c), kvq_model_n_vocab(g_m));
        assert_int_equal(kvq_eval(c, &out[i], 1), KVQ_OK);
    }
    kvq_sampler_free(smp);
    kvq_context_free(c);
}

/* Greedy tokens through kvq_spec_step with draft_max k; *most: the most drafts one step verified. */
static void greedy_spec_k(kvq_cache_type t, int use_draft, int k, int32_t *out, uint64_t *drafted, uint64_t *accepted,
                          int *most) {
    int32_t ids[128];
    int n = prompt(ids);
    kvq_context *c = new_ctx(t), *d = use_draft ? new_ctx(t) : NULL;
    kvq_spec_params p = kvq_spec_default_params();
    p.draft = d;
    p.lookup_n = 2;
    p.draft_max = k;
    kvq_spec *s = NULL;
    if (kvq_spec_new(c, &p, &s) != KVQ_OK) fail_msg("spec: %s", kvq_last_error());
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 0;
    kvq_sampler *smp = kvq_sampler_new(&sp);
    assert_int_equal(kvq_spec_prompt(s, ids, n), KVQ_OK);
    for (int got = 0; got < N_GEN;) {
        int r = kvq_spec_step(s, smp, out + got, N_GEN - got);
        if (r <= 0) fail_msg("step: %s", kvq_last_error());
        got += r;
        uint64_t before = *drafted;
        kvq_spec_stats(s, drafted, accepted);
        if ((int)(*drafted - before) > *most) *most = (int)(*drafted - before);
    }
    kvq_spec_stats(s, drafted, accepted);
    kvq_spec_free(s);
    kvq_sampler_free(smp);
    kvq_context_free(c);
    kvq_context_free(d);
}

static void greedy_spec(kvq_cache_type t, int use_draft, int32_t *out, uint64_t *drafted, uint64_t *accepted) {
    int most = 0;
    greedy_spec_k(t, use_draft, 4, out, drafted, accepted, &most);
}

/* draft_max 40, the model as its own draft (every draft stands): a step verifies at most
 * kvq_model_exact_rows rows (the pending token and exact_rows - 1 drafts), and greedy output is
 * still plain decode's. */
static void test_draft_max_capped(void **state) {
    (void)state;
    if (!g_m) skip();
    const int exact = kvq_model_exact_rows(g_m);
    int32_t ref[N_GEN], got[N_GEN];
    uint64_t dr = 0, ac = 0;
    int most = 0;
    assert_true(exact >= 2 && exact < N_GEN); /* else the cap would not show within N_GEN tokens */
    greedy_plain(KVQ_CACHE_F16, ref);
    greedy_spec_k(KVQ_CACHE_F16, 1, 40, got, &dr, &ac, &most);
    print_message("exact rows %d: a step drafted %d at most (drafted %llu, accepted %llu)\n", exact, most,
                  (unsigned long long)dr, (unsigned long long)ac);
    assert_int_equal(most, exact - 1);
    for (int i = 0; i < N_GEN; i++)
        if (ref[i] != got[i]) fail_msg("token %d is %d, plain decode %d", i, got[i], ref[i]);
}

static void test_greedy_identity(void **state) {
    (void)state;
    if (!g_m) skip();
    const kvq_cache_type types[] = {KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};
    for (int ti = 0; ti < 3; ti++)
        for (int use_draft = 0; use_draft < 2; use_draft++) {
            int32_t ref[N_GEN], got[N_GEN];
            uint64_t dr = 0, ac = 0;
            greedy_plain(types[ti], ref);
            greedy_spec(types[ti], use_draft, got, &dr, &ac);
            print_message("cache=%s draft=%s drafted=%llu accepted=%llu\n", kvq_cache_type_name(types[ti]),
                          use_draft ? "self" : "lookup", (unsigned long long)dr, (unsigned long long)ac);
            for (int i = 0; i < N_GEN; i++)
                if (ref[i] != got[i]) fail_msg("cache %s, %s: token %d is %d, plain decode %d", kvq_cache_type_name(types[ti]),
                                               use_draft ? "draft" : "lookup", i, got[i], ref[i]);
            assert_true(dr > 0);
            if (use_draft) assert_true(ac > 0); /* itself as draft: most drafts stand */
        }
}

/* kvq_spec_sync as a conversation uses it: the caller evaluates the prompt, keeps 5 of the
 * first 12 generated tokens, adds a "turn" of its own and goes on; same tokens as plain decode. */
static void sync_run(int spec, int use_draft, int32_t *out) {
    int32_t ids[160], turn[3] = {464, 4272, 338}, *got = ids;
    int n = prompt(ids), half = N_GEN / 2;
    kvq_context *c = new_ctx(KVQ_CACHE_Q4), *d = use_draft ? new_ctx(KVQ_CACHE_Q4) : NULL;
    kvq_spec_params p = kvq_spec_default_params();
    p.draft = d, p.lookup_n = 2, p.draft_max = 3;
    kvq_spec *s = NULL;
    if (spec && kvq_spec_new(c, &p, &s) != KVQ_OK) fail_msg("spec: %s", kvq_last_error());
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 0;
    kvq_sampler *smp = kvq_sampler_new(&sp);
    assert_int_equal(kvq_eval(c, ids, n), KVQ_OK);
    for (int part = 0; part < 2; part++) {
        if (s) assert_int_equal(kvq_spec_sync(s, ids, kvq_n_past(c)), KVQ_OK);
        for (int k = 0; k < half;) {
            int32_t buf[8];
            int r = s ? kvq_spec_step(s, smp, buf, half - k < 8 ? half - k : 8) : 1;
            if (!s) buf[0] = kvq_sample(smp, kvq_logits(c), kvq_model_n_vocab(g_m));
            if (!s) assert_int_equal(kvq_eval(c, buf, 1), KVQ_OK);
            if (r <= 0) fail_msg("step: %s", kvq_last_error());
            memcpy(out + part * half + k, buf, sizeof *buf * (size_t)r);
            k += r;
        }
        if (part) break;
        memcpy(got + n, out, sizeof *out * 5);
        memcpy(got + n + 5, turn, sizeof turn);
        assert_int_equal(kvq_kv_truncate(c, n + 5), KVQ_OK);
        assert_int_equal(kvq_eval(c, turn, 3), KVQ_OK);
        n += 8;
    }
    if (s && use_draft) { /* itself as draft always drafts (lookup may find no repeat here) */
        uint64_t dr = 0;
        kvq_spec_stats(s, &dr, NULL);
        assert_true(dr > 0);
    }
    kvq_spec_free(s);
    kvq_sampler_free(smp);
    kvq_context_free(c);
    kvq_context_free(d);
}

static void test_sync(void **state) {
    (void)state;
    if (!g_m) skip();
    int32_t ref[N_GEN], got[N_GEN];
    sync_run(0, 0, ref);
    for (int use_draft = 0; use_draft < 2; use_draft++) {
        sync_run(1, use_draft, got);
        for (int i = 0; i < N_GEN; i++)
            if (ref[i] != got[i]) fail_msg("sync, %s: token %d is %d, plain decode %d", use_draft ? "draft" : "lookup", i, got[i], ref[i]);
    }
    /* the cache must hold what it is told */
    kvq_context *c = new_ctx(KVQ_CACHE_F16);
    kvq_spec *s = NULL;
    kvq_spec_params p = kvq_spec_default_params();
    assert_int_equal(kvq_spec_new(c, &p, &s), KVQ_OK);
    assert_int_equal(kvq_spec_sync(s, ref, 4), KVQ_ERR_ARG);
    kvq_spec_free(s);
    kvq_context_free(c);
}

/* Draws from q, verified against p, must be distributed as p (chi-square, 5 cells). */
static void test_verify_rule(void **state) {
    (void)state;
    const float p[5] = {0.4f, 0.25f, 0.2f, 0.1f, 0.05f}, q[5] = {0.1f, 0.1f, 0.5f, 0.05f, 0.25f};
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.seed = 7;
    kvq_sampler *s = kvq_sampler_new(&sp);
    const int N = 200000;
    long cnt[5] = {0}, cnt_pm[5] = {0};
    for (int i = 0; i < N; i++) {
        int acc;
        int32_t x = kvq_sampler_draw(s, q, 5);
        cnt[kvq_sampler_verify(s, p, q, 5, x, &acc)]++;
        cnt_pm[kvq_sampler_verify(s, p, NULL, 5, 2, &acc)]++; /* a lookup's point mass on token 2 */
    }
    double chi = 0, chi_pm = 0;
    for (int i = 0; i < 5; i++) {
        double e = p[i] * N;
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
        chi_pm += (cnt_pm[i] - e) * (cnt_pm[i] - e) / e;
    }
    print_message("chi2 draft=%.2f point-mass=%.2f (4 dof, 99.9%%: 18.47)\n", chi, chi_pm);
    assert_true(chi < 18.47);
    assert_true(chi_pm < 18.47);
    /* the rule with q as the target must fail the same bound: the test can tell */
    long bad[5] = {0};
    for (int i = 0; i < N; i++) bad[kvq_sampler_draw(s, q, 5)]++;
    double chi_bad = 0;
    for (int i = 0; i < 5; i++) chi_bad += (bad[i] - p[i] * N) * (bad[i] - p[i] * N) / (p[i] * N);
    assert_true(chi_bad > 18.47);
    kvq_sampler_free(s);
}

static void test_vocab_mismatch(void **state) {
    (void)state;
    if (!g_m) skip();
    const char *dir = tu_fixture("models/llama3-tiny-aqlm-1x16g16");
    TU_NEED_FIXTURE(dir);
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    kvq_model *o = NULL;
    if (kvq_model_load(dir, &mp, &o) != KVQ_OK) fail_msg("load: %s", kvq_last_error());
    assert_int_equal(kvq_vocab_check(g_m, o), KVQ_ERR_ARG);
    print_message("%s\n", kvq_last_error());
    assert_non_null(strstr(kvq_last_error(), "vocabulary"));
    assert_int_equal(kvq_vocab_check(g_m, g_m), KVQ_OK);
    kvq_model_free(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_rule),
        cmocka_unit_test(test_greedy_identity),
        cmocka_unit_test(test_draft_max_capped),
        cmocka_unit_test(test_sync),
        cmocka_unit_test(test_vocab_mismatch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
