/* Vulkan int8 prompt tiles (shaders/mm_tile_i8.comp, src/vulkan/vk_tile_i8.c): AQLM
 * matmuls of VK_I8T_MIN_N tokens or more on a backend opened without exact, on a device
 * with integer dot products. Every output is held to the stated bound
 *   sum_b ( sw/2 |x_b|_1 + sa/2 |W_b|_1 + n_b sw sa / 4 )   (+ f32 rounding slack)
 * (sw, sa: max| | / 127 of the row's and the token's 256-value block b, from the
 * reference weights), and the whole must sit above f32 rounding (the tiles really ran).
 * Shapes are awkward on purpose: rows and tokens not multiples of 64, short last blocks,
 * odd group counts, 2x8, 4x8, 2x8 g16, 1x16, 1x16 g16, int16 codes, and a second instance
 * with a lowered buffer limit so weights are cut into row pieces. Opened exact, or on a
 * device without integer dot products (KVQ_VK_DISABLE=intdot/all), the same matmuls must
 * take the f32 tiles (rel L2 1e-5 to the reference). Skips without a Vulkan device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ref/ref.h"
#include "testutil.h"
#include "util.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_tile_i8.h"

typedef struct {
    const char *name;
    int rows, cols, M, nbits, ig;
    int cb; /* stored bytes per code */
} shape;

static const shape shapes[] = {
    {"2x8 one short block", 37, 104, 2, 8, 8, 1},
    {"2x8 g16 4 blocks + 96", 130, 1120, 2, 8, 16, 1},
    {"1x16 several row tiles", 150, 1032, 1, 16, 8, 2},
    {"1x16 g16", 70, 528, 1, 16, 16, 2},
    {"4x8 65 groups", 64, 520, 4, 8, 8, 1},
    {"2x8 int16 codes", 65, 776, 2, 8, 8, 2},
};
static const int ns[] = {32, 45, 70, 131};
/* The split instance: buffers of SPLIT_MAX_BUFFER bytes hold x and y of 32 tokens but not
 * the codes, so the weight is cut into two row pieces. */
static const shape split_shapes[] = {{"4x8 int16 codes", 300, 264, 4, 8, 8, 2}};
static const int split_ns[] = {32};
#define SPLIT_MAX_BUFFER "40960"
#define N_MAX 131
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
    kvq_weight_desc d;
    void *mem[4];
} tweight;

static uint64_t rng = 777;

static void put_f16(void *p, size_t i, float v) {
    uint16_t h = kvq_f32_to_f16(v);
    memcpy((char *)p + 2 * i, &h, 2);
}

static void make_weight(tweight *w, const shape *s, int bias) {
    memset(w, 0, sizeof *w);
    size_t K = (size_t)1 << s->nbits, n_codes = (size_t)s->rows * (size_t)(s->cols / s->ig) * (size_t)s->M;
    uint8_t *codes = w->mem[0] = malloc(n_codes * (size_t)s->cb);
    void *books = w->mem[1] = malloc((size_t)s->M * K * (size_t)s->ig * 2);
    void *scales = w->mem[2] = malloc((size_t)s->rows * 2);
    float *b = w->mem[3] = malloc((size_t)s->rows * sizeof(float));
    assert_true(codes && books && scales && b);
    for (size_t i = 0; i < n_codes * (size_t)s->cb; i++) codes[i] = (uint8_t)(tu_randf(&rng) * 128.0f + 128.0f);
    for (size_t i = 0; i < (size_t)s->M * K * (size_t)s->ig; i++) put_f16(books, i, tu_randf(&rng));
    for (int o = 0; o < s->rows; o++) put_f16(scales, (size_t)o, 0.5f + tu_randf(&rng) * 0.4f);
    for (int o = 0; o < s->rows; o++) b[o] = tu_randf(&rng);
    w->d = (kvq_weight_desc){.fmt = KVQ_W_AQLM, .rows = s->rows, .cols = s->cols, .n_codebooks = s->M,
                             .nbits = s->nbits, .in_group = s->ig, .code_bytes = s->cb, .codes = codes,
                             .codebooks = books, .scales = scales, .bias = bias ? b : NULL,
                             .bias_fmt = KVQ_W_F32, .name = "test.i8t"};
}

static void free_weight(tweight *w) {
    for (int i = 0; i < 4; i++) free(w->mem[i]);
}

/* The stated bound of output (t, o); W: the reference rows, x: the tokens. */
static double i8t_bound(const float *wo, const float *xt, int cols) {
    return tu_i8_block_bound(wo, xt, cols, 256);
}

typedef struct {
    const kvq_backend *be;
    kvq_bctx *b;
    const char *label;
} inst;

static int start(inst *r, int exact, const char *max_buffer, const char *label) {
    kvq_backend_opts o = {.n_threads = 2, .allow_software = 1, .exact = exact};
    r->label = label;
    for (int i = 0; i < kvq_backend_count(); i++) {
        r->be = kvq_backend_get(i);
        if (strcmp(r->be->name, "vulkan")) continue;
        if (max_buffer) setenv("KVQ_VK_MAX_BUFFER", max_buffer, 1);
        kvq_status st = r->be->init(&o, &r->b);
        if (max_buffer) unsetenv("KVQ_VK_MAX_BUFFER");
        if (st == KVQ_OK) return 1;
        print_message("vulkan does not start here (%s)\n", kvq_last_error());
        return 0;
    }
    print_message("no vulkan backend in this build\n");
    return 0;
}

/* Every shape and token count on r; int8: whether the int8 tiles must be taken. */
static void run_all(const inst *r, int int8, const shape *shs, int n_sh, const int *nv, int n_nv) {
    double worst = 0, best = 1;
    for (int si = 0; si < n_sh; si++) {
        const shape *s = &shs[si];
        tweight w;
        make_weight(&w, s, si % 2);
        int rows = s->rows, cols = s->cols, N = nv[n_nv - 1];
        float *x = malloc(sizeof(float) * N_MAX * cols), *W = malloc(sizeof(float) * (size_t)rows * cols);
        float *want = malloc(sizeof(float) * N_MAX * rows), *got = malloc(sizeof(float) * N_MAX * rows);
        assert_true(x && W && want && got);
        tu_rand_fill(x, (size_t)N_MAX * cols, &rng);
        for (size_t i = 0; i < (size_t)N_MAX * cols; i += 41) x[i] *= 25.0f; /* outliers: block scales differ */
        for (int o = 0; o < rows; o++) kvq_ref_weight_row(&w.d, o, W + (size_t)o * cols);
        kvq_wt *wt = r->be->weight_upload(r->b, &w.d);
        if (!wt) fail_msg("%s on %s: upload failed: %s", s->name, r->label, kvq_last_error());
        kvq_buf *xb = r->be->buf_new(r->b, sizeof(float) * N * cols), *yb = r->be->buf_new(r->b, sizeof(float) * N * rows);
        if (!xb || !yb) fail_msg("%s on %s: buffers: %s", s->name, r->label, kvq_last_error());
        r->be->buf_write(r->b, xb, 0, x, sizeof(float) * N * cols);
        if (r->b->max_buffer < 65536 && wt->n_pieces < 2) fail_msg("%s on %s: not split", s->name, r->label);
        for (int ni = 0; ni < n_nv; ni++) {
            int n = nv[ni];
            if (kvq_vk_i8t_wanted(r->b, wt, n) != int8) fail_msg("%s n=%d on %s: int8 tiles %s", s->name, n, r->label, int8 ? "not taken" : "taken");
            kvq_ref_matmul(&w.d, x, want, n);
            memset(got, 0xff, sizeof(float) * (size_t)n * rows); /* NaN: outputs never written */
            r->be->buf_write(r->b, yb, 0, got, sizeof(float) * (size_t)n * rows);
            r->be->matmul(r->b, wt, xb, yb, n);
            if (r->be->buf_read(r->b, yb, 0, got, sizeof(float) * (size_t)n * rows) != KVQ_OK)
                fail_msg("%s n=%d on %s: %s", s->name, n, r->label, kvq_last_error());
            double e = tu_rel_l2(got, want, (size_t)n * rows);
            if (!int8) {
                if (!(e <= 1e-5)) fail_msg("%s n=%d on %s (f32 tiles): rel L2 %.3g", s->name, n, r->label, e);
                continue;
            }
            if (!(e > 1e-5 && e <= 4e-2)) fail_msg("%s n=%d on %s: rel L2 %.3g not in (1e-5, 4e-2]", s->name, n, r->label, e);
            worst = fmax(worst, e), best = fmin(best, e);
            for (int t = 0; t < n; t++)
                for (int o = 0; o < rows; o++) {
                    double bound = i8t_bound(W + (size_t)o * cols, x + (size_t)t * cols, cols);
                    double ref = want[(size_t)t * rows + o], d = fabs(got[(size_t)t * rows + o] - ref);
                    if (!(d <= bound * 1.001 + 1e-4 * (fabs(ref) + 1.0)))
                        fail_msg("%s n=%d on %s: token %d row %d off by %.3g > bound %.3g", s->name, n, r->label, t, o, d, bound);
                }
        }
        r->be->buf_free(r->b, xb);
        r->be->buf_free(r->b, yb);
        r->be->weight_free(r->b, wt);
        free(x), free(W), free(want), free(got);
        free_weight(&w);
    }
    if (int8) print_message("%s: int8 tiles rel L2 %.2e..%.2e, every output within the bound\n", r->label, best, worst);
}

static void test_tiles(void **state) {
    (void)state;
    inst r;
    if (!start(&r, 0, NULL, "vulkan")) skip();
    int int8 = r.b->caps.int_dot;
    if (!int8) print_message("no integer dot products on this device: the f32 tiles must serve\n");
    run_all(&r, int8, shapes, COUNT(shapes), ns, COUNT(ns));
    r.be->release(r.b);
    /* a weight cut into row pieces (row0 > 0 in the tiles) */
    if (!start(&r, 0, SPLIT_MAX_BUFFER, "vulkan(split)")) skip();
    run_all(&r, int8, split_shapes, COUNT(split_shapes), split_ns, COUNT(split_ns));
    r.be->release(r.b);
}

/* Opened exact (--exact, kvq_model_params.exact): the f32 tiles, whatever the device has. */
static void test_exact(void **state) {
    (void)state;
    inst r;
    if (!start(&r, 1, NULL, "vulkan(exact)")) skip();
    run_all(&r, 0, shapes, COUNT(shapes), ns, COUNT(ns));
    r.be->release(r.b);
}
#else
static void test_tiles(void **state) {
    (void)state;
    print_message("built without Vulkan\n");
    skip();
}
static void test_exact(void **state) { test_tiles(state); }
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiles),
        cmocka_unit_test(test_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
