/* kvq_context_copy and kvq_embedding on the demo model. A copied cache continues exactly as
 * the context it came from (every cache type); the embedding is the same whether the text is
 * read at once or a token at a time, starts over with an emptied cache, and differs between
 * texts. KVQ_TEST_BACKEND / KVQ_TEST_NGL run it on Vulkan and with offload (ctest variants). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

#define N_GEN 10

typedef struct {
    kvq_model *m;
    int32_t a[256], b[256];
    int na, nb, n_vocab, d;
} fixture;

static const char *g_backend;

static int setup(void **state) {
    *state = NULL;
    if (!tu_env_backend(&g_backend)) return 0;
    fixture *f = calloc(1, sizeof *f);
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    mp.n_gpu_layers = tu_env_gpu_layers();
    mp.n_threads = 1; /* repeatable sums: copy and original must agree to the bit */
    if (kvq_model_load(KVQ_SOURCE_DIR "/models/demo", &mp, &f->m) != KVQ_OK) fail_msg("load: %s", kvq_last_error());
    const kvq_tokenizer *tok = kvq_model_tokenizer(f->m);
    const char *ta = "The jury said that the city of Atlanta should take steps to improve its election laws, and";
    const char *tb = "It was a cold morning in the mountains when the old farmer walked down to the river";
    f->na = kvq_tokenize(tok, ta, strlen(ta), 1, f->a, 256);
    f->nb = kvq_tokenize(tok, tb, strlen(tb), 1, f->b, 256);
    f->n_vocab = kvq_model_n_vocab(f->m);
    f->d = kvq_model_n_embd(f->m);
    assert_true(f->na > 8 && f->nb > 8 && f->d > 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (f) kvq_model_free(f->m);
    free(f);
    return 0;
}

static kvq_context *new_ctx(fixture *f, kvq_cache_type t, int n_batch, int embeddings) {
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = n_batch;
    cp.type_k = cp.type_v = t;
    cp.embeddings = embeddings;
    kvq_context *c = NULL;
    if (kvq_context_new(f->m, &cp, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

static void test_copy_every_type(void **state) {
    fixture *f = *state;
    if (!f) skip();
    const kvq_cache_type types[] = {KVQ_CACHE_F32, KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        kvq_context *src = new_ctx(f, types[t], 0, 0), *dst = new_ctx(f, types[t], 0, 0);
        assert_int_equal(kvq_eval(dst, f->b, f->nb), KVQ_OK); /* something to replace */
        /* all but the last token in the cache; the last one evaluated on each side */
        assert_int_equal(kvq_eval(src, f->a, f->na - 1), KVQ_OK);
        assert_int_equal(kvq_context_copy(dst, src), KVQ_OK);
        assert_int_equal(kvq_n_past(dst), f->na - 1);
        assert_int_equal(kvq_eval(src, f->a + f->na - 1, 1), KVQ_OK);
        assert_int_equal(kvq_eval(dst, f->a + f->na - 1, 1), KVQ_OK);
        assert_memory_equal(kvq_logits(src), kvq_logits(dst), sizeof(float) * (size_t)f->n_vocab);
        int32_t gs[N_GEN], gd[N_GEN];
        tu_greedy(src, f->n_vocab, gs, N_GEN);
        tu_greedy(dst, f->n_vocab, gd, N_GEN);
        assert_memory_equal(gs, gd, sizeof gs);
        kvq_context_free(src);
        kvq_context_free(dst);
    }
    /* different cache types do not mix */
    kvq_context *a = new_ctx(f, KVQ_CACHE_F16, 0, 0), *b = new_ctx(f, KVQ_CACHE_Q4, 0, 0);
    assert_int_equal(kvq_eval(a, f->a, 4), KVQ_OK);
    assert_int_equal(kvq_context_copy(b, a), KVQ_ERR_ARG);
    assert_int_equal(kvq_n_past(b), 0);
    kvq_context_free(a);
    kvq_context_free(b);
}

static double dist(const float *x, const float *y, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    return sqrt(s);
}

static double norm(const float *x, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

static void test_embedding(void **state) {
    fixture *f = *state;
    if (!f) skip();
    float *whole = malloc(sizeof(float) * (size_t)f->d), *steps = malloc(sizeof(float) * (size_t)f->d);
    float *other = malloc(sizeof(float) * (size_t)f->d), *again = malloc(sizeof(float) * (size_t)f->d);
    kvq_context *plain = new_ctx(f, KVQ_CACHE_F32, 0, 0);
    assert_int_equal(kvq_eval(plain, f->a, f->na), KVQ_OK);
    assert_int_equal(kvq_embedding(plain, whole), KVQ_ERR_ARG); /* made without the flag */
    kvq_context_free(plain);

    kvq_context *c = new_ctx(f, KVQ_CACHE_F32, 0, 1);
    assert_int_equal(kvq_embedding(c, whole), KVQ_ERR_ARG); /* nothing evaluated */
    assert_int_equal(kvq_eval(c, f->a, f->na), KVQ_OK);
    assert_int_equal(kvq_embedding(c, whole), KVQ_OK);
    /* a token at a time (n_batch 1 on a second context): the mean of the same rows */
    kvq_context *one = new_ctx(f, KVQ_CACHE_F32, 1, 1);
    for (int i = 0; i < f->na; i++) assert_int_equal(kvq_eval(one, f->a + i, 1), KVQ_OK);
    assert_int_equal(kvq_embedding(one, steps), KVQ_OK);
    double n = norm(whole, f->d);
    assert_true(n > 0.1);
    assert_true(dist(whole, steps, f->d) < 1e-3 * n);
    /* another text, then the first again after emptying the cache: the sums start over */
    assert_int_equal(kvq_kv_truncate(c, 0), KVQ_OK);
    assert_int_equal(kvq_eval(c, f->b, f->nb), KVQ_OK);
    assert_int_equal(kvq_embedding(c, other), KVQ_OK);
    assert_true(dist(whole, other, f->d) > 0.05 * n);
    assert_int_equal(kvq_kv_truncate(c, 0), KVQ_OK);
    assert_int_equal(kvq_eval(c, f->a, f->na), KVQ_OK);
    assert_int_equal(kvq_embedding(c, again), KVQ_OK);
    assert_memory_equal(whole, again, sizeof(float) * (size_t)f->d);
    /* the logits are those of a context without the flag */
    kvq_context *ref = new_ctx(f, KVQ_CACHE_F32, 0, 0);
    assert_int_equal(kvq_eval(ref, f->a, f->na), KVQ_OK);
    assert_memory_equal(kvq_logits(ref), kvq_logits(c), sizeof(float) * (size_t)f->n_vocab);
    kvq_context_free(ref);
    kvq_context_free(one);
    kvq_context_free(c);
    free(whole), free(steps), free(other), free(again);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_every_type),
        cmocka_unit_test(test_embedding),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
