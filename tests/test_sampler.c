/* The sampler against a reference that sorts the whole vocabulary: the same
 * candidates survive top-k / top-p / min-p, draws follow the tempered softmax of
 * the survivors, repeat penalty and seeds behave as llama.cpp's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

typedef struct {
    float l;
    int id;
} ref_c;

static int ref_cmp(const void *x, const void *y) {
    const ref_c *a = x, *b = y;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return a->id - b->id;
}

/* Reference chain with a full sort; fills prob[id] (0 for dropped ids). */
static void ref_probs(const float *lg, int n, const kvq_sampler_params *p, double *prob) {
    ref_c *c = malloc(sizeof *c * (size_t)n);
    for (int i = 0; i < n; i++) c[i] = (ref_c){lg[i], i};
    qsort(c, (size_t)n, sizeof *c, ref_cmp);
    int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    double z = 0, acc = 0;
    for (int i = 0; i < k; i++) z += exp((double)c[i].l - c[0].l);
    int keep = k;
    if (p->top_p < 1)
        for (int i = 0; i < k; i++) {
            acc += exp((double)c[i].l - c[0].l) / z;
            if (acc >= p->top_p) { keep = i + 1; break; }
        }
    if (p->min_p > 0)
        for (int i = 1; i < keep; i++)
            if (exp((double)c[i].l - c[0].l) < p->min_p) { keep = i; break; }
    memset(prob, 0, sizeof *prob * (size_t)n);
    double m = 0;
    for (int i = 0; i < keep; i++) m += prob[c[i].id] = exp(((double)c[i].l - c[0].l) / p->temp);
    for (int i = 0; i < keep; i++) prob[c[i].id] /= m;
    free(c);
}

/* Draws `draws` tokens and checks: nothing outside the reference set, and each
 * frequency within 5 sigma of its reference probability. */
static void check_against_ref(const float *lg, int n, kvq_sampler_params p, int draws) {
    double *prob = malloc(sizeof *prob * (size_t)n);
    int *cnt = calloc((size_t)n, sizeof *cnt);
    ref_probs(lg, n, &p, prob);
    kvq_sampler *s = kvq_sampler_new(&p);
    for (int i = 0; i < draws; i++) {
        int32_t id = kvq_sample(s, lg, n);
        assert_true(id >= 0 && id < n);
        if (prob[id] == 0) fail_msg("drew id %d that the reference drops (k %d p %.2f min_p %.2f)", id, p.top_k, p.top_p, p.min_p);
        cnt[id]++;
    }
    for (int i = 0; i < n; i++) {
        if (prob[i] == 0) continue;
        double want = prob[i] * draws, sd = sqrt(draws * prob[i] * (1 - prob[i])) + 1;
        if (fabs(cnt[i] - want) > 5 * sd) fail_msg("id %d drawn %d times, expected %.1f", i, cnt[i], want);
    }
    kvq_sampler_free(s);
    free(prob);
    free(cnt);
}

static float *random_logits(int n, uint64_t seed, float scale) {
    float *lg = malloc(sizeof *lg * (size_t)n);
    uint64_t st = seed;
    tu_rand_fill(lg, (size_t)n, &st);
    for (int i = 0; i < n; i++) lg[i] *= scale;
    return lg;
}

static void test_greedy(void **state) {
    float *lg = random_logits(1000, 7, 5);
    kvq_sampler_params p = kvq_sampler_default_params();
    p.temp = 0;
    kvq_sampler *s = kvq_sampler_new(&p);
    int best = 0;
    for (int i = 1; i < 1000; i++)
        if (lg[i] > lg[best]) best = i;
    assert_int_equal(kvq_sample(s, lg, 1000), best);
    kvq_sampler_free(s);
    p = kvq_sampler_default_params();
    p.top_k = 1;
    s = kvq_sampler_new(&p);
    assert_int_equal(kvq_sample(s, lg, 1000), best);
    kvq_sampler_free(s);
    free(lg);
}

static void test_small_vocab_chains(void **state) {
    const float lg[] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f, -4.0f, 3.0f};
    kvq_sampler_params p = {.temp = 1, .top_k = 0, .top_p = 1, .seed = 1, .min_p = 0, .repeat_penalty = 1};
    check_against_ref(lg, 10, p, 40000); /* plain softmax */
    p.top_k = 3;
    check_against_ref(lg, 10, p, 40000);
    p.top_k = 0;
    p.top_p = 0.8f;
    check_against_ref(lg, 10, p, 40000);
    p.top_p = 1;
    p.min_p = 0.2f;
    check_against_ref(lg, 10, p, 40000);
    p = kvq_sampler_default_params();
    p.seed = 3;
    check_against_ref(lg, 10, p, 40000); /* llama.cpp defaults: k 40, p 0.95, min-p 0.05, t 0.8 */
    p.temp = 2.5f;
    check_against_ref(lg, 10, p, 40000);
}

/* A 128k vocabulary through the heap path (k <= 4096), the quickselect path
 * (large k) and the no-top-k path that grows its sorted prefix. */
static void test_large_vocab_paths(void **state) {
    int n = 128256;
    float *lg = random_logits(n, 11, 12);
    kvq_sampler_params p = kvq_sampler_default_params();
    p.seed = 5;
    check_against_ref(lg, n, p, 500);
    p.top_k = 6000;
    p.min_p = 0;
    check_against_ref(lg, n, p, 500);
    p.top_k = 0;
    p.top_p = 0.5f;
    check_against_ref(lg, n, p, 500);
    p.top_p = 0.95f;
    p.min_p = 0.01f;
    check_against_ref(lg, n, p, 500);
    free(lg);
}

static void test_repeat_penalty(void **state) {
    float lg[] = {3.0f, 2.9f, -1.0f, -1.05f};
    kvq_sampler_params p = kvq_sampler_default_params();
    p.temp = 0;
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 2;
    kvq_sampler *s = kvq_sampler_new(&p);
    assert_int_equal(kvq_sample(s, lg, 4), 0);
    kvq_sampler_accept(s, 0);
    kvq_sampler_accept(s, 0); /* twice: still penalized once (3.0 / 1.1 < 2.9) */
    assert_int_equal(kvq_sample(s, lg, 4), 1);
    assert_true(lg[0] == 3.0f); /* the caller's logits are left alone */
    kvq_sampler_accept(s, 1);
    kvq_sampler_accept(s, 2); /* window of 2: token 0 has left it */
    assert_int_equal(kvq_sample(s, lg, 4), 0);
    lg[0] = lg[1] = -5;
    /* negative logits are multiplied: -1.0 * 1.1 = -1.1 < -1.05 */
    assert_int_equal(kvq_sample(s, lg, 4), 3);
    kvq_sampler_reset(s);
    assert_int_equal(kvq_sample(s, lg, 4), 2);
    kvq_sampler_free(s);
}

static void test_seeds(void **state) {
    float *lg = random_logits(5000, 3, 2);
    kvq_sampler_params p = kvq_sampler_default_params();
    int32_t a[64], b[64], c[64];
    int32_t *outs[3] = {a, b, c};
    uint64_t seeds[3] = {42, 42, 43};
    for (int r = 0; r < 3; r++) {
        p.seed = seeds[r];
        kvq_sampler *s = kvq_sampler_new(&p);
        for (int i = 0; i < 64; i++) outs[r][i] = kvq_sample(s, lg, 5000);
        kvq_sampler_free(s);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    free(lg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),         cmocka_unit_test(test_small_vocab_chains),
        cmocka_unit_test(test_large_vocab_paths), cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
