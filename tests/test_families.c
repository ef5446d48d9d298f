/* The five families of issue 19 end to end against the numpy references in
 * tests/data/models (written by tools/fixtures/gen_families.py): for each of two
 * prompts the last-position logits (f32 cache), the 24 greedy tokens, the prompt
 * fed token by token, and q8 / q4 caches. A family whose architecture this kvq
 * does not load (kvq_model_load: "unsupported architecture") is skipped with a
 * message and listed at the end; any other load failure fails.
 * KVQ_TEST_BACKEND=vulkan (ctest's test_families_vulkan) runs the same on that
 * backend with its own logits bound; it skips when the backend does not start. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_matmul.h"
#include "kvq.h"
#include "testutil.h"

static const char *g_backend; /* NULL: automatic choice */
static int g_gpu;             /* a GPU backend: its own logits bound (issue 8) */

/* Logits bounds (rel L2 to the reference, f32 cache): the 1e-3 on the CPU and
 * 5e-3 on a GPU. Gemma's CPU bound is tighter: HF rounds its embedding normalizer
 * sqrt(hidden_size) to bfloat16, which moves this fixture's logits by only 1.0-1.1e-3
 * (reference.json rel_diff_if.gemma_unrounded_normalizer_*), so 1e-3 could not see it. */
#define TOL_GPU 5e-3
/* Quantized caches (K and V of one type, kvq's default rotation): the logits stay within
 * these of the f32 reference, q8 with the same top token. gen_families.py simulates the
 * two formats (reference.json kv_cache_sim_rel_l2): q8 1.3e-3..8.8e-3, q4 1.9e-2..1.0e-1;
 * on mistral-tiny-aqlm-2x8 the simulation gave q8 3.7e-3, q4 6.1e-2 and kvq 3.7e-3..4.1e-3,
 * 5.2e-2..6.0e-2 (CPU and lavapipe). */
#define TOL_Q8 2e-2
#define TOL_Q4 2.5e-1

typedef struct {
    const char *id, *name;
    double tol_cpu;
} family;

static const family FAMILIES[] = {
    {"mixtral", "mixtral-tiny-aqlm-1x16", 1e-3}, {"command_r", "command-r-tiny-aqlm-1x16", 1e-3},
    {"gemma", "gemma-tiny-aqlm-2x8", 2e-4},      {"phi3", "phi3-tiny-aqlm-1x16g8", 1e-3},
    {"qwen2", "qwen2-tiny-aqlm-2x8", 1e-3},
};
#define N_FAMILIES (int)(sizeof FAMILIES / sizeof *FAMILIES)

typedef struct {
    int32_t ids[512];
    int n_ids;
    int32_t greedy[64];
    int n_greedy;
    float *logits;
} prompt;

typedef struct {
    const family *fam;
    kvq_model *m; /* NULL: skipped (unsupported architecture) */
    prompt p[2];
    int n_vocab;
    double tol;
} fixture;

static int g_skipped[N_FAMILIES];

/* tests/data/models/<name>, or $KVQ_TEST_FAMILIES_DIR/<name> (fixtures regenerated elsewhere). */
static const char *fixture_dir(const family *fm) {
    static char dir[4096];
    const char *base = getenv("KVQ_TEST_FAMILIES_DIR");
    if (base && *base) snprintf(dir, sizeof dir, "%s/%s", base, fm->name);
    else snprintf(dir, sizeof dir, "%s/tests/data/models/%s", KVQ_SOURCE_DIR, fm->name);
    return dir;
}

static void load_ids(const cJSON *ref, const char *key, int32_t *out, int *n, int cap) {
    const cJSON *arr = cJSON_GetObjectItem(ref, key);
    if (!cJSON_IsArray(arr)) fail_msg("reference.json: no %s", key);
    *n = 0;
    for (const cJSON *e = arr->child; e && *n < cap; e = e->next) out[(*n)++] = (int32_t)e->valuedouble;
}

static int setup(void **state, int which) {
    const family *fm = &FAMILIES[which];
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->fam = fm;
    f->tol = g_gpu ? TOL_GPU : fm->tol_cpu;
    *state = f;
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", fixture_dir(fm));
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    mp.n_gpu_layers = tu_env_gpu_layers();
    mp.exact = 1; /* the references' tolerances; the int8 prompt tiles: test_int8_prompts */
    kvq_status s = kvq_model_load(dir, &mp, &f->m);
    if (s == KVQ_ERR_UNSUPPORTED && strstr(kvq_last_error(), "unsupported architecture")) {
        print_message("%s: skipped, this kvq does not load it: %s\n", fm->name, kvq_last_error());
        f->m = NULL;
        g_skipped[which] = 1;
        return 0;
    }
    if (s != KVQ_OK) fail_msg("load %s: %s", dir, kvq_last_error());
    f->n_vocab = kvq_model_n_vocab(f->m);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *text = tu_read_file(path, NULL);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    assert_non_null(ref);
    load_ids(ref, "prompt_ids", f->p[0].ids, &f->p[0].n_ids, 512);
    load_ids(ref, "greedy_ids", f->p[0].greedy, &f->p[0].n_greedy, 64);
    load_ids(ref, "prompt2_ids", f->p[1].ids, &f->p[1].n_ids, 512);
    load_ids(ref, "greedy2_ids", f->p[1].greedy, &f->p[1].n_greedy, 64);
    cJSON_Delete(ref);
    for (int k = 0; k < 2; k++) {
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, k ? "reference2-logits.f32" : "reference-logits.f32");
        f->p[k].logits = (float *)tu_read_file(path, &len);
        assert_int_equal(len, sizeof(float) * (size_t)f->n_vocab);
    }
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    if (f->m) kvq_model_free(f->m);
    for (int k = 0; k < 2; k++) free(f->p[k].logits);
    free(f);
    return 0;
}

#define NEED_MODEL(f)                                                                       \
    do {                                                                                    \
        if (!(f)->m) {                                                                      \
            print_message("%s: architecture not supported by this kvq, skipping\n", (f)->fam->name); \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

/* A context just large enough for prompt k and its greedy tokens (Phi-3: short_factor for the
 * short prompt, long_factor for prompt2, whose 94 tokens pass 64 from its first call; a context
 * far larger than that: test_big_context). */
static kvq_context *new_ctx_for(const fixture *f, int k, kvq_cache_type t, int n_batch) {
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = f->p[k].n_ids + f->p[k].n_greedy + 1;
    p.type_k = p.type_v = t;
    p.n_batch = n_batch;
    kvq_context *c;
    if (kvq_context_new(f->m, &p, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

static const char *PROMPT_NAME[2] = {"prompt", "prompt2"};

static void test_logits_f32(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    for (int k = 0; k < 2; k++) {
        kvq_context *c = new_ctx_for(f, k, KVQ_CACHE_F32, 512);
        assert_int_equal(kvq_eval(c, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        const float *got = kvq_logits(c);
        double err = tu_rel_l2(got, f->p[k].logits, (size_t)f->n_vocab);
        int a[3], b[3];
        tu_top3(got, f->n_vocab, a);
        tu_top3(f->p[k].logits, f->n_vocab, b);
        print_message("%s %s (%d ids) f32 cache: rel L2 %.2e (bound %.2g), top3 %d %d %d (ref %d %d %d)\n", f->fam->name,
                      PROMPT_NAME[k], f->p[k].n_ids, err, f->tol, a[0], a[1], a[2], b[0], b[1], b[2]);
        if (!(err <= f->tol)) fail_msg("%s %s: rel L2 %.3e > %.2g", f->fam->name, PROMPT_NAME[k], err, f->tol);
        for (int j = 0; j < 3; j++)
            if (a[j] != b[j]) fail_msg("%s %s: top-3 differs at %d", f->fam->name, PROMPT_NAME[k], j);
        kvq_context_free(c);
    }
}

static void test_greedy(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 0;
    kvq_sampler *s = kvq_sampler_new(&sp);
    for (int k = 0; k < 2; k++) {
        kvq_context *c = new_ctx_for(f, k, KVQ_CACHE_F32, 512);
        assert_int_equal(kvq_eval(c, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        for (int i = 0; i < f->p[k].n_greedy; i++) {
            int32_t id = kvq_sample(s, kvq_logits(c), f->n_vocab);
            if (id != f->p[k].greedy[i])
                fail_msg("%s %s: greedy token %d is %d, reference %d", f->fam->name, PROMPT_NAME[k], i, id, f->p[k].greedy[i]);
            assert_int_equal(kvq_eval(c, &id, 1), KVQ_OK);
        }
        print_message("%s %s: %d greedy tokens equal\n", f->fam->name, PROMPT_NAME[k], f->p[k].n_greedy);
        kvq_context_free(c);
    }
    kvq_sampler_free(s);
}

/* The prompt fed one token at a time, and in batches of 3, gives the batch logits
 * (Phi-3's prompt2 crosses original_max_position_embeddings mid-prompt: fed one token at a
 * time, kvq evaluates its first 64 tokens again on long_factor at the crossing, as HF does). */
static void test_batch_vs_single(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    for (int k = 0; k < 2; k++) {
        kvq_context *whole = new_ctx_for(f, k, KVQ_CACHE_F32, 512);
        kvq_context *one = new_ctx_for(f, k, KVQ_CACHE_F32, 1);
        kvq_context *three = new_ctx_for(f, k, KVQ_CACHE_F32, 3);
        assert_int_equal(kvq_eval(whole, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        for (int i = 0; i < f->p[k].n_ids; i++) assert_int_equal(kvq_eval(one, f->p[k].ids + i, 1), KVQ_OK);
        assert_int_equal(kvq_eval(three, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        double e1 = tu_rel_l2(kvq_logits(one), kvq_logits(whole), (size_t)f->n_vocab);
        double e3 = tu_rel_l2(kvq_logits(three), kvq_logits(whole), (size_t)f->n_vocab);
        print_message("%s %s: token-by-token vs batch rel %.2e, batches of 3 %.2e\n", f->fam->name, PROMPT_NAME[k], e1, e3);
        if (!(e1 <= 1e-4 && e3 <= 1e-4)) fail_msg("%s %s: token by token %.3e, by 3 %.3e (> 1e-4)", f->fam->name, PROMPT_NAME[k], e1, e3);
        kvq_context_free(whole);
        kvq_context_free(one);
        kvq_context_free(three);
    }
}

/* Longrope (Phi-3) picks its table by the sequence length, as HF does, not by the context size.
 * A context much longer than original_max_position_embeddings (64 in the fixture): (1) the short
 * prompt still matches its short_factor reference and (2) prompt2 its long_factor one; (3) a
 * sequence that grows past 64 (one token at a time, then through kvq_eval_batch beside another
 * context) ends where a fresh evaluation of it does; (4) cut back below 64 it runs on
 * short_factor again. Other families: the same checks of context-size independence. */
#define BIG_CTX 512

static kvq_context *new_big_ctx(const fixture *f, int n_batch) {
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = BIG_CTX;
    p.type_k = p.type_v = KVQ_CACHE_F32;
    p.n_batch = n_batch;
    kvq_context *c;
    if (kvq_context_new(f->m, &p, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

/* got within the reference bound of prompt k's reference logits. */
static void expect_ref(const fixture *f, int k, const float *got, const char *what) {
    assert_non_null(got);
    double err = tu_rel_l2(got, f->p[k].logits, (size_t)f->n_vocab);
    print_message("%s %s, n_ctx %d, %s: rel L2 %.2e (bound %.2g)\n", f->fam->name, PROMPT_NAME[k], BIG_CTX, what, err, f->tol);
    if (!(err <= f->tol)) fail_msg("%s %s, %s: rel L2 %.3e > %.2g", f->fam->name, PROMPT_NAME[k], what, err, f->tol);
}

/* Two evaluations of the same tokens agree (the token-by-token bound of test_batch_vs_single). */
static void expect_same(const fixture *f, const float *got, const float *want, const char *what) {
    assert_non_null(got);
    double e = tu_rel_l2(got, want, (size_t)f->n_vocab);
    print_message("%s n_ctx %d, %s: rel %.2e\n", f->fam->name, BIG_CTX, what, e);
    if (!(e <= 1e-4)) fail_msg("%s, %s: rel %.3e (> 1e-4)", f->fam->name, what, e);
}

static void test_big_context(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const prompt *p0 = &f->p[0], *p2 = &f->p[1];
    assert_true(p0->n_ids < 64 && p2->n_ids > 64 && p2->n_ids < BIG_CTX);
    for (int k = 0; k < 2; k++) { /* (1), (2) */
        kvq_context *c = new_big_ctx(f, 512);
        assert_int_equal(kvq_eval(c, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        expect_ref(f, k, kvq_logits(c), "whole prompt");
        kvq_context_free(c);
    }
    /* (3) prompt2: 40 tokens at once, then one at a time past 64. The fixture's window (8) hides
     * old rows from late positions, so the step that crosses is compared to a fresh evaluation
     * of its 65 tokens, where the rows it sees were made just before. */
    kvq_context *one = new_big_ctx(f, 512), *whole = new_big_ctx(f, 512), *fresh = new_big_ctx(f, 512);
    assert_int_equal(kvq_eval(fresh, p2->ids, 65), KVQ_OK);
    assert_int_equal(kvq_eval(one, p2->ids, 40), KVQ_OK);
    for (int i = 40; i < p2->n_ids; i++) {
        assert_int_equal(kvq_eval(one, p2->ids + i, 1), KVQ_OK);
        if (i == 64) expect_same(f, kvq_logits(one), kvq_logits(fresh), "the step to 65 tokens vs all 65 at once");
    }
    assert_int_equal(kvq_eval(whole, p2->ids, p2->n_ids), KVQ_OK);
    expect_same(f, kvq_logits(one), kvq_logits(whole), "prompt2 one by one from 40 vs at once");
    expect_ref(f, 1, kvq_logits(one), "decoded past 64");
    /* the same step inside one kvq_eval_batch, beside a context that stays short */
    kvq_context *a = new_big_ctx(f, 512), *b = new_big_ctx(f, 512);
    assert_int_equal(kvq_eval(a, p2->ids, 64), KVQ_OK);
    assert_int_equal(kvq_eval(b, p0->ids, p0->n_ids - 1), KVQ_OK);
    kvq_context *const pair[2] = {a, b};
    const int32_t *const pids[2] = {p2->ids + 64, p0->ids + p0->n_ids - 1};
    const int pn[2] = {1, 1};
    assert_int_equal(kvq_eval_batch(pair, pids, pn, 2), KVQ_OK);
    expect_same(f, kvq_logits(a), kvq_logits(fresh), "kvq_eval_batch's step to 65 tokens vs all 65 at once");
    expect_ref(f, 0, kvq_logits(b), "batch step beside it");
    /* (4) prompt and 60 of prompt2's tokens at once (long from the first), cut back to 7 tokens:
     * prompt's rest runs on short_factor over rows made again with it */
    int32_t both[128];
    memcpy(both, p0->ids, sizeof(int32_t) * (size_t)p0->n_ids);
    memcpy(both + p0->n_ids, p2->ids, sizeof(int32_t) * 60);
    kvq_context *back = new_big_ctx(f, 512);
    assert_int_equal(kvq_eval(back, both, p0->n_ids + 60), KVQ_OK);
    assert_int_equal(kvq_kv_truncate(back, 7), KVQ_OK);
    assert_int_equal(kvq_eval(back, p0->ids + 7, p0->n_ids - 7), KVQ_OK);
    expect_ref(f, 0, kvq_logits(back), "after a cut back to 7");
    kvq_context_free(one), kvq_context_free(whole), kvq_context_free(fresh), kvq_context_free(a), kvq_context_free(b), kvq_context_free(back);
}

/* q8 and q4 caches: the logits move (the cache type is in use) but stay near the reference. */
static void test_kv_quantized(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const struct {
        kvq_cache_type t;
        double tol;
        int same_top;
    } types[] = {{KVQ_CACHE_Q8, TOL_Q8, 1}, {KVQ_CACHE_Q4, TOL_Q4, 0}};
    for (int k = 0; k < 2; k++) {
        kvq_context *c32 = new_ctx_for(f, k, KVQ_CACHE_F32, 512);
        assert_int_equal(kvq_eval(c32, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        for (int t = 0; t < 2; t++) {
            kvq_context *c = new_ctx_for(f, k, types[t].t, 512);
            assert_int_equal(kvq_eval(c, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
            const float *got = kvq_logits(c);
            double err = tu_rel_l2(got, f->p[k].logits, (size_t)f->n_vocab);
            double moved = tu_rel_l2(got, kvq_logits(c32), (size_t)f->n_vocab);
            int a[3], b[3];
            tu_top3(got, f->n_vocab, a);
            tu_top3(f->p[k].logits, f->n_vocab, b);
            print_message("%s %s %s cache: rel L2 %.2e to the reference (bound %.2g), %.2e to the f32 cache, top1 %d (ref %d)\n",
                          f->fam->name, PROMPT_NAME[k], kvq_cache_type_name(types[t].t), err, types[t].tol, moved, a[0], b[0]);
            if (!(moved > 1e-7)) fail_msg("%s %s: the %s cache changed nothing", f->fam->name, PROMPT_NAME[k], kvq_cache_type_name(types[t].t));
            if (!(err <= types[t].tol))
                fail_msg("%s %s %s cache: rel L2 %.3e > %.2g", f->fam->name, PROMPT_NAME[k], kvq_cache_type_name(types[t].t), err, types[t].tol);
            if (types[t].same_top && a[0] != b[0])
                fail_msg("%s %s %s cache: top token %d, reference %d", f->fam->name, PROMPT_NAME[k], kvq_cache_type_name(types[t].t), a[0], b[0]);
            kvq_context_free(c);
        }
        kvq_context_free(c32);
    }
}

/* The default (not exact) CPU prompt path, int8 tiles from KVQ_I8T_MIN_N tokens on: each
 * prompt's last logits within TOL_I8T of the reference, same top token, and really
 * different from the exact path where the prompt is long enough to take the tiles. */
#define TOL_I8T 5e-2
static void test_int8_prompts(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    if (g_gpu) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    kvq_model *m;
    if (kvq_model_load(fixture_dir(f->fam), &mp, &m) != KVQ_OK) fail_msg("load: %s", kvq_last_error());
    for (int k = 0; k < 2; k++) {
        kvq_context_params p = kvq_context_default_params();
        p.n_ctx = f->p[k].n_ids + 1;
        p.type_k = p.type_v = KVQ_CACHE_F32;
        kvq_context *c, *cx = new_ctx_for(f, k, KVQ_CACHE_F32, 512);
        if (kvq_context_new(m, &p, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
        assert_int_equal(kvq_eval(c, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        assert_int_equal(kvq_eval(cx, f->p[k].ids, f->p[k].n_ids), KVQ_OK);
        const float *got = kvq_logits(c);
        double err = tu_rel_l2(got, f->p[k].logits, (size_t)f->n_vocab);
        double moved = tu_rel_l2(got, kvq_logits(cx), (size_t)f->n_vocab);
        int a[3], b[3];
        tu_top3(got, f->n_vocab, a);
        tu_top3(f->p[k].logits, f->n_vocab, b);
        print_message("%s %s (%d ids) int8 prompt tiles: rel L2 %.2e to the reference (bound %.0e), %.2e to exact\n",
                      f->fam->name, PROMPT_NAME[k], f->p[k].n_ids, err, TOL_I8T, moved);
        if (!(err <= TOL_I8T)) fail_msg("%s %s: rel L2 %.3e > %.0e", f->fam->name, PROMPT_NAME[k], err, TOL_I8T);
        if (a[0] != b[0]) fail_msg("%s %s: top token %d, reference %d", f->fam->name, PROMPT_NAME[k], a[0], b[0]);
        /* the Mixtral fixture keeps attention in fp16 and its experts see fewer than 32 tokens each */
        if (f->p[k].n_ids >= 40 && !strstr(f->fam->name, "mixtral") && !(moved > 1e-6)) fail_msg("%s %s: the int8 tiles changed nothing", f->fam->name, PROMPT_NAME[k]);
        kvq_context_free(c);
        kvq_context_free(cx);
    }
    kvq_model_free(m);
}

#define FIXTURE_SETUP(i, id) \
    static int setup_##id(void **s) { return setup(s, i); }
FIXTURE_SETUP(0, mixtral)
FIXTURE_SETUP(1, command_r)
FIXTURE_SETUP(2, gemma)
FIXTURE_SETUP(3, phi3)
FIXTURE_SETUP(4, qwen2)

#define FAMILY_TESTS(id)                                                            \
    cmocka_unit_test_setup_teardown(test_logits_f32, setup_##id, teardown),         \
        cmocka_unit_test_setup_teardown(test_greedy, setup_##id, teardown),         \
        cmocka_unit_test_setup_teardown(test_batch_vs_single, setup_##id, teardown), \
        cmocka_unit_test_setup_teardown(test_big_context, setup_##id, teardown),   \
        cmocka_unit_test_setup_teardown(test_kv_quantized, setup_##id, teardown), \
        cmocka_unit_test_setup_teardown(test_int8_prompts, setup_##id, teardown)

int main(void) {
    if (!tu_env_backend(&g_backend)) return 0;
    /* Batches here (and the CPU layers of an offload) stay off AMX tiles: their bf16 hi/lo split
     * is within KVQ_AMX_REL_L2 per matmul (test_matmul), and through qwen2-tiny's layers that
     * grew past the 1e-4 these batch-vs-one-token checks allow (1.17e-4 on a Sapphire Rapids). */
    kvq_cpu_set_amx(0);
    g_gpu = g_backend && strcmp(g_backend, "cpu") != 0;
    const struct CMUnitTest tests[] = {
        FAMILY_TESTS(mixtral), FAMILY_TESTS(command_r), FAMILY_TESTS(gemma), FAMILY_TESTS(phi3), FAMILY_TESTS(qwen2),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    int n = 0;
    for (int i = 0; i < N_FAMILIES; i++) n += g_skipped[i];
    if (n) {
        printf("[  SKIPPED ] families this kvq does not load (unsupported architecture):");
        for (int i = 0; i < N_FAMILIES; i++)
            if (g_skipped[i]) printf(" %s", FAMILIES[i].name);
        printf("\n");
    }
    return rc;
}
