/* Every backend that starts here (CPU; Vulkan on any device, lavapipe included):
 * the elementwise ops, norms, rope (both pairings), get_rows, copy_rows and the
 * mixture-of-experts ops (matmul_routed over dense and AQLM experts, add_weighted)
 * through the kvq_backend table vs src/ref, and
 * the contract's error rule (ops record, the first error comes out of buf_read). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_matmul.h"
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
    for (int mi = 0; mi < 8; mi++) {
        int hi = mi % 4, mode = mi / 4 ? KVQ_ROPE_PAIRS : KVQ_ROPE_HALF;
        int n = 5, heads = 3, hd = hds[hi], cnt = n * heads * hd;
        float *x = malloc(sizeof(float) * cnt), *want = malloc(sizeof(float) * cnt), *got = malloc(sizeof(float) * cnt);
        float freq[64];
        for (int i = 0; i < hd / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / hd);
        tu_rand_fill(x, (size_t)cnt, &rng);
        memcpy(want, x, sizeof(float) * cnt);
        /* a small position and one far out, where a float angle alone would be off */
        const int pos0 = hi % 2 ? 37 : 131000 + hi;
        kvq_buf *xb = upload(x, (size_t)cnt);
        be->rope(b, xb, n, heads, hd, pos0, freq, mode);
        assert_int_equal(be->buf_read(b, xb, 0, got, sizeof(float) * cnt), KVQ_OK);
        kvq_ref_rope(want, n, heads, hd, pos0, freq, mode == KVQ_ROPE_PAIRS);
        if (getenv("KVQ_TEST_VERBOSE"))
            printf("rope mode %d hd %d pos0 %d: max abs diff %g\n", mode, hd, pos0, tu_max_abs_diff(got, want, (size_t)cnt));
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

/* LayerNorm (mean-centred, no bias) with one gain row and with per-head gains (g_rows 3 over
 * 7 rows, so rows wrap around the gains unevenly); in place for the per-head case, as the
 * q/k norms run. Gains in f32, and f16 for the per-head ones. */
static void test_layer_norm(void **s) {
    uint64_t rng = 17;
    const int dims[] = {1, 7, 33, 256, 1000};
    for (int ci = 0; ci < 10; ci++) {
        int dim = dims[ci % 5], g_rows = ci < 5 ? 1 : 3, n = 7, inplace = g_rows > 1;
        size_t cnt = (size_t)n * dim, gcnt = (size_t)g_rows * dim;
        float *x = malloc(sizeof(float) * cnt), *g = malloc(sizeof(float) * gcnt);
        float *want = malloc(sizeof(float) * cnt), *got = malloc(sizeof(float) * cnt);
        uint16_t *gh = malloc(sizeof(uint16_t) * gcnt);
        tu_rand_fill(x, cnt, &rng);
        for (size_t i = 0; i < cnt; i++) x[i] = x[i] * 3.0f + 0.5f; /* a mean away from zero */
        tu_rand_fill(g, gcnt, &rng);
        for (size_t i = 0; i < gcnt; i++) g[i] = kvq_f16_to_f32(gh[i] = kvq_f32_to_f16(g[i]));
        kvq_weight_desc d = {.fmt = inplace ? KVQ_W_F16 : KVQ_W_F32, .rows = g_rows, .cols = dim,
                             .data = inplace ? (const void *)gh : g, .name = "ln.g"};
        kvq_wt *gw = be->weight_upload(b, &d);
        assert_non_null(gw);
        kvq_buf *xb = upload(x, cnt), *yb = inplace ? xb : be->buf_new(b, sizeof(float) * cnt);
        be->layer_norm(b, xb, gw, yb, n, dim, 1e-5f, g_rows);
        assert_int_equal(be->buf_read(b, yb, 0, got, sizeof(float) * cnt), KVQ_OK);
        kvq_ref_layer_norm(x, g, want, n, dim, 1e-5f, g_rows);
        double e = tu_rel_l2(got, want, cnt);
        if (getenv("KVQ_TEST_VERBOSE")) printf("layer_norm dim %d g_rows %d: rel L2 %g\n", dim, g_rows, e);
        if (!(e < 1e-6)) fail_msg("layer_norm dim %d g_rows %d: rel L2 %.3g", dim, g_rows, e);
        if (yb != xb) be->buf_free(b, yb);
        be->buf_free(b, xb), be->weight_free(b, gw);
        free(x), free(g), free(gh), free(want), free(got);
    }
}

/* geglu over a range wide enough for tanh to saturate both ways. */
static void test_geglu(void **s) {
    uint64_t rng = 19;
    size_t n = 10007;
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    tu_rand_fill(g, n, &rng);
    tu_rand_fill(u, n, &rng);
    for (size_t i = 0; i < n; i++) g[i] *= 12;
    g[0] = 0, g[1] = -40, g[2] = 40, g[3] = 1e-4f, g[4] = -1e-4f;
    kvq_buf *gb = upload(g, n), *ub = upload(u, n);
    be->geglu(b, gb, ub, n);
    assert_int_equal(be->buf_read(b, gb, 0, got, sizeof(float) * n), KVQ_OK);
    kvq_ref_geglu(g, u, n);
    double e = tu_max_abs_diff(got, g, n);
    if (getenv("KVQ_TEST_VERBOSE")) printf("geglu: max abs diff %g, rel L2 %g\n", e, tu_rel_l2(got, g, n));
    if (!(e < 1e-5)) fail_msg("geglu: max abs diff %.3g", e);
    be->buf_free(b, gb), be->buf_free(b, ub);
    free(g), free(u), free(got);
}

/* x *= s is one rounding per value: exact; values past count stay. */
static void test_scale(void **s) {
    uint64_t rng = 23;
    size_t n = 10007, count = n - 3;
    float *x = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    tu_rand_fill(x, n, &rng);
    kvq_buf *xb = upload(x, n);
    be->scale(b, xb, count, -0.37f);
    be->scale(b, xb, 1, 3.0f);
    assert_int_equal(be->buf_read(b, xb, 0, got, sizeof(float) * n), KVQ_OK);
    for (size_t i = 0; i < n; i++) {
        float want = i < count ? x[i] * -0.37f : x[i];
        if (i == 0) want *= 3.0f;
        if (got[i] != want) fail_msg("scale: value %zu is %g, not %g", i, got[i], want);
    }
    be->buf_free(b, xb);
    free(x), free(got);
}

/* copy_rows as a fused projection's split uses it: rows of q, k, v out of [n][q|k|v] at
 * float (not 16-byte) offsets, into separate buffers and into the same one; contiguous rows
 * (strides = row size) too. Everything outside the copied rows stays. */
static void test_copy_rows(void **s) {
    uint64_t rng = 29;
    const int ns[] = {1, 7, 33, 512};
    for (int ni = 0; ni < 4; ni++) {
        int n = ns[ni], wq = 13, wk = 5, wf = wq + 2 * wk; /* fused row: q 13, k 5, v 5 floats */
        size_t sn = (size_t)n * wf;
        float *src = malloc(sizeof(float) * sn), *dst0 = malloc(sizeof(float) * 2 * sn), *got = malloc(sizeof(float) * 2 * sn);
        float *want = malloc(sizeof(float) * 2 * sn);
        tu_rand_fill(src, sn, &rng);
        tu_rand_fill(dst0, 2 * sn, &rng);
        kvq_buf *sb = upload(src, sn), *db = upload(dst0, 2 * sn);
        memcpy(want, dst0, sizeof(float) * 2 * sn);
        /* q rows to dst[0..n*wq), v rows to dst[n*wq + 1 ..) (odd float offset) */
        be->copy_rows(b, sb, 0, sizeof(float) * wf, db, 0, sizeof(float) * wq, sizeof(float) * wq, n);
        be->copy_rows(b, sb, sizeof(float) * (wq + wk), sizeof(float) * wf, db, sizeof(float) * ((size_t)n * wq + 1),
                      sizeof(float) * wk, sizeof(float) * wk, n);
        for (int r = 0; r < n; r++) {
            memcpy(want + (size_t)r * wq, src + (size_t)r * wf, sizeof(float) * wq);
            memcpy(want + (size_t)n * wq + 1 + (size_t)r * wk, src + (size_t)r * wf + wq + wk, sizeof(float) * wk);
        }
        /* contiguous: the whole src into the back half of dst, as rows */
        be->copy_rows(b, sb, 0, sizeof(float) * wf, db, sizeof(float) * sn, sizeof(float) * wf, sizeof(float) * wf, n);
        memcpy(want + sn, src, sizeof(float) * sn);
        /* within one buffer: the first 2 floats of each q row (front half) to a strided layout
         * in the back half (after the contiguous copy above) */
        be->copy_rows(b, db, 0, sizeof(float) * wq, db, sizeof(float) * (sn + 3), sizeof(float) * wf, sizeof(float) * 2, n);
        for (int r = 0; r < n; r++) memcpy(want + sn + 3 + (size_t)r * wf, want + (size_t)r * wq, sizeof(float) * 2);
        assert_int_equal(be->buf_read(b, db, 0, got, sizeof(float) * 2 * sn), KVQ_OK);
        if (tu_max_abs_diff(got, want, 2 * sn) != 0) fail_msg("copy_rows n=%d: not exact", n);
        be->buf_free(b, sb), be->buf_free(b, db);
        free(src), free(dst0), free(got), free(want);
    }
}

/* acc += the k weighted expert outputs of each row; wts is read at issue time. */
static void test_add_weighted(void **s) {
    uint64_t rng = 31;
    const int ns[] = {1, 7, 33}, ks[] = {1, 2, 3}, dims[] = {1, 7, 33, 1000};
    for (int ci = 0; ci < 12; ci++) {
        int n = ns[ci % 3], k = ks[(ci / 3) % 3], dim = dims[ci % 4];
        size_t an = (size_t)n * dim, sn = an * k;
        float *acc = malloc(sizeof(float) * an), *src = malloc(sizeof(float) * sn), *got = malloc(sizeof(float) * an);
        float *wts = malloc(sizeof(float) * n * k), *wts_issued = malloc(sizeof(float) * n * k);
        tu_rand_fill(acc, an, &rng);
        tu_rand_fill(src, sn, &rng);
        tu_rand_fill(wts, (size_t)n * k, &rng);
        memcpy(wts_issued, wts, sizeof(float) * n * k);
        kvq_buf *ab = upload(acc, an), *sb = upload(src, sn);
        be->add_weighted(b, ab, sb, wts_issued, n, k, dim);
        memset(wts_issued, 0, sizeof(float) * n * k);
        assert_int_equal(be->buf_read(b, ab, 0, got, sizeof(float) * an), KVQ_OK);
        kvq_ref_add_weighted(acc, src, wts, n, k, dim);
        double e = tu_max_abs_diff(got, acc, an);
        if (!(e < 1e-6)) fail_msg("add_weighted n=%d k=%d dim=%d: max abs diff %.3g", n, k, dim, e);
        be->buf_free(b, ab), be->buf_free(b, sb);
        free(acc), free(src), free(got), free(wts), free(wts_issued);
    }
}

/* ---- matmul_routed: experts of one shape, dense f32 and AQLM (2x8, 1x16) ---- */

#define N_EXPERTS 5

typedef struct {
    kvq_weight_desc d;
    void *data, *codes, *books, *scales;
} expert;

static void expert_make(expert *e, kvq_wformat fmt, int rows, int cols, int M, int nbits, uint64_t *rng) {
    memset(e, 0, sizeof *e);
    if (fmt == KVQ_W_F32) {
        float *w = malloc(sizeof(float) * rows * cols);
        tu_rand_fill(w, (size_t)rows * cols, rng);
        e->data = w;
        e->d = (kvq_weight_desc){.fmt = fmt, .rows = rows, .cols = cols, .data = w, .name = "expert.dense"};
        return;
    }
    /* as tests/test_backend_matmul.c builds them: random codes over the whole byte range,
     * fp16 codebooks in [-1,1), scales around 0.7 */
    int ig = 8, cb = nbits > 8 ? 2 : 1;
    size_t K = (size_t)1 << nbits, n_codes = (size_t)rows * (cols / ig) * M;
    uint8_t *codes = malloc(n_codes * cb);
    for (size_t i = 0; i < n_codes * cb; i++) codes[i] = (uint8_t)(tu_randf(rng) * 128.0f + 128.0f);
    uint16_t *books = malloc(sizeof(uint16_t) * M * K * ig), *scales = malloc(sizeof(uint16_t) * rows);
    for (size_t i = 0; i < (size_t)M * K * ig; i++) books[i] = kvq_f32_to_f16(tu_randf(rng));
    for (int o = 0; o < rows; o++) scales[o] = kvq_f32_to_f16(0.5f + tu_randf(rng) * 0.4f);
    e->codes = codes, e->books = books, e->scales = scales;
    e->d = (kvq_weight_desc){.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = M, .nbits = nbits,
                             .in_group = ig, .code_bytes = cb, .codes = codes, .codebooks = books, .scales = scales,
                             .name = "expert.aqlm"};
}

static void expert_free(expert *e) { free(e->data), free(e->codes), free(e->books), free(e->scales); }

/* y[r] = x[r / x_div] · W[route[r]]ᵀ for token counts through both matmul paths (a few
 * rows per expert: matvec; 33 rows mostly on one expert: tiles), routes that repeat experts
 * and leave some out, x_div 1 (prompt rows) and 2 (top-2: both of a token's rows read its x
 * row). Every row of y must be written (NaN-filled before). */
static void test_matmul_routed(void **s) {
    uint64_t rng = 37;
    const struct { const char *name; kvq_wformat fmt; int rows, cols, M, nbits; } kinds[] = {
        {"dense f32", KVQ_W_F32, 37, 45, 0, 0},
        {"aqlm 2x8", KVQ_W_AQLM, 70, 64, 2, 8},
        {"aqlm 1x16", KVQ_W_AQLM, 33, 264, 1, 16},
    };
    const int ns[] = {1, 2, 7, 33};
    /* AQLM bounds as tests/test_backend_matmul.c states them per backend */
    double tol = strcmp(be->name, "cpu") ? 1e-5 : KVQ_LUT_I16_REL_L2 > KVQ_AMX_REL_L2 ? KVQ_LUT_I16_REL_L2 : KVQ_AMX_REL_L2;
    for (int ki = 0; ki < 3; ki++) {
        int rows = kinds[ki].rows, cols = kinds[ki].cols;
        expert ex[N_EXPERTS];
        kvq_wt *wt[N_EXPERTS];
        for (int e = 0; e < N_EXPERTS; e++) {
            expert_make(&ex[e], kinds[ki].fmt, rows, cols, kinds[ki].M, kinds[ki].nbits, &rng);
            if (be->weight_supported && !be->weight_supported(b, &ex[e].d)) fail_msg("%s: not supported", kinds[ki].name);
            wt[e] = be->weight_upload(b, &ex[e].d);
            assert_non_null(wt[e]);
        }
        int n_max = 33;
        float *x = malloc(sizeof(float) * n_max * cols), *want = malloc(sizeof(float) * n_max * rows);
        float *got = malloc(sizeof(float) * n_max * rows);
        tu_rand_fill(x, (size_t)n_max * cols, &rng);
        kvq_buf *xb = upload(x, (size_t)n_max * cols), *yb = be->buf_new(b, sizeof(float) * n_max * rows);
        for (int ci = 0; ci < 4 * 2 * 3; ci++) {
            int n = ns[ci % 4], x_div = 1 + (ci / 4) % 2, kind = ci / 8;
            int32_t route[33];
            for (int r = 0; r < n; r++) {
                if (kind == 0) /* random over experts 1 and 3 (0, 2 and 4 left out) */
                    route[r] = tu_randf(&rng) < 0 ? 1 : 3;
                else if (kind == 1) /* random over all, repeats */
                    route[r] = (int32_t)((tu_randf(&rng) + 1.0f) * 0.5f * N_EXPERTS) % N_EXPERTS;
                else /* mostly one expert (its rows take the tiled path), the last row elsewhere */
                    route[r] = r == n - 1 && n > 1 ? 0 : 4;
            }
            if (n == 2 && x_div == 2) route[0] = 4, route[1] = 2; /* a top-2 decode step */
            for (int r = 0; r < n; r++) kvq_ref_matmul(&ex[route[r]].d, x + (size_t)(r / x_div) * cols, want + (size_t)r * rows, 1);
            memset(got, 0xff, sizeof(float) * (size_t)n * rows);
            be->buf_write(b, yb, 0, got, sizeof(float) * (size_t)n * rows);
            int32_t issued[33];
            memcpy(issued, route, sizeof(int32_t) * n);
            be->matmul_routed(b, (const kvq_wt *const *)wt, N_EXPERTS, xb, yb, n, issued, x_div);
            memset(issued, 0xff, sizeof issued); /* copied at issue time */
            kvq_status st = be->buf_read(b, yb, 0, got, sizeof(float) * (size_t)n * rows);
            if (st != KVQ_OK) fail_msg("%s n=%d x_div=%d: %s", kinds[ki].name, n, x_div, kvq_last_error());
            double e = tu_rel_l2(got, want, (size_t)n * rows);
            if (getenv("KVQ_TEST_VERBOSE")) printf("matmul_routed %s n=%d x_div=%d: rel L2 %g\n", kinds[ki].name, n, x_div, e);
            if (!(e <= tol)) fail_msg("matmul_routed %s n=%d x_div=%d route kind %d: rel L2 %.3g > %.1g", kinds[ki].name, n,
                                      x_div, kind, e, tol);
        }
        be->buf_free(b, xb), be->buf_free(b, yb);
        for (int e = 0; e < N_EXPERTS; e++) be->weight_free(b, wt[e]), expert_free(&ex[e]);
        free(x), free(want), free(got);
    }
}

/* A route naming an expert past n_w is an error that comes out of buf_read. */
static void test_matmul_routed_bad_route(void **s) {
    float w[4 * 8] = {0}, x[8] = {0}, got[4];
    kvq_weight_desc d = {.fmt = KVQ_W_F32, .rows = 4, .cols = 8, .data = w, .name = "expert"};
    kvq_wt *wt = be->weight_upload(b, &d);
    kvq_buf *xb = upload(x, 8), *yb = be->buf_new(b, sizeof got);
    int32_t route[1] = {1};
    be->matmul_routed(b, (const kvq_wt *const *)&wt, 1, xb, yb, 1, route, 1);
    assert_int_not_equal(be->buf_read(b, yb, 0, got, sizeof got), KVQ_OK);
    assert_non_null(strstr(kvq_last_error(), "route"));
    assert_int_equal(be->buf_read(b, yb, 0, got, sizeof got), KVQ_OK); /* reported once */
    be->buf_free(b, xb), be->buf_free(b, yb), be->weight_free(b, wt);
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
        cmocka_unit_test(test_get_rows), cmocka_unit_test(test_layer_norm), cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_scale), cmocka_unit_test(test_copy_rows), cmocka_unit_test(test_add_weighted),
        cmocka_unit_test(test_matmul_routed), cmocka_unit_test(test_matmul_routed_bad_route),
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
