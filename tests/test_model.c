/* End to end against the fp32 PyTorch references in ../shared/fixtures/models:
 * last-position logits, greedy continuation, f16 cache, batch == token-by-token.
 * KVQ_TEST_BACKEND=vulkan (ctest's test_model_vulkan) runs the same on that backend
 * with its own logits bound; it skips when the backend does not start here. The two
 * batching checks (batch == token-by-token, batched contexts == alone) load the model
 * exact: on Vulkan, decode otherwise looks 8-bit AQLM codes up in fp16 tables, whose
 * rounding (~2e-4 of the logits, within the 5e-3 bound) the prompt path does not share. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_matmul.h"
#include "kvq.h"
#include "testutil.h"

static const char *g_backend;  /* NULL: automatic choice */
static double g_tol_f32 = 1e-3, g_tol_f16 = 3e-3;

typedef struct {
    const char *name;
    kvq_model *m;
    int32_t prompt[256];
    int n_prompt;
    int32_t greedy[64];
    int n_greedy;
    float *ref_logits;
    int n_vocab;
} fixture;

static void load_ids(const cJSON *arr, int32_t *out, int *n, int cap) {
    assert_true(cJSON_IsArray(arr));
    *n = 0;
    for (const cJSON *e = arr->child; e && *n < cap; e = e->next) out[(*n)++] = (int32_t)e->valuedouble;
}

static int setup(void **state, const char *name, int exact) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    const char *dir = tu_fixture(rel);
    if (!dir) {
        *state = NULL;
        return 0;
    }
    fixture *f = calloc(1, sizeof *f);
    f->name = name;
    char path[4200], dirc[4096];
    snprintf(dirc, sizeof dirc, "%s", dir);
    snprintf(path, sizeof path, "%s/reference.json", dirc);
    char *text = tu_read_file(path, NULL);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    load_ids(cJSON_GetObjectItem(ref, "prompt_ids"), f->prompt, &f->n_prompt, 256);
    load_ids(cJSON_GetObjectItem(ref, "greedy_ids"), f->greedy, &f->n_greedy, 64);
    cJSON_Delete(ref);
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    mp.n_gpu_layers = tu_env_gpu_layers();
    mp.exact = exact;
    mp.aqlm_i8 = 0; /* the fp16 codebooks: 1x16's default int8 codewords are test_i8's */
    if (kvq_model_load(dirc, &mp, &f->m) != KVQ_OK) fail_msg("load %s: %s", dirc, kvq_last_error());
    f->n_vocab = kvq_model_n_vocab(f->m);
    size_t len;
    snprintf(path, sizeof path, "%s/reference-logits.f32", dirc);
    f->ref_logits = (float *)tu_read_file(path, &len);
    assert_int_equal(len, sizeof(float) * (size_t)f->n_vocab);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    kvq_model_free(f->m);
    free(f->ref_logits);
    free(f);
    return 0;
}

#define FIXTURE_SETUP(id, dir)                                          \
    static int setup_##id(void **s) { return setup(s, dir, 0); }        \
    static int setup_exact_##id(void **s) { return setup(s, dir, 1); }
FIXTURE_SETUP(fp16, "brown-llama-fp16")
FIXTURE_SETUP(a2x8, "brown-llama-aqlm-2x8")
FIXTURE_SETUP(a1x16, "brown-llama-aqlm-1x16")
FIXTURE_SETUP(llama3, "llama3-tiny-aqlm-1x16g16")
FIXTURE_SETUP(mistral, "mistral-tiny-aqlm-2x8")

static kvq_context *new_ctx(kvq_model *m, kvq_cache_type t, int n_batch) {
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = 256;
    p.type_k = p.type_v = t;
    p.n_batch = n_batch;
    kvq_context *c;
    if (kvq_context_new(m, &p, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

static void check_logits(const fixture *f, const float *got, double tol, const char *what) {
    double err = tu_rel_l2(got, f->ref_logits, (size_t)f->n_vocab);
    int a[3], b[3];
    tu_top3(got, f->n_vocab, a);
    tu_top3(f->ref_logits, f->n_vocab, b);
    print_message("%s %s: rel L2 %.2e, top3 %d %d %d (ref %d %d %d)\n", f->name, what, err, a[0], a[1], a[2], b[0], b[1], b[2]);
    if (err > tol) fail_msg("%s %s: rel L2 %.3e > %.1e", f->name, what, err, tol);
    for (int k = 0; k < 3; k++)
        if (a[k] != b[k]) fail_msg("%s %s: top-3 differs at %d", f->name, what, k);
}

static void test_logits_f32(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    kvq_context *c = new_ctx(f->m, KVQ_CACHE_F32, 512);
    assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
    check_logits(f, kvq_logits(c), g_tol_f32, "f32 cache");
    kvq_context_free(c);
}

static void test_logits_f16(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    kvq_context *c = new_ctx(f->m, KVQ_CACHE_F16, 512);
    assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
    check_logits(f, kvq_logits(c), g_tol_f16, "f16 cache");
    kvq_context_free(c);
}

static void test_greedy(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    kvq_context *c = new_ctx(f->m, KVQ_CACHE_F32, 512);
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 0;
    kvq_sampler *s = kvq_sampler_new(&sp);
    assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
    for (int i = 0; i < f->n_greedy; i++) {
        int32_t id = kvq_sample(s, kvq_logits(c), f->n_vocab);
        if (id != f->greedy[i]) fail_msg("%s: greedy token %d is %d, reference %d", f->name, i, id, f->greedy[i]);
        assert_int_equal(kvq_eval(c, &id, 1), KVQ_OK);
    }
    kvq_sampler_free(s);
    kvq_context_free(c);
}

/* Prompt fed one token at a time (and in odd-sized batches) gives the batch logits. */
static void test_batch_vs_single(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    kvq_context *whole = new_ctx(f->m, KVQ_CACHE_F32, 512);
    kvq_context *one = new_ctx(f->m, KVQ_CACHE_F32, 1);
    kvq_context *three = new_ctx(f->m, KVQ_CACHE_F32, 3);
    assert_int_equal(kvq_eval(whole, f->prompt, f->n_prompt), KVQ_OK);
    for (int i = 0; i < f->n_prompt; i++) assert_int_equal(kvq_eval(one, f->prompt + i, 1), KVQ_OK);
    assert_int_equal(kvq_eval(three, f->prompt, f->n_prompt), KVQ_OK);
    assert_int_equal(kvq_n_past(one), f->n_prompt);
    double e1 = tu_rel_l2(kvq_logits(one), kvq_logits(whole), (size_t)f->n_vocab);
    double e3 = tu_rel_l2(kvq_logits(three), kvq_logits(whole), (size_t)f->n_vocab);
    print_message("%s: token-by-token vs batch rel %.2e, batches of 3 %.2e\n", f->name, e1, e3);
    assert_true(e1 <= 1e-4);
    assert_true(e3 <= 1e-4);
    kvq_context_free(whole);
    kvq_context_free(one);
    kvq_context_free(three);
}

/* kvq_eval_batch: three contexts at different depths (one still taking prompt tokens) stepped
 * together give each context the logits it gets alone, step after step. */
static void test_eval_batch(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    enum { N = 3, STEPS = 4 };
    kvq_context *alone[N], *batch[N];
    const int start[N] = {f->n_prompt, 3, 7};
    for (int i = 0; i < N; i++) {
        alone[i] = new_ctx(f->m, KVQ_CACHE_F32, 8);
        batch[i] = new_ctx(f->m, KVQ_CACHE_F32, 8);
        assert_int_equal(kvq_eval(alone[i], f->prompt, start[i]), KVQ_OK);
        assert_int_equal(kvq_eval(batch[i], f->prompt, start[i]), KVQ_OK);
    }
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        const int32_t *ids[N];
        int n[N];
        int32_t next[N];
        for (int i = 0; i < N; i++) {
            /* context 1 takes two prompt tokens per step, the others one greedy token */
            n[i] = i == 1 ? 2 : 1;
            next[i] = f->greedy[step];
            ids[i] = i == 1 ? f->prompt + kvq_n_past(alone[i]) : &next[i];
            assert_int_equal(kvq_eval(alone[i], ids[i], n[i]), KVQ_OK);
        }
        assert_int_equal(kvq_eval_batch(batch, ids, n, N), KVQ_OK);
        for (int i = 0; i < N; i++) {
            assert_int_equal(kvq_n_past(batch[i]), kvq_n_past(alone[i]));
            double e = tu_rel_l2(kvq_logits(batch[i]), kvq_logits(alone[i]), (size_t)f->n_vocab);
            worst = e > worst ? e : worst;
        }
    }
    print_message("%s: batched contexts vs alone, worst rel %.2e\n", f->name, worst);
    assert_true(worst <= 1e-4);
    /* refused: a context twice, and contexts of different sizes fall back but still agree */
    kvq_context *twice[2] = {batch[0], batch[0]};
    const int32_t *ids2[2] = {f->greedy, f->greedy};
    int n2[2] = {1, 1};
    assert_int_equal(kvq_eval_batch(twice, ids2, n2, 2), KVQ_ERR_ARG);
    for (int i = 0; i < N; i++) kvq_context_free(alone[i]), kvq_context_free(batch[i]);
}

/* -ngl on a 4-layer model with a Vulkan device: 0 (the CPU alone), 1, 2 (split: the first
 * layers on the CPU, the rest and the LM head on Vulkan, the residual crossing once) and all,
 * each with the plan it reports, against the reference logits; the q4 cache too. */
static void test_offload_splits(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    if (!tu_backend_starts("vulkan")) skip(); /* offload needs a GPU backend */
    const char *dir = tu_fixture("models/brown-llama-aqlm-2x8");
    const int ngl[] = {0, 1, 2, -1};
    for (int i = 0; i < 4; i++) {
        kvq_model_params mp = kvq_model_default_params();
        mp.backend = "vulkan";
        mp.n_gpu_layers = ngl[i];
        kvq_model *m;
        if (kvq_model_load(dir, &mp, &m) != KVQ_OK) fail_msg("load -ngl %d: %s", ngl[i], kvq_last_error());
        int want = ngl[i] < 0 ? 4 : ngl[i];
        char needle[64];
        snprintf(needle, sizeof needle, "gpu_layers=%d/4 ", want);
        print_message("-ngl %d: %s\n", ngl[i], kvq_model_plan(m));
        assert_int_equal(kvq_model_gpu_layers(m), want);
        assert_non_null(strstr(kvq_model_plan(m), needle));
        kvq_context *c = new_ctx(m, KVQ_CACHE_F32, 512);
        assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
        check_logits(f, kvq_logits(c), 5e-3, "offload f32 cache");
        kvq_context_free(c);
        c = new_ctx(m, KVQ_CACHE_Q4, 512);
        assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
        double e = tu_rel_l2(kvq_logits(c), f->ref_logits, (size_t)f->n_vocab);
        print_message("-ngl %d q4 cache: rel L2 %.2e\n", ngl[i], e);
        assert_true(e < 0.1);
        kvq_context_free(c);
        kvq_model_free(m);
    }
}

/* -ngl auto with the device's free memory forced (KVQ_VK_BUDGET): more memory never means fewer
 * GPU layers, the weights placed on the GPU stay inside the budget, nothing fails for lack of
 * device memory (0 runs on the CPU alone), and every plan gives the reference logits. */
static void test_offload_auto(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    if (!tu_backend_starts("vulkan")) skip(); /* offload needs a GPU backend */
    const char *dir = tu_fixture("models/brown-llama-aqlm-2x8");
    const int mib[] = {0, 20, 21, 22, 23, 24, 25, 28, 40, 64};
    int prev = -1, seen_split = 0;
    for (size_t i = 0; i < sizeof mib / sizeof *mib; i++) {
        char v[32];
        snprintf(v, sizeof v, "%d", mib[i] << 20);
        setenv("KVQ_VK_BUDGET", v, 1);
        kvq_model_params mp = kvq_model_default_params();
        mp.backend = "vulkan";
        mp.n_gpu_layers = KVQ_GPU_LAYERS_AUTO;
        mp.plan_ctx = 256;
        kvq_model *m;
        if (kvq_model_load(dir, &mp, &m) != KVQ_OK) fail_msg("load with a %d MiB device: %s", mib[i], kvq_last_error());
        int n = kvq_model_gpu_layers(m);
        const char *plan = kvq_model_plan(m), *g = strstr(plan, "gpu_mib=");
        double gpu_mib = g ? atof(g + 8) : -1;
        print_message("%d MiB free: %s\n", mib[i], plan);
        if (n < prev) fail_msg("%d MiB gave %d GPU layers, less memory gave %d", mib[i], n, prev);
        if (!(gpu_mib >= 0 && gpu_mib <= mib[i])) fail_msg("%d MiB: %s", mib[i], plan);
        seen_split |= n > 0 && n < 4; /* the budgets step through the partial fits */
        prev = n;
        kvq_context *c = new_ctx(m, KVQ_CACHE_F32, 256);
        assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
        check_logits(f, kvq_logits(c), 5e-3, "auto offload");
        kvq_context_free(c);
        kvq_model_free(m);
    }
    unsetenv("KVQ_VK_BUDGET");
    assert_int_equal(prev, 4);
    assert_true(seen_split);
}

static void test_context_limits(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = 4;
    kvq_context *c;
    assert_int_equal(kvq_context_new(f->m, &p, &c), KVQ_OK);
    assert_int_equal(kvq_eval(c, f->prompt, 4), KVQ_OK);
    assert_int_equal(kvq_eval(c, f->prompt, 1), KVQ_ERR_ARG);
    assert_non_null(strstr(kvq_last_error(), "context full"));
    assert_int_equal(kvq_kv_truncate(c, 1), KVQ_OK);
    int32_t bad = f->n_vocab;
    assert_int_equal(kvq_eval(c, &bad, 1), KVQ_ERR_ARG);
    kvq_context_free(c);
}

/* An opt-in lossy CPU mode (int8 codebooks or int8 tables): the model
 * loaded with it says so (`tag` in the backend name), its logits move (the
 * mode is in use) but stay within `tol` of the fp32 reference with the same
 * top token; decode (token by token) agrees with the batch within `tol_one`. */
static void check_lossy_mode(fixture *f, const char *dir, const kvq_model_params *mp, const char *tag, double tol,
                             double tol_one) {
    kvq_model *m;
    if (kvq_model_load(dir, mp, &m) != KVQ_OK) fail_msg("load %s: %s", dir, kvq_last_error());
    assert_non_null(strstr(kvq_model_backend_name(m), tag));
    kvq_context *c8 = new_ctx(m, KVQ_CACHE_F32, 512), *c = new_ctx(f->m, KVQ_CACHE_F32, 512);
    kvq_context *one = new_ctx(m, KVQ_CACHE_F32, 1);
    assert_int_equal(kvq_eval(c8, f->prompt, f->n_prompt), KVQ_OK);
    assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
    for (int i = 0; i < f->n_prompt; i++) assert_int_equal(kvq_eval(one, f->prompt + i, 1), KVQ_OK);
    const float *l8 = kvq_logits(c8);
    double moved = tu_rel_l2(l8, kvq_logits(c), (size_t)f->n_vocab), err = tu_rel_l2(l8, f->ref_logits, (size_t)f->n_vocab);
    double e1 = tu_rel_l2(kvq_logits(one), l8, (size_t)f->n_vocab);
    int a[3], b[3];
    tu_top3(l8, f->n_vocab, a);
    tu_top3(f->ref_logits, f->n_vocab, b);
    print_message("%s %s: rel L2 %.2e to the reference, %.2e to the default, token-by-token %.2e\n", f->name, tag, err,
                  moved, e1);
    if (!(moved > 1e-5)) fail_msg("%s: %s changed nothing (%.3g)", f->name, tag, moved);
    if (!(err <= tol)) fail_msg("%s: %s rel L2 %.3e > %.0e", f->name, tag, err, tol);
    if (a[0] != b[0]) fail_msg("%s: %s change the top token", f->name, tag);
    if (!(e1 <= tol_one)) fail_msg("%s: %s token by token rel L2 %.3e > %.0e", f->name, tag, e1, tol_one);
    kvq_context_free(c8);
    kvq_context_free(c);
    kvq_context_free(one);
    kvq_model_free(m);
}

/* kvq_model_params.aqlm_cb8 on the 1x16 fixtures. */
#define KVQ_TEST_CB8_LOGITS 6e-2
static void test_cb8(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    if (g_backend && *g_backend && strcmp(g_backend, "cpu")) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    mp.aqlm_cb8 = 1;
    check_lossy_mode(f, tu_fixture(!strcmp(f->name, "brown-llama-aqlm-1x16") ? "models/brown-llama-aqlm-1x16"
                                                                             : "models/llama3-tiny-aqlm-1x16g16"),
                     &mp, "int8 AQLM codebooks", KVQ_TEST_CB8_LOGITS, 1e-4);
}

/* kvq_model_params.aqlm_lut8 on the 2x8 fixtures, where the CPU has the
 * int8-table kernels (AVX-512 VBMI). Prompt and decode scale their tables
 * differently (per token, per chunk of steps), so token by token is held
 * only to the bound itself. */
#define KVQ_TEST_LUT8_LOGITS 6e-2
static void test_lut8(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    if ((g_backend && *g_backend && strcmp(g_backend, "cpu")) || kvq_cpu_isa() != KVQ_ISA_AVX512 || !kvq_cpu_has_vbmi()) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    mp.aqlm_lut8 = 1;
    check_lossy_mode(f, tu_fixture(!strcmp(f->name, "brown-llama-aqlm-2x8") ? "models/brown-llama-aqlm-2x8"
                                                                            : "models/mistral-tiny-aqlm-2x8"),
                     &mp, "int8 AQLM tables", KVQ_TEST_LUT8_LOGITS, KVQ_TEST_LUT8_LOGITS);
}

/* kvq_model_params.aqlm_i8, the default, on the 1x16 fixtures (int8 codewords and
 * activations, integer dot products): logits near the reference, the same
 * top token, batched == token by token (each token is quantized on its
 * own), and on the language model (brown-llama) the reference's greedy
 * continuation. llama3-tiny's random weights leave top-1/top-2 gaps down to
 * 0.07 along its greedy path (greedy_min_margin) while int8 moves its
 * logits by ~2.5% rel L2: its continuation departs at token 1 (as it may
 * with --aqlm-cb8, 3.5%), so there the count that agrees is only printed. */
#define KVQ_TEST_I8_LOGITS 6e-2
static void test_i8(void **state) {
    fixture *f = *state;
    TU_NEED_FIXTURE(f);
    if (g_backend && *g_backend && strcmp(g_backend, "cpu")) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    assert_int_equal(mp.aqlm_i8, 1); /* auto: on where this CPU class decodes faster with it */
    mp.aqlm_i8 = 2;                  /* on here whatever the class, so every CI machine tests it */
    const char *dir = tu_fixture(!strcmp(f->name, "brown-llama-aqlm-1x16") ? "models/brown-llama-aqlm-1x16"
                                                                           : "models/llama3-tiny-aqlm-1x16g16");
    check_lossy_mode(f, dir, &mp, "1x16: int8 codewords", KVQ_TEST_I8_LOGITS, 1e-4);
    kvq_model *m;
    if (kvq_model_load(dir, &mp, &m) != KVQ_OK) fail_msg("load %s: %s", dir, kvq_last_error());
    kvq_context *c = new_ctx(m, KVQ_CACHE_F32, 512);
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 0;
    kvq_sampler *s = kvq_sampler_new(&sp);
    assert_int_equal(kvq_eval(c, f->prompt, f->n_prompt), KVQ_OK);
    int lm = !strcmp(f->name, "brown-llama-aqlm-1x16"), same = 0;
    for (int i = 0; i < f->n_greedy; i++) {
        int32_t id = kvq_sample(s, kvq_logits(c), f->n_vocab);
        if (id != f->greedy[i] && lm) fail_msg("%s i8: greedy token %d is %d, reference %d", f->name, i, id, f->greedy[i]);
        if (id != f->greedy[i]) break;
        same++;
        assert_int_equal(kvq_eval(c, &id, 1), KVQ_OK);
    }
    print_message("%s i8: %d of the reference's %d greedy tokens\n", f->name, same, f->n_greedy);
    kvq_sampler_free(s);
    kvq_context_free(c);
    kvq_model_free(m);
}

#define MODEL_TESTS(id)                                                          \
    cmocka_unit_test_setup_teardown(test_logits_f32, setup_##id, teardown),      \
        cmocka_unit_test_setup_teardown(test_logits_f16, setup_##id, teardown),  \
        cmocka_unit_test_setup_teardown(test_greedy, setup_##id, teardown),      \
        cmocka_unit_test_setup_teardown(test_batch_vs_single, setup_exact_##id, teardown), \
        cmocka_unit_test_setup_teardown(test_eval_batch, setup_exact_##id, teardown)

int main(void) {
    if (!tu_env_backend(&g_backend)) return 0;
    if (g_backend && strcmp(g_backend, "cpu")) g_tol_f32 = g_tol_f16 = 5e-3; /* a GPU's own bound (issue 8) */
    const struct CMUnitTest tests[] = {
        MODEL_TESTS(fp16), MODEL_TESTS(a2x8), MODEL_TESTS(a1x16), MODEL_TESTS(llama3), MODEL_TESTS(mistral),
        cmocka_unit_test_setup_teardown(test_context_limits, setup_a2x8, teardown),
        cmocka_unit_test_setup_teardown(test_offload_splits, setup_a2x8, teardown),
        cmocka_unit_test_setup_teardown(test_offload_auto, setup_a2x8, teardown),
        cmocka_unit_test_setup_teardown(test_cb8, setup_a1x16, teardown),
        cmocka_unit_test_setup_teardown(test_cb8, setup_llama3, teardown),
        cmocka_unit_test_setup_teardown(test_lut8, setup_a2x8, teardown),
        cmocka_unit_test_setup_teardown(test_lut8, setup_mistral, teardown),
        cmocka_unit_test_setup_teardown(test_i8, setup_a1x16, teardown),
        cmocka_unit_test_setup_teardown(test_i8, setup_llama3, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
