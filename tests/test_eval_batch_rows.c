/* kvq_eval_batch with a context whose logits_all was turned on (kvq_logits_all_set), as
 * kvq-server verifies several slots' drafts in one step: that context gets every row, each
 * bit for bit what the same tokens evaluated one at a time give (batch invariance, what keeps
 * speculative decoding's greedy output plain decode's), beside a context getting its last row
 * only; turned off again, one row. f32, f16, q8 and q4 caches, on the demo model; the CPU, or
 * KVQ_TEST_BACKEND / KVQ_TEST_NGL (Vulkan, offload). The batch has kvq_model_exact_rows rows, the
 * most the model's backends promise exact (16 on both now). */
#include <stdio.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

static kvq_model *g_m;
static const char *g_backend;

static int setup(void **state) {
    (void)state;
    if (!tu_env_backend(&g_backend)) return 0;
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend ? g_backend : "cpu";
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
    cp.n_ctx = 128;
    cp.n_batch = 32;
    cp.type_k = cp.type_v = t;
    kvq_context *c = NULL;
    if (kvq_context_new(g_m, &cp, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

/* Rows whose logits differ from the reference's in any bit. */
static int rows_differ(const float *a, const float *b, int nv) { return memcmp(a, b, sizeof *a * (size_t)nv) != 0; }

/* Tokens the all-rows context evaluates in the batch (its first exact_rows - 3). */
static const int32_t g_rows[] = {14,  29871, 450, 278,  4272, 310, 13,   432, 2462, 1497, 393,
                                 278, 4272,  310, 450,  432,  13,  2462, 1497, 393, 278,  4272,
                                 14,  29871, 450, 278,  4272, 310, 13,   432, 2462, 1497, 393};
enum { MAX_ROWS = (int)(sizeof g_rows / sizeof *g_rows) };

static void rows_match(kvq_cache_type t, const char *name) {
    if (!g_m) skip();
    /* 3 + n_rows rows in the batch: exact_rows, the most the backends keep exact (the CPU's
     * per-token kernels, dense ones included since f22ac30: a batch of 11 rows differed in the
     * last bits before; Vulkan's matmuls in pieces of 4 tokens, the other context's 3 rows
     * sharing a piece with this one's) */
    const int n_rows = kvq_model_exact_rows(g_m) - 3;
    assert_in_range(n_rows, 1, MAX_ROWS);
    const int32_t prompt[] = {1, 450, 432, 2462, 1497, 393, 278, 4272, 310};
    const int np = (int)(sizeof prompt / sizeof *prompt);
    const int32_t *rows = g_rows;
    const int nv = kvq_model_n_vocab(g_m);
    kvq_context *a = new_ctx(t), *b = new_ctx(t), *ref_a = new_ctx(t), *ref_b = new_ctx(t);
    assert_int_equal(kvq_eval(a, prompt, np), KVQ_OK);
    assert_int_equal(kvq_eval(ref_a, prompt, np), KVQ_OK);
    assert_int_equal(kvq_eval(b, prompt, 4), KVQ_OK);
    assert_int_equal(kvq_eval(ref_b, prompt, 4), KVQ_OK);

    assert_int_equal(kvq_logits_all_set(a, 1), KVQ_OK);
    kvq_context *ctx[2] = {b, a}; /* the all-rows context second: its rows follow b's last */
    const int32_t *ids[2] = {prompt + 4, rows};
    const int n[2] = {3, n_rows};
    assert_int_equal(kvq_eval_batch(ctx, ids, n, 2), KVQ_OK);
    assert_int_equal(kvq_n_past(a), np + n_rows);
    assert_int_equal(kvq_n_past(b), 7);
    assert_null(kvq_logits_row(a, n_rows));
    assert_null(kvq_logits_row(b, 1));
    double worst = 0;
    int differ = 0;
    for (int i = 0; i < n_rows; i++) {
        assert_int_equal(kvq_eval(ref_a, rows + i, 1), KVQ_OK);
        double e = tu_rel_l2(kvq_logits_row(a, i), kvq_logits(ref_a), (size_t)nv);
        worst = e > worst ? e : worst;
        differ += rows_differ(kvq_logits_row(a, i), kvq_logits(ref_a), nv);
    }
    /* the other context's rows went one piece: as one forward of its 3 tokens */
    assert_int_equal(kvq_eval(ref_b, prompt + 4, 3), KVQ_OK);
    double eb = tu_rel_l2(kvq_logits(b), kvq_logits(ref_b), (size_t)nv);
    print_message("%s %s cache: all rows vs one at a time, %d of %d rows differ (worst rel %.2e); the other context's "
                  "last row %.2e\n", g_backend ? g_backend : "cpu", name, differ, n_rows, worst, eb);
    assert_int_equal(differ, 0);
    assert_int_equal(rows_differ(kvq_logits(b), kvq_logits(ref_b), nv), 0);

    /* rolled back past two rows and off again: one row, as after plain decoding */
    assert_int_equal(kvq_kv_truncate(a, np + 3), KVQ_OK);
    assert_int_equal(kvq_kv_truncate(ref_a, np + 3), KVQ_OK);
    assert_int_equal(kvq_logits_all_set(a, 0), KVQ_OK);
    const int32_t next = 13;
    ids[0] = &next, ids[1] = &next;
    const int one[2] = {1, 1};
    assert_int_equal(kvq_eval_batch(ctx, ids, one, 2), KVQ_OK);
    assert_null(kvq_logits_row(a, 1));
    assert_int_equal(kvq_eval(ref_a, &next, 1), KVQ_OK);
    assert_int_equal(rows_differ(kvq_logits(a), kvq_logits(ref_a), nv), 0);
    kvq_context_free(a), kvq_context_free(b), kvq_context_free(ref_a), kvq_context_free(ref_b);
}

static void test_rows_f32(void **state) {
    (void)state;
    rows_match(KVQ_CACHE_F32, "f32");
}

static void test_rows_f16(void **state) {
    (void)state;
    rows_match(KVQ_CACHE_F16, "f16");
}

static void test_rows_q8(void **state) {
    (void)state;
    rows_match(KVQ_CACHE_Q8, "q8");
}

static void test_rows_q4(void **state) {
    (void)state;
    rows_match(KVQ_CACHE_Q4, "q4");
}

/* On the CPU with 2 threads, past the position where attention splits a row's positions among
 * threads (the demo's 2 KV heads leave threads idle): a step of exact_rows rows at positions
 * 700.. against the same tokens one at a time. Before the fixed split points (cpu_kv.c's
 * exact_split) a decode and a batch cut the positions differently and every row differed. */
static void test_rows_long_cpu(void **state) {
    (void)state;
    if (g_backend && strcmp(g_backend, "cpu")) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 2;
    kvq_model *m;
    if (kvq_model_load(KVQ_SOURCE_DIR "/models/demo", &mp, &m) != KVQ_OK) fail_msg("load: %s", kvq_last_error());
    const int nv = kvq_model_n_vocab(m), np = 700, n_rows = kvq_model_exact_rows(m);
    int32_t prompt[700], rows[32];
    assert_in_range(n_rows, 2, 32);
    for (int i = 0; i < np; i++) prompt[i] = i ? (int32_t)((i * 7919 + 13) % nv) : 1;
    for (int i = 0; i < n_rows; i++) rows[i] = (int32_t)((i * 104729 + 7) % nv);
    static const kvq_cache_type types[] = {KVQ_CACHE_F16, KVQ_CACHE_Q4};
    for (int k = 0; k < 2; k++) {
        kvq_context_params cp = kvq_context_default_params();
        cp.n_ctx = 1024;
        cp.n_batch = 256;
        cp.type_k = cp.type_v = types[k];
        kvq_context *a, *ref;
        if (kvq_context_new(m, &cp, &a) != KVQ_OK || kvq_context_new(m, &cp, &ref) != KVQ_OK)
            fail_msg("context: %s", kvq_last_error());
        assert_int_equal(kvq_eval(a, prompt, np), KVQ_OK);
        assert_int_equal(kvq_eval(ref, prompt, np), KVQ_OK);
        assert_int_equal(kvq_logits_all_set(a, 1), KVQ_OK);
        assert_int_equal(kvq_eval(a, rows, n_rows), KVQ_OK);
        int differ = 0;
        for (int i = 0; i < n_rows; i++) {
            assert_int_equal(kvq_eval(ref, rows + i, 1), KVQ_OK);
            differ += rows_differ(kvq_logits_row(a, i), kvq_logits(ref), nv);
        }
        print_message("cpu -t 2 %s cache, positions %d..%d: %d of %d rows differ from one at a time\n",
                      kvq_cache_type_name(types[k]), np, np + n_rows - 1, differ, n_rows);
        assert_int_equal(differ, 0);
        kvq_context_free(a), kvq_context_free(ref);
    }
    kvq_model_free(m);
}

/* The query is the fewest over the model's backends: never more than a CPU-only model's, the
 * same when this model is on the CPU alone (the batch above has that many rows). */
static void test_exact_rows(void **state) {
    (void)state;
    if (!g_m) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 1;
    kvq_model *cpu = NULL;
    if (kvq_model_load(KVQ_SOURCE_DIR "/models/demo", &mp, &cpu) != KVQ_OK) fail_msg("load: %s", kvq_last_error());
    const int here = kvq_model_exact_rows(g_m), alone = kvq_model_exact_rows(cpu);
    print_message("exact rows: %d here (%d GPU layers), %d on the CPU alone\n", here, kvq_model_gpu_layers(g_m), alone);
    assert_true(here >= 4 && here <= alone); /* 4: the other context's 3 rows and one of this one's */
    if (!kvq_model_gpu_layers(g_m)) assert_int_equal(here, alone);
    kvq_model_free(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_f32),
        cmocka_unit_test(test_rows_f16),
        cmocka_unit_test(test_rows_q8),
        cmocka_unit_test(test_rows_q4),
        cmocka_unit_test(test_exact_rows),
        cmocka_unit_test(test_rows_long_cpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
