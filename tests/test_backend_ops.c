/* Every backend that starts here (CPU; Vulkan on any device, lavapipe included):
 * the elementwise ops and get_rows through the kvq_backend table vs src/ref, and
 * the contract's error rule (ops record, the first error comes out of buf_read). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ref/ref.h"
#include "testutil.h"
#include "util.h"

static const kvq_backend *be;
static kvq_bctx *b;


static kvq_buf *upload(const float *x, size_t n) {
    kvq_buf *buf = be->buf_new(b, n * sizeof(float));
    be->buf_write(b, buf, 0, x, n * sizeof(float));
    return buf;
}

static void test_rms_norm(void **s) {
    uint64_t rng = 7;
    const int dims[] = {1, 7, 33, 256, 1000};
    for (int di = 0; di < 5; di++) {
        int n = 3, dim = dims[di];
        float *x = malloc(sizeof(float) * n * dim), *g = malloc(sizeof(float) * dim);
        float *want = malloc(sizeof(float) * n * dim), *got = malloc(sizeof(float) * n * dim);
        tu_rand_fill(x, (size_t)n * dim, &rng);
        tu_rand_fill(g, (size_t)dim, &rng);
        kvq_weight_desc d = {.fmt = KVQ_W_F32, .rows = 1, .cols = dim, .data = g, .name = "g"};
        kvq_wt *gw = be->weight_upload(b, &d);
        kvq_buf *xb = upload(x, (size_t)n * dim), *yb = be->buf_new(b, sizeof(float) * n * dim);
        be->rms_norm(b, xb, gw, yb, n, dim, 1e-5f);
        assert_int_equal(be->buf_read(b, yb, 0, got, sizeof(float) * n * dim), KVQ_OK);
        kvq_ref_rms_norm(x, g, want, n, dim, 1e-5f);
        assert_true(tu_rel_l2(got, want, (size_t)n * dim) < 1e-6);
        be->buf_free(b, xb), be->buf_free(b, yb), be->weight_free(b, gw);
        free(x), free(g), free(want), free(got);
    }
}

static void test_rope(void **s) {
    uint64_t rng = 9;
    const int hds[] = {2, 6, 64, 128};
    for (int hi = 0; hi < 4; hi++) {
        int n = 5, heads = 3, hd = hds[hi], cnt = n * heads * hd;
        float *x = malloc(sizeof(float) * cnt), *want = malloc(sizeof(float) * cnt), *got = malloc(sizeof(float) * cnt);
        float freq[64];
        for (int i = 0; i < hd / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / hd);
        tu_rand_fill(x, (size_t)cnt, &rng);
        memcpy(want, x, sizeof(float) * cnt);
        /* a small position and one far out, where a float angle alone would be off */
        const int pos0 = hi % 2 ? 37 : 131000 + hi;
        kvq_buf *xb = upload(x, (size_t)cnt);
        be->rope(b, xb, n, heads, hd, pos0, freq, KVQ_ROPE_HALF);
        assert_int_equal(be->buf_read(b, xb, 0, got, sizeof(float) * cnt), KVQ_OK);
        kvq_ref_rope(want, n, heads, hd, pos0, freq, 0);
        if (getenv("KVQ_TEST_VERBOSE")) printf("rope hd %d pos0 %d: max abs diff %g\n", hd, pos0, tu_max_abs_diff(got, want, (size_t)cnt));
        assert_true(tu_max_abs_diff(got, want, (size_t)cnt) < 1e-5);
        be->buf_free(b, xb);
        free(x), free(want), free(got);
    }
}

static void test_swiglu_add_copy(void **s) {
    uint64_t rng = 11;
    size_t n = 10007;
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    tu_rand_fill(g, n, &rng);
    tu_rand_fill(u, n, &rng);
    for (size_t i = 0; i < n; i++) g[i] *= 8;
    kvq_buf *gb = upload(g, n), *ub = upload(u, n);
    be->swiglu(b, gb, ub, n);
    be->add(b, gb, ub, n);
    be->copy(b, ub, 4, gb, 0, 8);
    assert_int_equal(be->buf_read(b, gb, 0, got, sizeof(float) * n), KVQ_OK);
    kvq_ref_swiglu(g, u, n);
    for (size_t i = 0; i < n; i++) g[i] += u[i];
    g[0] = u[1];
    g[1] = u[2];
    assert_true(tu_max_abs_diff(got, g, n) < 1e-5);
    be->buf_free(b, gb), be->buf_free(b, ub);
    free(g), free(u), free(got);
}

static void test_get_rows(void **s) {
    int rows = 13, cols = 24;
    uint16_t *w = malloc(2 * rows * cols);
    float *want = malloc(sizeof(float) * 3 * cols), *got = malloc(sizeof(float) * 3 * cols);
    uint64_t rng = 3;
    for (int i = 0; i < rows * cols; i++) w[i] = kvq_f32_to_f16(tu_randf(&rng));
    kvq_weight_desc d = {.fmt = KVQ_W_F16, .rows = rows, .cols = cols, .data = w, .name = "emb"};
    if (be->weight_supported && !be->weight_supported(b, &d)) {
        free(w), free(want), free(got);
        skip();
    }
    kvq_wt *ew = be->weight_upload(b, &d);
    int32_t ids[3] = {12, 0, 5};
    kvq_buf *out = be->buf_new(b, sizeof(float) * 3 * cols);
    be->get_rows(b, ew, ids, 3, out);
    assert_int_equal(be->buf_read(b, out, 0, got, sizeof(float) * 3 * cols), KVQ_OK);
    for (int i = 0; i < 3; i++) kvq_ref_weight_row(&d, ids[i], want + i * cols);
    assert_true(tu_max_abs_diff(got, want, (size_t)3 * cols) == 0);
    be->buf_free(b, out), be->weight_free(b, ew);
    free(w), free(want), free(got);
}

/* Ops keep going after an error; the first one comes out of the next buf_read, and
 * the backend works normally after that. */
static void test_error_at_read(void **s) {
    float x[64] = {1}, got[64];
    kvq_buf *xb = upload(x, 64);
    be->buf_write(b, xb, 60 * sizeof(float), x, 8 * sizeof(float)); /* past the end */
    be->add(b, xb, xb, 64);
    kvq_status st = be->buf_read(b, xb, 0, got, sizeof got);
    if (st == KVQ_OK) { /* a backend may also reject the write at once; then the data is intact */
        assert_true(got[0] == 2.0f);
    } else {
        assert_true(strlen(kvq_last_error()) > 0);
    }
    be->add(b, xb, xb, 64);
    assert_int_equal(be->buf_read(b, xb, 0, got, sizeof got), KVQ_OK);
    be->buf_free(b, xb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rms_norm), cmocka_unit_test(test_rope), cmocka_unit_test(test_swiglu_add_copy),
        cmocka_unit_test(test_get_rows),
    };
    const struct CMUnitTest vk_tests[] = {cmocka_unit_test(test_error_at_read)};
    int failed = 0;
    for (int i = 0; i < kvq_backend_count(); i++) {
        if (!(b = tu_backend_start(i, &be))) continue;
        failed += _cmocka_run_group_tests(be->name, tests, sizeof tests / sizeof tests[0], NULL, NULL);
        if (strcmp(be->name, "cpu")) /* the CPU backend writes at once (no recording to keep going with) */
            failed += _cmocka_run_group_tests(be->name, vk_tests, 1, NULL, NULL);
        be->release(b);
    }
    return failed;
}
