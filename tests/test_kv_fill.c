/* The internal depth fill (src/kv_fill.h) that kvq-bench model --depth uses: it leaves a
 * cache of the asked length that attention reads like any other, for every cache type. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_fill.h"
#include "kv_format.h"
#include "kvq.h"
#include "testutil.h"

#define N_CTX 256
#define DEPTH 100

static kvq_model *demo(void) {
    const char *dir = kvq_demo_model_dir();
    if (!dir) return NULL;
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 1; /* bitwise repeatable (2 threads differ by ~1e-5 run to run, fill or not) */
    kvq_model *m;
    if (kvq_model_load(dir, &mp, &m) != KVQ_OK) fail_msg("%s", kvq_last_error());
    return m;
}

static kvq_context *ctx(kvq_model *m, kvq_cache_type t) {
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = N_CTX;
    p.n_batch = 32; /* several kv_store batches per layer */
    p.type_k = p.type_v = t;
    kvq_context *c;
    if (kvq_context_new(m, &p, &c) != KVQ_OK) fail_msg("%s", kvq_last_error());
    return c;
}

/* Logits of the 8 tokens after a cache filled to DEPTH with seed (twice: in two fills). */
static float *logits_after_fill(kvq_model *m, kvq_cache_type t, uint64_t seed, int twice) {
    kvq_context *c = ctx(m, t);
    if (twice) { /* in two steps, as the bench does between depths */
        assert_int_equal(kvq_kv_fill_random(c, DEPTH / 2, seed), KVQ_OK);
        assert_int_equal(kvq_n_past(c), DEPTH / 2);
    }
    assert_int_equal(kvq_kv_fill_random(c, DEPTH, seed), KVQ_OK);
    assert_int_equal(kvq_n_past(c), DEPTH);
    int32_t ids[8] = {1, 450, 4996, 17354, 1701, 432, 17204, 975};
    assert_int_equal(kvq_eval(c, ids, 8), KVQ_OK);
    assert_int_equal(kvq_n_past(c), DEPTH + 8);
    int nv = kvq_model_n_vocab(m);
    float *out = malloc(sizeof(float) * (size_t)nv);
    memcpy(out, kvq_logits(c), sizeof(float) * (size_t)nv);
    for (int i = 0; i < nv; i++) assert_true(isfinite(out[i]));
    /* rows past the fill are overwritten by the next evaluation: same logits again */
    assert_int_equal(kvq_kv_truncate(c, DEPTH), KVQ_OK);
    assert_int_equal(kvq_eval(c, ids, 8), KVQ_OK);
    assert_memory_equal(out, kvq_logits(c), sizeof(float) * (size_t)nv);
    kvq_context_free(c);
    return out;
}

static void test_fill_types(void **state) {
    (void)state;
    kvq_model *m = demo();
    TU_NEED_FIXTURE(m);
    int nv = kvq_model_n_vocab(m);
    const kvq_cache_type types[] = {KVQ_CACHE_F32, KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        float *a = logits_after_fill(m, types[i], 1, 0), *again = logits_after_fill(m, types[i], 1, 0);
        float *other = logits_after_fill(m, types[i], 2, 0), *steps = logits_after_fill(m, types[i], 1, 1);
        /* deterministic, and attention reads the rows: other rows, other logits */
        assert_memory_equal(a, again, sizeof(float) * (size_t)nv);
        assert_true(tu_max_abs_diff(a, other, (size_t)nv) > 1e-3);
        free(a), free(again), free(other), free(steps);
    }
    kvq_model_free(m);
}

static void test_fill_length_and_bytes(void **state) {
    (void)state;
    kvq_model *m = demo();
    TU_NEED_FIXTURE(m);
    kvq_context *c = ctx(m, KVQ_CACHE_Q4);
    assert_int_equal(kvq_kv_fill_random(c, 0, 1), KVQ_OK); /* nothing to do */
    assert_int_equal(kvq_kv_fill_random(c, DEPTH, 1), KVQ_OK);
    /* demo: 4 layers, 2 KV heads, head dim 64, K and V in q4 */
    size_t row = 2 * kvq_kv_row_bytes(KVQ_CACHE_Q4, 64);
    assert_int_equal(kvq_kv_bytes_used(c), (size_t)4 * 2 * DEPTH * row);
    assert_int_equal(kvq_kv_fill_random(c, DEPTH - 1, 1), KVQ_ERR_ARG); /* below the length */
    assert_int_equal(kvq_kv_fill_random(c, N_CTX + 1, 1), KVQ_ERR_ARG); /* past n_ctx */
    assert_int_equal(kvq_n_past(c), DEPTH);
    assert_int_equal(kvq_kv_fill_random(c, N_CTX, 3), KVQ_OK); /* up to the end */
    int32_t id = 1;
    assert_int_equal(kvq_eval(c, &id, 1), KVQ_ERR_ARG); /* full */
    assert_int_equal(kvq_kv_truncate(c, N_CTX - 1), KVQ_OK);
    assert_int_equal(kvq_eval(c, &id, 1), KVQ_OK);
    kvq_context_free(c);
    kvq_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_types),
        cmocka_unit_test(test_fill_length_and_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
