/* Small batches (1-16 tokens) through the int8-codeword kernels of 1x16
 * AQLM (--aqlm-i8; src/cpu/aqlm/aqlm_i8*.c), issue 34: each ISA's kernel
 * against the scalar spec for every batch size it takes, every output within
 * the activations' stated bound of the int8 weights, and a token's outputs
 * the same bits in a batch of any size as alone (speculative verification
 * relies on it). Awkward shapes: odd group counts, a short last step, g16,
 * 12-bit codes. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "util.h"

static uint64_t rng = 0x18b34;

enum { NMAX = 16 };

typedef struct {
    kvq_weight_desc d;
    void *codes, *cb, *scales;
} wmade;

static void make_i8(wmade *w, int rows, int cols, int nbits, int ig) {
    size_t K = (size_t)1 << nbits, n_codes = (size_t)rows * (size_t)(cols / ig);
    w->codes = malloc(n_codes * 2);
    w->cb = malloc(K * (size_t)ig * 2);
    w->scales = malloc((size_t)rows * 2);
    assert_true(w->codes && w->cb && w->scales);
    for (size_t i = 0; i < n_codes; i++) ((uint16_t *)w->codes)[i] = (uint16_t)(tu_randf(&rng) * 65535.0f) & (K - 1);
    for (size_t i = 0; i < K * (size_t)ig; i++) ((uint16_t *)w->cb)[i] = kvq_f32_to_f16(tu_randf(&rng) - 0.5f);
    for (int o = 0; o < rows; o++) ((uint16_t *)w->scales)[o] = kvq_f32_to_f16(0.5f + tu_randf(&rng));
    w->d = (kvq_weight_desc){.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = 1, .nbits = nbits,
                             .in_group = ig, .code_bytes = 2, .codes = w->codes, .codebooks = w->cb,
                             .scales = w->scales, .name = "i8batch.weight", .i8 = 1};
}

static void wmade_free(wmade *w) {
    free(w->codes);
    free(w->cb);
    free(w->scales);
}

/* Random activations with outliers, so the 32-value block scales differ. */
static void fill_x(float *x, size_t n) {
    tu_rand_fill(x, n, &rng);
    for (size_t i = 0; i < n; i += 29) x[i] *= 25.0f;
}

typedef struct {
    const char *name;
    kvq_i8_gemv_fn fn;
    int max_t;
} kern;

static int kernels_here(kern *k) {
    int n = 0;
#if defined(__x86_64__)
    if (kvq_cpu_isa_available(KVQ_ISA_AVX2)) k[n++] = (kern){"avx2", kvq_aqlm_i8_gemv_avx2, KVQ_GEMV_MAX_T};
    if (kvq_cpu_isa_available(KVQ_ISA_AVX512) && kvq_cpu_has_vnni())
        k[n++] = (kern){"vnni", kvq_aqlm_i8_gemv_vnni, KVQ_I8_VNNI_MAX_T};
#if defined(KVQ_HAVE_AVXVNNI)
    if (kvq_cpu_has_avxvnni()) k[n++] = (kern){"avxvnni", kvq_aqlm_i8_gemv_avxvnni, KVQ_GEMV_MAX_T};
#endif
#endif
#if defined(__aarch64__)
    if (kvq_cpu_isa_available(KVQ_ISA_NEON))
        k[n++] = (kern){"neon", kvq_aqlm_i8_gemv_neon, KVQ_GEMV_MAX_T};
#endif
    return n;
}

/* Each SIMD kernel on n = 1..its most tokens at once, rows split into odd
 * ranges, against the scalar spec (1e-5 of the output's scale: the SIMD sums
 * go in another order); and the spec against the int8 weights in f64 within
 * |r_o| sum_g |q_c s_c|_1 d_b / 2 (the activations' rounding). */
static void check_kernels(const wmade *w, const char *what) {
    int rows = w->d.rows, cols = w->d.cols;
    kvq_cpu_weight *cw = kvq_cpu_weight_new(&w->d);
    if (!cw) fail_msg("%s: weight_new failed: %s", what, kvq_last_error());
    assert_non_null(cw->cbq);
    float *x = malloc(sizeof(float) * NMAX * cols), *ys = malloc(sizeof(float) * NMAX * rows);
    float *y = malloc(sizeof(float) * NMAX * rows);
    void *buf = kvq_alloc_aligned(kvq_i8_act_bytes(cols, NMAX));
    assert_true(x && ys && y && buf);
    fill_x(x, (size_t)NMAX * cols);
    kvq_i8_act a = kvq_i8_act_at(buf, cols, NMAX);
    kvq_i8_quantize(&a, x, cols, 0, NMAX);
    a.cb_prefetch = 0;
    kvq_aqlm_i8_gemv_scalar(cw, &a, NMAX, ys, (size_t)rows, 0, rows);
    /* the spec within the activations' bound of the int8 weights */
    int ig = cw->ig, G = cw->G, nb = a.cols_pad / 32;
    for (int t = 0; t < NMAX; t++)
        for (int o = 0; o < rows; o++) {
            double exact = 0.0, bound = 0.0;
            for (int g = 0; g < G; g++) {
                unsigned c = ((const uint16_t *)cw->codes)[(size_t)o * G + g];
                double s = cw->cbq_cls[c >> cw->cbq_shift], db = a.d[(size_t)t * nb + (size_t)(g * ig / 32)];
                for (int j = 0; j < ig; j++) {
                    double v = cw->cbq[(size_t)c * ig + j] * s;
                    exact += v * x[(size_t)t * cols + (size_t)g * ig + (size_t)j];
                    bound += fabs(v) * db / 2.0;
                }
            }
            double r = fabs(cw->scales[o]), got = ys[(size_t)t * rows + o];
            exact *= cw->scales[o];
            if (!(fabs(got - exact) <= r * bound * 1.001 + 1e-5 * (fabs(exact) + 1.0)))
                fail_msg("%s: spec token %d row %d off by %.3g > bound %.3g", what, t, o, fabs(got - exact), r * bound);
        }
    kern ks[4];
    int nk = kernels_here(ks);
    for (int i = 0; i < nk; i++)
        for (int n = 1; n <= ks[i].max_t; n++)
            for (int t0 = 0; t0 + n <= NMAX; t0 += 5) {
                kvq_i8_act at = kvq_i8_act_token(&a, t0);
                int mid = rows / 3 + n % 2; /* two calls, the split off any multiple */
                memset(y, 0xff, sizeof(float) * (size_t)n * rows);
                ks[i].fn(cw, &at, n, y, (size_t)rows, 0, mid);
                ks[i].fn(cw, &at, n, y, (size_t)rows, mid, rows);
                double num = 0.0, den = 0.0;
                for (int t = 0; t < n; t++)
                    for (int o = 0; o < rows; o++) {
                        double d = y[(size_t)t * rows + o] - ys[(size_t)(t0 + t) * rows + o];
                        num += d * d, den += (double)ys[(size_t)(t0 + t) * rows + o] * ys[(size_t)(t0 + t) * rows + o];
                    }
                if (!(sqrt(num) <= 1e-5 * sqrt(den)))
                    fail_msg("%s kernel=%s n=%d from token %d: rel L2 to the spec %.3g", what, ks[i].name, n, t0,
                             sqrt(num / den));
                /* AVX-VNNI's vpdpwssd forms the AVX2 kernel's int32 sums: the same bits */
                if (!strcmp(ks[i].name, "avxvnni")) {
                    float *y2 = malloc(sizeof(float) * (size_t)n * rows);
                    assert_non_null(y2);
                    kvq_aqlm_i8_gemv_avx2(cw, &at, n, y2, (size_t)rows, 0, rows);
                    if (memcmp(y, y2, sizeof(float) * (size_t)n * rows))
                        fail_msg("%s n=%d: the avxvnni kernel's outputs differ from avx2's", what, n);
                    free(y2);
                }
            }
    kvq_free_aligned(buf);
    free(x), free(y), free(ys);
    kvq_cpu_weight_free(cw);
}

/* Through the dispatcher on every ISA here: n = 2..16 tokens at once on 1..3
 * threads give each token the bits it gets alone. */
static void check_invariant(const wmade *w, const char *what) {
    int rows = w->d.rows, cols = w->d.cols;
    float *x = malloc(sizeof(float) * NMAX * cols), *alone = malloc(sizeof(float) * NMAX * rows);
    float *y = malloc(sizeof(float) * NMAX * rows);
    assert_true(x && alone && y);
    fill_x(x, (size_t)NMAX * cols);
    kvq_isa saved = kvq_cpu_isa();
    for (int isa = KVQ_ISA_SCALAR; isa <= KVQ_ISA_NEON; isa++) {
        if (!kvq_cpu_isa_available((kvq_isa)isa)) continue;
        kvq_cpu_set_isa((kvq_isa)isa);
        kvq_cpu_weight *cw = kvq_cpu_weight_new(&w->d);
        if (!cw) fail_msg("%s: weight_new failed: %s", what, kvq_last_error());
        for (int t = 0; t < NMAX; t++) kvq_cpu_matmul(cw, x + (size_t)t * cols, alone + (size_t)t * rows, 1, 1 + t % 2);
        for (int n = 2; n <= NMAX; n++) {
            int nt = 1 + n % 3;
            memset(y, 0xff, sizeof(float) * (size_t)n * rows);
            kvq_cpu_matmul(cw, x, y, n, nt);
            tu_same_as_alone(y, alone, n, rows, what, kvq_isa_name((kvq_isa)isa), nt);
        }
        kvq_cpu_weight_free(cw);
    }
    kvq_cpu_set_isa(saved);
    free(x), free(alone), free(y);
}

static void test_i8_batches(void **state) {
    (void)state;
    static const struct {
        int rows, cols, nbits, ig;
        const char *what;
    } shapes[] = {
        {37, 13 * 8, 16, 8, "1x16 37x104"},       /* 13 groups: a short last step */
        {70, 13 * 16, 16, 16, "1x16g16 70x208"},  /* g16, odd group count */
        {40, 96, 12, 8, "1x12 40x96"},            /* 12-bit codes */
        {301, 1032, 16, 8, "1x16 301x1032"},      /* several row blocks, 1032 = 16 * 64 + 8 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        wmade w;
        make_i8(&w, shapes[i].rows, shapes[i].cols, shapes[i].nbits, shapes[i].ig);
        check_kernels(&w, shapes[i].what);
        check_invariant(&w, shapes[i].what);
        wmade_free(&w);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_i8_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
