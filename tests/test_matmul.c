/* CPU matmul (dense and AQLM) against the scalar reference, for every ISA
 * this machine has; plus a hand-worked AQLM example for the reference itself
 * and the errors for shapes the CPU path does not take. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "ref/ref.h"
#include "util.h"

/* Checkpoint tensors come from an mmap with no alignment promise: every test
 * buffer starts one byte past a malloc'd block, so misaligned reads trip UBSan. */
typedef struct {
    char *block;
    void *p;
} ubuf;

static ubuf ubuf_new(size_t bytes) {
    ubuf b;
    b.block = calloc(1, bytes + 1);
    assert_non_null(b.block);
    b.p = b.block + 1;
    return b;
}

static void put_u16(void *p, size_t i, uint16_t v) { memcpy((char *)p + 2 * i, &v, 2); }
static void put_f32(void *p, size_t i, float v) { memcpy((char *)p + 4 * i, &v, 4); }
static uint16_t f32_to_bf16(float f) { /* truncation is fine: the test only needs some bf16 values */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* Every kernel path this machine can run: each ISA, AVX2 with gathers and
 * with plain loads for the lookups, and AVX-512 without the VBMI lookup
 * kernels, with f32 tables and with int16 tables, with AMX tiles for batches
 * where the CPU has them and once without. Returns 0 past the last; sets it
 * up otherwise. */
typedef struct {
    kvq_isa isa;
    int vbmi, amx, loads;
} path;

static int path_get(int i, path *p) {
    for (int isa = KVQ_ISA_SCALAR; isa <= KVQ_ISA_NEON; isa++) {
        if (!kvq_cpu_isa_available((kvq_isa)isa)) continue;
        int variants = isa == KVQ_ISA_AVX512 ? (kvq_cpu_has_vbmi() ? 3 : 1) + kvq_cpu_has_amx()
                       : isa == KVQ_ISA_AVX2 ? 2
                                             : 1;
        for (int v = 0; v < variants; v++, i--)
            if (i == 0) {
                p->isa = (kvq_isa)isa;
                p->amx = isa == KVQ_ISA_AVX512 && kvq_cpu_has_amx() && v < variants - 1;
                p->vbmi = isa != KVQ_ISA_AVX512 || !kvq_cpu_has_vbmi() ? 0 : v < 3 ? v : 2;
                p->loads = isa == KVQ_ISA_AVX2 && v == 1;
                kvq_cpu_set_isa(p->isa);
                kvq_cpu_set_vbmi(p->vbmi);
                kvq_cpu_set_amx(p->amx);
                kvq_cpu_set_avx2_lut(p->loads ? 2 : 1);
                kvq_cpu_set_avxvnni(!p->loads); /* the AVX2 int8 kernels with AVX-VNNI (where the CPU has it) and without */
                return 1;
            }
    }
    return 0;
}

/* Back to the ISA the test started with and every path setting to its default. */
static void path_reset(kvq_isa saved) {
    kvq_cpu_set_isa(saved);
    kvq_cpu_set_vbmi(2);
    kvq_cpu_set_amx(1);
    kvq_cpu_set_avx2_lut(0);
    kvq_cpu_set_avxvnni(1);
}

static const char *path_name(const path *p) {
    static const char *names[2][3] = {{"avx512", "avx512+vbmi-f32", "avx512+vbmi-i16"},
                                      {"avx512+amx", "avx512+vbmi-f32+amx", "avx512+vbmi-i16+amx"}};
    if (p->isa == KVQ_ISA_AVX2) return p->loads ? "avx2-loads" : kvq_cpu_has_avxvnni() ? "avx2-gathers+avxvnni" : "avx2-gathers";
    return p->isa == KVQ_ISA_AVX512 ? names[p->amx][p->vbmi] : kvq_isa_name(p->isa);
}

/* Tolerance of a path against the f32 reference: int16 LUTs (8-bit AQLM
 * codes; up to 39 tokens with AMX, any number without) and AMX tiles (16
 * tokens or more) have their stated bounds, everything else f32 rounding. */
static int quantized_tables(const path *p, const kvq_weight_desc *d, int n) {
    return p->vbmi == 2 && d->fmt == KVQ_W_AQLM && d->nbits == 8 && (n < 40 || !p->amx);
}
static double path_tol(const path *p, const kvq_weight_desc *d, int n) {
    if (quantized_tables(p, d, n)) return KVQ_LUT_I16_REL_L2;
    if (p->amx && n >= 16) return KVQ_AMX_REL_L2;
    return 1e-5;
}

/* kvq_cpu_matmul of w on the current path with nt threads, y filled with NaN
 * first (catches rows never written); returns the weight for more checks. */
static kvq_cpu_weight *path_matmul(const kvq_weight_desc *d, const float *x, float *y, int n, int nt, const char *what) {
    kvq_cpu_weight *cw = kvq_cpu_weight_new(d);
    if (!cw) fail_msg("%s: weight_new failed: %s", what, kvq_last_error());
    memset(y, 0xff, sizeof(float) * (size_t)n * d->rows);
    kvq_cpu_matmul(cw, x, y, n, nt);
    return cw;
}

/* ---- hand-worked example: 2 rows x 16 cols, M=2, 8-bit codes, in_group 8 ---- */

static const float tiny_expected[2][16] = {
    /* row 0, scale 2: g0 = cb0[1] + cb1[0], g1 = cb0[255] + cb1[3] (code -1 = 255) */
    {0, 2, 4, 6, 12, 14, 16, 18, 1.5f, -0.5f, 2.5f, -1.5f, 5, -3, 9, -7},
    /* row 1, scale 0.5: g0 = cb0[0] + cb1[3], g1 = cb0[1] + cb1[0] */
    {0.125f, 0.125f, 0.125f, 0.125f, 0.25f, 0.25f, 0.25f, 0.25f, 0, 0.5f, 1, 1.5f, 3, 3.5f, 4, 4.5f},
};

typedef struct {
    kvq_weight_desc d;
    ubuf codes, cb, scales, bias, data;
} wdesc;

static void wdesc_free(wdesc *w) {
    free(w->codes.block);
    free(w->cb.block);
    free(w->scales.block);
    free(w->bias.block);
    free(w->data.block);
}

static void tiny_make(wdesc *w, int code_bytes) {
    memset(w, 0, sizeof *w);
    static const float cb0_1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, cb0_255[8] = {0.5f, -0.5f, 1, -1, 2, -2, 4, -4};
    static const float cb1_0[8] = {-1, -1, -1, -1, 1, 1, 1, 1}, cb1_3[8] = {0.25f, 0.25f, 0.25f, 0.25f, 0.5f, 0.5f, 0.5f, 0.5f};
    w->cb = ubuf_new(2 * 256 * 8 * 2); /* zero = fp16 +0 */
    for (int j = 0; j < 8; j++) {
        put_u16(w->cb.p, (0 * 256 + 1) * 8 + j, kvq_f32_to_f16(cb0_1[j]));
        put_u16(w->cb.p, (0 * 256 + 255) * 8 + j, kvq_f32_to_f16(cb0_255[j]));
        put_u16(w->cb.p, (1 * 256 + 0) * 8 + j, kvq_f32_to_f16(cb1_0[j]));
        put_u16(w->cb.p, (1 * 256 + 3) * 8 + j, kvq_f32_to_f16(cb1_3[j]));
    }
    static const int codes[2][2][2] = {{{1, 0}, {-1, 3}}, {{0, 3}, {1, 0}}};
    w->codes = ubuf_new(8 * (size_t)code_bytes);
    for (int i = 0; i < 8; i++) {
        int c = (&codes[0][0][0])[i];
        if (code_bytes == 1) {
            int8_t v = (int8_t)c;
            memcpy((char *)w->codes.p + i, &v, 1);
        } else {
            put_u16(w->codes.p, (size_t)i, (uint16_t)(int16_t)c);
        }
    }
    w->scales = ubuf_new(4);
    put_u16(w->scales.p, 0, kvq_f32_to_f16(2.0f));
    put_u16(w->scales.p, 1, kvq_f32_to_f16(0.5f));
    w->d = (kvq_weight_desc){.fmt = KVQ_W_AQLM, .rows = 2, .cols = 16, .n_codebooks = 2, .nbits = 8, .in_group = 8,
                             .code_bytes = code_bytes, .codes = w->codes.p, .codebooks = w->cb.p,
                             .scales = w->scales.p, .name = "tiny.weight"};
}

static void test_ref_tiny_aqlm(void **state) {
    (void)state;
    path pa;
    kvq_isa saved0 = kvq_cpu_isa();
    for (int pi = 0; path_get(pi, &pa); pi++) print_message("kernel path: %s\n", path_name(&pa));
    path_reset(saved0);
    for (int cb = 1; cb <= 2; cb++) {
        wdesc w;
        tiny_make(&w, cb);
        float W[2][16], row[16];
        kvq_ref_weight_dequant(&w.d, &W[0][0]);
        for (int o = 0; o < 2; o++) {
            for (int k = 0; k < 16; k++) assert_true(W[o][k] == tiny_expected[o][k]);
            kvq_ref_weight_row(&w.d, o, row);
            assert_memory_equal(row, W[o], sizeof row);
        }
        /* y = W·x with x = e_k + 1: exact in f32 as well */
        float x[16], y[2];
        for (int k = 0; k < 16; k++) x[k] = (float)(k % 3);
        kvq_ref_matmul(&w.d, x, y, 1);
        for (int o = 0; o < 2; o++) {
            float e = 0;
            for (int k = 0; k < 16; k++) e += tiny_expected[o][k] * x[k];
            assert_true(y[o] == e);
        }
        /* and the CPU path on every ISA */
        kvq_isa saved = kvq_cpu_isa();
        for (int pi = 0; path_get(pi, &pa); pi++) {
            kvq_cpu_weight *cw = kvq_cpu_weight_new(&w.d);
            assert_non_null(cw);
            float yc[2];
            kvq_cpu_matmul(cw, x, yc, 1, 1);
            if (pa.vbmi == 2) /* int16 tables: within their bound, not exact */
                assert_true(tu_rel_l2(yc, y, 2) <= KVQ_LUT_I16_REL_L2);
            else
                assert_true(yc[0] == y[0] && yc[1] == y[1]);
            for (int o = 0; o < 2; o++) {
                kvq_cpu_weight_row(cw, o, row);
                assert_memory_equal(row, tiny_expected[o], sizeof row);
            }
            kvq_cpu_weight_free(cw);
        }
        path_reset(saved);
        wdesc_free(&w);
    }
}

/* ---- random weights ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rand_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static void make_bias(wdesc *w, int with_bias) {
    if (!with_bias) return;
    static const kvq_wformat fmts[] = {KVQ_W_F32, KVQ_W_F16, KVQ_W_BF16};
    kvq_wformat f = fmts[rand_u32() % 3];
    w->bias = ubuf_new((size_t)w->d.rows * 4);
    for (int o = 0; o < w->d.rows; o++) {
        float v = tu_randf(&rng);
        if (f == KVQ_W_F32) put_f32(w->bias.p, (size_t)o, v);
        else put_u16(w->bias.p, (size_t)o, f == KVQ_W_F16 ? kvq_f32_to_f16(v) : f32_to_bf16(v));
    }
    w->d.bias = w->bias.p;
    w->d.bias_fmt = f;
}

static void make_dense(wdesc *w, kvq_wformat f, int rows, int cols, int with_bias) {
    memset(w, 0, sizeof *w);
    size_t n = (size_t)rows * cols;
    w->data = ubuf_new(n * 4);
    for (size_t i = 0; i < n; i++) {
        float v = tu_randf(&rng);
        if (f == KVQ_W_F32) put_f32(w->data.p, i, v);
        else put_u16(w->data.p, i, f == KVQ_W_F16 ? kvq_f32_to_f16(v) : f32_to_bf16(v));
    }
    w->d = (kvq_weight_desc){.fmt = f, .rows = rows, .cols = cols, .data = w->data.p, .name = "dense.weight"};
    make_bias(w, with_bias);
}

static void make_aqlm(wdesc *w, int rows, int cols, int M, int nbits, int ig, int code_bytes, int with_bias) {
    memset(w, 0, sizeof *w);
    size_t K = (size_t)1 << nbits, n_codes = (size_t)rows * (cols / ig) * M;
    w->codes = ubuf_new(n_codes * (size_t)code_bytes);
    for (size_t i = 0; i < n_codes; i++) { /* full 8/16-bit range: negative int16 values included */
        uint32_t c = rand_u32();
        if (code_bytes == 1) ((uint8_t *)w->codes.p)[i] = (uint8_t)c;
        else put_u16(w->codes.p, i, (uint16_t)c);
    }
    w->cb = ubuf_new((size_t)M * K * ig * 2);
    for (size_t i = 0; i < (size_t)M * K * ig; i++) put_u16(w->cb.p, i, kvq_f32_to_f16(tu_randf(&rng)));
    w->scales = ubuf_new((size_t)rows * 2);
    for (int o = 0; o < rows; o++) put_u16(w->scales.p, (size_t)o, kvq_f32_to_f16(0.5f + tu_randf(&rng)));
    w->d = (kvq_weight_desc){.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = M, .nbits = nbits,
                             .in_group = ig, .code_bytes = code_bytes, .codes = w->codes.p,
                             .codebooks = w->cb.p, .scales = w->scales.p, .name = "aqlm.weight",
                             .exact = 1}; /* the int8 tiles for batches have their own test (test_i8tile) */
    make_bias(w, with_bias);
}

/* kvq_cpu_matmul on every ISA and several batch sizes against kvq_ref_matmul. */
static void check_weight(const wdesc *w, const int *ns, int n_ns, const char *what) {
    int rows = w->d.rows, cols = w->d.cols, n_max = 0;
    for (int i = 0; i < n_ns; i++) n_max = ns[i] > n_max ? ns[i] : n_max;
    float *x = malloc(sizeof(float) * (size_t)n_max * cols);
    float *y = malloc(sizeof(float) * (size_t)n_max * rows), *yr = malloc(sizeof(float) * (size_t)n_max * rows);
    float *row = malloc(sizeof(float) * (size_t)cols), *row_ref = malloc(sizeof(float) * (size_t)cols);
    assert_true(x && y && yr && row && row_ref);
    tu_rand_fill(x, (size_t)n_max * cols, &rng);
    kvq_isa saved = kvq_cpu_isa();
    for (int i = 0; i < n_ns; i++) {
        int n = ns[i];
        kvq_ref_matmul(&w->d, x, yr, n);
        path pa;
        for (int pi = 0; path_get(pi, &pa); pi++) {
            int nt = 1 + (i + pi) % 3; /* 1..3 threads: uneven splits too */
            kvq_cpu_weight *cw = path_matmul(&w->d, x, y, n, nt, what);
            assert_int_equal(kvq_cpu_weight_rows(cw), rows);
            assert_int_equal(kvq_cpu_weight_cols(cw), cols);
            assert_true(kvq_cpu_weight_bytes(cw) > 0);
            double e = tu_rel_l2(y, yr, (size_t)n * rows), tol = path_tol(&pa, &w->d, n);
            if (!(e <= tol))
                fail_msg("%s n=%d path=%s threads=%d: rel L2 %.3g > %.1g", what, n, path_name(&pa), nt, e, tol);
            if (tol > 1e-5) print_message("%s n=%d path=%s: rel L2 %.2e (bound %.0e)\n", what, n, path_name(&pa), e, tol);
            if (i == 0) {
                for (int o = 0; o < rows; o += rows > 7 ? 7 : 1) {
                    kvq_cpu_weight_row(cw, o, row);
                    kvq_ref_weight_row(&w->d, o, row_ref);
                    e = tu_rel_l2(row, row_ref, (size_t)cols);
                    if (!(e <= 1e-6)) fail_msg("%s row %d path=%s: rel L2 %.3g", what, o, path_name(&pa), e);
                }
            }
            kvq_cpu_weight_free(cw);
        }
    }
    path_reset(saved);
    free(x);
    free(y);
    free(yr);
    free(row);
    free(row_ref);
}

static const int batch_sizes[] = {1, 3, 17, 45};

static void test_dense(void **state) {
    (void)state;
    static const kvq_wformat fmts[] = {KVQ_W_F32, KVQ_W_F16, KVQ_W_BF16};
    static const int shapes[][2] = {{1, 5}, {37, 67}, {13, 96}, {1, 300}};
    for (int f = 0; f < 3; f++)
        for (int s = 0; s < 4; s++) {
            wdesc w;
            make_dense(&w, fmts[f], shapes[s][0], shapes[s][1], (f + s) % 2);
            char what[96];
            snprintf(what, sizeof what, "dense fmt=%d %dx%d bias=%d", (int)fmts[f], shapes[s][0], shapes[s][1],
                     w.d.bias != NULL);
            check_weight(&w, batch_sizes, 4, what);
            wdesc_free(&w);
        }
}

static void test_aqlm_shapes(void **state) {
    (void)state;
    static const int Ms[] = {1, 2, 3}, nbits[] = {8, 12, 16}, igs[] = {8, 16};
    int k = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++, k++) {
                int ig = igs[c], cb = nbits[b] > 8 ? 2 : 1 + (k % 4 == 0); /* int16 codes for 8 bits now and then */
                wdesc w;
                make_aqlm(&w, 37, 13 * ig, Ms[a], nbits[b], ig, cb, k % 2);
                char what[96];
                snprintf(what, sizeof what, "aqlm M=%d nbits=%d ig=%d code_bytes=%d bias=%d", Ms[a], nbits[b], ig, cb,
                         k % 2);
                check_weight(&w, batch_sizes, 4, what);
                wdesc_free(&w);
            }
    wdesc w; /* 8x8 (the catalog's Llama-2-7b): the table kernels of 2x8, eight steps per group */
    make_aqlm(&w, 70, 13 * 8, 8, 8, 8, 1, 0);
    check_weight(&w, batch_sizes, 4, "aqlm 8x8 70x104");
    wdesc_free(&w);
}

/* Big enough that the row and group splits across threads are really used. */
static void test_threaded(void **state) {
    (void)state;
    static const int ns[] = {1, 2, 5, 20};
    wdesc w;
    make_aqlm(&w, 301, 1024, 2, 8, 8, 1, 1); /* 2x8 */
    check_weight(&w, ns, 4, "aqlm 2x8 301x1024");
    wdesc_free(&w);
    make_aqlm(&w, 301, 1000, 3, 8, 8, 1, 0); /* odd M: group pairs per thread, table chunks with a remainder */
    check_weight(&w, ns, 4, "aqlm 3x8 301x1000");
    wdesc_free(&w);
    make_aqlm(&w, 301, 1024, 1, 16, 8, 2, 0); /* 1x16 */
    check_weight(&w, ns, 4, "aqlm 1x16 301x1024");
    wdesc_free(&w);
    make_dense(&w, KVQ_W_F16, 301, 1000, 1);
    check_weight(&w, ns, 4, "dense f16 301x1000");
    wdesc_free(&w);
}

/* The opt-in int8 codebook (desc cb8, one codebook of 9..16-bit codes):
 * every path equals the scalar kernels on the int8 weights (f32 rounding
 * only; AMX its own bound), rows are bit-identical across paths, and the
 * whole stays within KVQ_CB8_REL_L2 of the fp16 weights while differing from
 * them (so the int8 codebook is really in use). Two codebooks ignore cb8. */
static void check_cb8(wdesc *w, const char *what) {
    static const int ns[] = {1, 3, 17, 45};
    int rows = w->d.rows, cols = w->d.cols, nmax = 45;
    float *x = malloc(sizeof(float) * (size_t)nmax * cols), *y = malloc(sizeof(float) * (size_t)nmax * rows);
    float *ys = malloc(sizeof(float) * (size_t)nmax * rows), *yr = malloc(sizeof(float) * (size_t)nmax * rows);
    float *row = malloc(sizeof(float) * (size_t)cols), *row_s = malloc(sizeof(float) * (size_t)cols * rows);
    assert_true(x && y && ys && yr && row && row_s);
    tu_rand_fill(x, (size_t)nmax * cols, &rng);
    kvq_isa saved = kvq_cpu_isa();
    w->d.cb8 = 1;
    for (int i = 0; i < 4; i++) {
        int n = ns[i];
        kvq_ref_matmul(&w->d, x, yr, n);
        path pa;
        for (int pi = 0; path_get(pi, &pa); pi++) {
            int nt = 1 + (i + pi) % 3;
            kvq_cpu_weight *cw = path_matmul(&w->d, x, y, n, nt, what);
            double e_ref = tu_rel_l2(y, yr, (size_t)n * rows);
            if (w->d.n_codebooks > 1) {
                if (!(e_ref <= 1e-5)) fail_msg("%s n=%d path=%s: cb8 with M > 1 moved the result (%.3g)", what, n, path_name(&pa), e_ref);
            } else if (!(e_ref <= KVQ_CB8_REL_L2 && e_ref > 1e-6)) {
                fail_msg("%s n=%d path=%s: rel L2 to the fp16 weights %.3g, not in (1e-6, %.0e]", what, n, path_name(&pa), e_ref,
                         KVQ_CB8_REL_L2);
            }
            if (pi == 0) { /* the scalar path: the spec for the int8 weights */
                memcpy(ys, y, sizeof(float) * (size_t)n * rows);
                for (int o = 0; o < rows; o++) kvq_cpu_weight_row(cw, o, row_s + (size_t)o * cols);
            } else {
                double e = tu_rel_l2(y, ys, (size_t)n * rows), tol = pa.amx && n >= 16 ? KVQ_AMX_REL_L2 : 1e-5;
                if (!(e <= tol)) fail_msg("%s n=%d path=%s threads=%d: rel L2 to scalar %.3g > %.1g", what, n, path_name(&pa), nt, e, tol);
                for (int o = 0; o < rows; o++) {
                    kvq_cpu_weight_row(cw, o, row);
                    if (memcmp(row, row_s + (size_t)o * cols, sizeof(float) * (size_t)cols))
                        fail_msg("%s path=%s: row %d differs from the scalar path", what, path_name(&pa), o);
                }
            }
            if (i == 0 && n == 1 && pi == 0) print_message("%s: rel L2 to the fp16 weights %.2e\n", what, e_ref);
            kvq_cpu_weight_free(cw);
        }
    }
    path_reset(saved);
    free(x), free(y), free(ys), free(yr), free(row), free(row_s);
}

static void test_cb8(void **state) {
    (void)state;
    wdesc w;
    make_aqlm(&w, 37, 13 * 8, 1, 16, 8, 2, 1); /* odd group count: the 8-value tail */
    check_cb8(&w, "cb8 1x16 37x104");
    wdesc_free(&w);
    make_aqlm(&w, 70, 13 * 16, 1, 16, 16, 2, 0); /* g16 */
    check_cb8(&w, "cb8 1x16g16 70x208");
    wdesc_free(&w);
    make_aqlm(&w, 40, 96, 1, 12, 8, 2, 0); /* 12-bit codes */
    check_cb8(&w, "cb8 1x12 40x96");
    wdesc_free(&w);
    make_aqlm(&w, 301, 1024, 1, 16, 8, 2, 0); /* several threads */
    check_cb8(&w, "cb8 1x16 301x1024");
    wdesc_free(&w);
    make_aqlm(&w, 37, 64, 2, 16, 8, 2, 0); /* two codebooks: cb8 ignored */
    check_cb8(&w, "cb8 2x16 37x64");
    wdesc_free(&w);
}

/* The opt-in int8 tables (desc lut8, 8-bit codes): on the VBMI int16-table
 * paths (decode, and prompts where AMX does not take them) every output
 * stays within the stated bound, scale_o * S * max|T| / 254 for S steps with
 * max|T| over all of the token's tables (the kernels' scales, per chunk or
 * per token, are never coarser), and the error is larger than int16 tables
 * allow (the int8 tables are really in use); every other path ignores lut8. */
static void check_lut8(wdesc *w, const char *what) {
    static const int ns[] = {1, 3, 17, 45};
    int rows = w->d.rows, cols = w->d.cols, M = w->d.n_codebooks, ig = w->d.in_group, G = cols / ig, nmax = 45;
    float *x = malloc(sizeof(float) * (size_t)nmax * cols), *y = malloc(sizeof(float) * (size_t)nmax * rows);
    float *yr = malloc(sizeof(float) * (size_t)nmax * rows), *tmax = malloc(sizeof(float) * (size_t)nmax);
    assert_true(x && y && yr && tmax);
    tu_rand_fill(x, (size_t)nmax * cols, &rng);
    for (int t = 0; t < nmax; t++) { /* max |T| of token t's tables */
        float mx = 0.0f;
        for (int g = 0; g < G; g++)
            for (int m = 0; m < M; m++)
                for (int c = 0; c < 256; c++) {
                    float v = 0.0f;
                    for (int j = 0; j < ig; j++)
                        v += kvq_f16_to_f32(kvq_rd_u16(w->d.codebooks, ((size_t)m * 256 + c) * ig + j)) *
                             x[(size_t)t * cols + (size_t)g * ig + j];
                    mx = fabsf(v) > mx ? fabsf(v) : mx;
                }
        tmax[t] = mx;
    }
    kvq_isa saved = kvq_cpu_isa();
    w->d.lut8 = 1;
    int used = 0;
    for (int i = 0; i < 4; i++) {
        int n = ns[i];
        kvq_ref_matmul(&w->d, x, yr, n);
        path pa;
        for (int pi = 0; path_get(pi, &pa); pi++) {
            int nt = 1 + (i + pi) % 3;
            kvq_cpu_weight *cw = path_matmul(&w->d, x, y, n, nt, what);
            double e = tu_rel_l2(y, yr, (size_t)n * rows);
            if (quantized_tables(&pa, &w->d, n)) {
                used++;
                if (!(e <= KVQ_LUT_I8_REL_L2 && e > KVQ_LUT_I16_REL_L2))
                    fail_msg("%s n=%d path=%s threads=%d: rel L2 %.3g, not in (%.0e, %.0e]", what, n, path_name(&pa), nt,
                             e, KVQ_LUT_I16_REL_L2, KVQ_LUT_I8_REL_L2);
                for (int t = 0; t < n; t++)
                    for (int o = 0; o < rows; o++) {
                        double sc = fabs(kvq_f16_to_f32(kvq_rd_u16(w->d.scales, (size_t)o)));
                        double r = yr[(size_t)t * rows + o], d = fabs(y[(size_t)t * rows + o] - r);
                        double bound = sc * G * M * tmax[t] / 254.0 * 1.01 + 1e-4 * (fabs(r) + 1.0);
                        if (!(d <= bound))
                            fail_msg("%s n=%d path=%s: token %d row %d off by %.3g > bound %.3g", what, n, path_name(&pa), t,
                                     o, d, bound);
                    }
                if (i == 0) print_message("%s n=%d path=%s: rel L2 %.2e (bound %.0e)\n", what, n, path_name(&pa), e,
                                          KVQ_LUT_I8_REL_L2);
            } else if (!(e <= path_tol(&pa, &w->d, n))) {
                fail_msg("%s n=%d path=%s: lut8 moved a path without int8 tables (%.3g)", what, n, path_name(&pa), e);
            }
            kvq_cpu_weight_free(cw);
        }
    }
    path_reset(saved);
    if (kvq_cpu_has_vbmi() && !used) fail_msg("%s: no path used the int8 tables", what);
    free(x), free(y), free(yr), free(tmax);
}

static void test_lut8(void **state) {
    (void)state;
    wdesc w;
    make_aqlm(&w, 37, 13 * 8, 2, 8, 8, 1, 1); /* odd group count, bias */
    check_lut8(&w, "lut8 2x8 37x104");
    wdesc_free(&w);
    make_aqlm(&w, 200, 301 * 8, 1, 8, 8, 1, 0); /* 1x8: odd step count, several u16 carries */
    check_lut8(&w, "lut8 1x8 200x2408");
    wdesc_free(&w);
    make_aqlm(&w, 130, 70 * 16, 2, 8, 16, 1, 0); /* g16 */
    check_lut8(&w, "lut8 2x8g16 130x1120");
    wdesc_free(&w);
    make_aqlm(&w, 2100, 600, 2, 8, 8, 1, 0); /* more rows than one block of the prompt kernel */
    check_lut8(&w, "lut8 2x8 2100x600");
    wdesc_free(&w);
}

/* The opt-in int8 codewords (desc i8, one codebook of 9..16-bit codes;
 * aqlm/aqlm_i8.c): every path within KVQ_I8_REL_L2 of the fp16 weights and
 * above int8's floor (the int8 path is really in use), every output within
 * the stated bound |r_o| sum_g (s_c/2 |x_g|_1 + |q_c s_c|_1 d_b/2), computed
 * here from the fp16 codebook (s_c = top * 2^(e-8), top = max|v| / 127, e the
 * least in [0, 8] with max|v| of codeword c's class <= 127 s_c: the
 * codewords in order of (max|v|, code) in KVQ_I8_CLASSES runs of equal size;
 * d_b = max|x_b|/KVQ_I8_AMAX per KVQ_I8_ABLK values), and every SIMD path within f32 rounding
 * of the scalar one (the spec of the scheme). Activations get outliers so
 * block scales differ. Other weights ignore i8. */
static const float *g_mx; /* for by_mx */
static int by_mx(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    return g_mx[i] < g_mx[j] ? -1 : g_mx[i] > g_mx[j] ? 1 : (i > j) - (i < j);
}

static void check_i8(wdesc *w, const char *what) {
    static const int ns[] = {1, 3, 6, 17};
    int rows = w->d.rows, cols = w->d.cols, ig = w->d.in_group, G = cols / ig, nmax = 17, K = 1 << w->d.nbits;
    int used = w->d.n_codebooks == 1;
    float *x = malloc(sizeof(float) * (size_t)nmax * cols), *y = malloc(sizeof(float) * (size_t)nmax * rows);
    float *yr = malloc(sizeof(float) * (size_t)nmax * rows), *ys = malloc(sizeof(float) * (size_t)nmax * rows);
    float *bound = malloc(sizeof(float) * (size_t)nmax * rows), *cs = malloc(sizeof(float) * (size_t)K);
    float *l1 = malloc(sizeof(float) * (size_t)K), *db = malloc(sizeof(float) * (size_t)(cols + 31) / 32);
    assert_true(x && y && yr && ys && bound && cs && l1 && db);
    tu_rand_fill(x, (size_t)nmax * cols, &rng);
    for (size_t i = 0; i < (size_t)nmax * cols; i += 37) x[i] *= 20.0f;
    float *mx = malloc(sizeof(float) * (size_t)K);
    int *order = malloc(sizeof(int) * (size_t)K);
    assert_true(mx && order);
    for (int c = 0; c < K && used; c++) {
        mx[c] = l1[c] = 0.0f, order[c] = c;
        for (int j = 0; j < ig; j++) {
            float v = fabsf(kvq_f16_to_f32(kvq_rd_u16(w->d.codebooks, (size_t)c * ig + j)));
            mx[c] = v > mx[c] ? v : mx[c], l1[c] += v;
        }
    }
    g_mx = mx;
    if (used) qsort(order, (size_t)K, sizeof *order, by_mx);
    float top = used ? mx[order[K - 1]] / 127.0f : 0.0f; /* class scales: top * 2^(e - 8), the least e in [0, 8] that holds */
    for (int n = 0, per = K / KVQ_I8_CLASSES; n < K && used; n++) { /* s_c and |v_c|_1 + ig * s_c / 2 >= |q_c s_c|_1 */
        int c = order[n], e = 0;
        float cm = mx[order[n / per * per + per - 1]];
        while (e < 8 && cm > 127.0f * ldexpf(top, e - 8)) e++;
        cs[c] = ldexpf(top, e - 8);
        l1[c] += (float)ig * cs[c] / 2.0f;
    }
    free(mx), free(order);
    for (int t = 0; t < nmax && used; t++) {
        const float *xt = x + (size_t)t * cols;
        for (int b = 0; b < (cols + 31) / 32; b++) { /* d_b per KVQ_I8_ABLK values, held per 32 */
            float mx = 0.0f;
            int k0 = b * 32 / KVQ_I8_ABLK * KVQ_I8_ABLK;
            for (int k = k0; k < cols && k < k0 + KVQ_I8_ABLK; k++) mx = fabsf(xt[k]) > mx ? fabsf(xt[k]) : mx;
            db[b] = mx / KVQ_I8_AMAX;
        }
        for (int o = 0; o < rows; o++) {
            double e = 0.0;
            for (int g = 0; g < G; g++) {
                uint32_t c = kvq_aqlm_code(&w->d, (size_t)o, (size_t)g, 0);
                double xl1 = 0.0;
                for (int j = 0; j < ig; j++) xl1 += fabs(xt[g * ig + j]);
                e += cs[c] / 2.0 * xl1 + l1[c] * db[g * ig / 32] / 2.0;
            }
            bound[(size_t)t * rows + o] = (float)(e * fabs(kvq_f16_to_f32(kvq_rd_u16(w->d.scales, (size_t)o))));
        }
    }
    kvq_isa saved = kvq_cpu_isa();
    w->d.i8 = 1;
    for (int i = 0; i < 4; i++) {
        int n = ns[i];
        kvq_ref_matmul(&w->d, x, yr, n);
        path pa;
        for (int pi = 0; path_get(pi, &pa); pi++) {
            int nt = 1 + (i + pi) % 3;
            kvq_cpu_weight *cw = path_matmul(&w->d, x, y, n, nt, what);
            double e = tu_rel_l2(y, yr, (size_t)n * rows);
            if (!used) {
                if (!(e <= path_tol(&pa, &w->d, n)))
                    fail_msg("%s n=%d path=%s: i8 moved a weight it does not apply to (%.3g)", what, n, path_name(&pa), e);
                kvq_cpu_weight_free(cw);
                continue;
            }
            if (!(e <= KVQ_I8_REL_L2 && e > 1e-4))
                fail_msg("%s n=%d path=%s threads=%d: rel L2 %.3g, not in (1e-4, %.0e]", what, n, path_name(&pa), nt, e,
                         KVQ_I8_REL_L2);
            for (size_t k = 0; k < (size_t)n * rows; k++) {
                double d = fabs(y[k] - yr[k]), b = bound[k] * 1.001 + 1e-5 * (fabs(yr[k]) + 1.0);
                if (!(d <= b))
                    fail_msg("%s n=%d path=%s: token %zu row %zu off by %.3g > bound %.3g", what, n, path_name(&pa),
                             k / (size_t)rows, k % (size_t)rows, d, b);
            }
            if (pi == 0) {
                memcpy(ys, y, sizeof(float) * (size_t)n * rows);
            } else {
                double es = tu_rel_l2(y, ys, (size_t)n * rows);
                if (!(es <= 1e-5)) fail_msg("%s n=%d path=%s threads=%d: rel L2 to scalar %.3g", what, n, path_name(&pa), nt, es);
            }
            if (i == 0) print_message("%s n=%d path=%s: rel L2 %.2e (bound %.0e)\n", what, n, path_name(&pa), e, KVQ_I8_REL_L2);
            kvq_cpu_weight_free(cw);
        }
    }
    path_reset(saved);
    w->d.i8 = 0;
    free(x), free(y), free(yr), free(ys), free(bound), free(cs), free(l1), free(db);
}

static void test_i8(void **state) {
    (void)state;
    wdesc w;
    make_aqlm(&w, 37, 13 * 8, 1, 16, 8, 2, 1); /* odd group count (a short last step), bias */
    check_i8(&w, "i8 1x16 37x104");
    wdesc_free(&w);
    make_aqlm(&w, 70, 13 * 16, 1, 16, 16, 2, 0); /* g16 */
    check_i8(&w, "i8 1x16g16 70x208");
    wdesc_free(&w);
    make_aqlm(&w, 40, 96, 1, 12, 8, 2, 0); /* 12-bit codes */
    check_i8(&w, "i8 1x12 40x96");
    wdesc_free(&w);
    make_aqlm(&w, 301, 1032, 1, 16, 8, 2, 0); /* several threads and row blocks, 1032 = 16 * 64 + 8 */
    check_i8(&w, "i8 1x16 301x1032");
    wdesc_free(&w);
    make_aqlm(&w, 37, 64, 2, 16, 8, 2, 0); /* two codebooks: i8 ignored */
    check_i8(&w, "i8 2x16 37x64");
    wdesc_free(&w);
    make_aqlm(&w, 37, 104, 2, 8, 8, 1, 0); /* 8-bit codes: i8 ignored */
    check_i8(&w, "i8 2x8 37x104");
    wdesc_free(&w);
}

/* Int8 tiles for batches (i8tile/i8tile.c; AQLM weights without exact, 32
 * tokens and more): every SIMD panel kernel bit-identical to the scalar spec
 * on the same decoded rows, and through kvq_cpu_matmul on every ISA path,
 * every output within the stated bound
 *   sum_b ( sw/2 |x_b|_1 + sa/2 |W_b|_1 + 256 sw sa / 4 )
 * (sw, sa: max| | / 127 of the row's and the token's block b, from the
 * reference weights), the whole within KVQ_I8T_REL_L2 and above f32
 * rounding where the CPU has a kernel (the tiles are really in use). */
static void check_i8t(wdesc *w, const char *what) {
    static const int ns[] = {1, 7, 16, 45, 70};
    int rows = w->d.rows, cols = w->d.cols, nmax = 70;
    float *x = malloc(sizeof(float) * (size_t)nmax * cols), *y = malloc(sizeof(float) * (size_t)nmax * rows);
    float *yr = malloc(sizeof(float) * (size_t)nmax * rows), *ys = malloc(sizeof(float) * (size_t)nmax * rows);
    float *W = malloc(sizeof(float) * (size_t)rows * cols);
    assert_true(x && y && yr && ys && W);
    tu_rand_fill(x, (size_t)nmax * cols, &rng);
    for (size_t i = 0; i < (size_t)nmax * cols; i += 41) x[i] *= 25.0f; /* outliers: block scales differ */
    for (int o = 0; o < rows; o++) kvq_ref_weight_row(&w->d, o, W + (size_t)o * cols);
    w->d.exact = 0;
    kvq_cpu_weight *cw = kvq_cpu_weight_new(&w->d);
    assert_non_null(cw);
    /* 1. kernels against the spec, same rows (scalar decode) */
    const kvq_i8t_kernel spec = {kvq_i8t_panel_scalar, kvq_i8t_qblock_scalar, 0};
    const kvq_i8t_kernel *ks[4];
    int nk = 0;
#if defined(__x86_64__)
    static const kvq_i8t_kernel vnni = {kvq_i8t_panel_vnni, kvq_i8t_qblock_avx512, 1},
                                avx2 = {kvq_i8t_panel_avx2, kvq_i8t_qblock_avx2, 0};
    if (kvq_cpu_isa_available(KVQ_ISA_AVX512) && kvq_cpu_has_vnni()) ks[nk++] = &vnni;
    if (kvq_cpu_isa_available(KVQ_ISA_AVX2)) ks[nk++] = &avx2;
#if defined(KVQ_HAVE_AVXVNNI)
    static const kvq_i8t_kernel avxvnni = {kvq_i8t_panel_avxvnni, kvq_i8t_qblock_avx2, 0};
    if (kvq_cpu_has_avxvnni()) ks[nk++] = &avxvnni;
#endif
#endif
#if defined(__aarch64__)
    static const kvq_i8t_kernel neon = {kvq_i8t_panel_neon, kvq_i8t_qblock_scalar, 0};
    if (kvq_cpu_has_dotprod()) ks[nk++] = &neon;
#endif
    for (int i = 0; i < 5; i++) {
        int n = ns[i], nt = 1 + i % 3;
        void *buf = kvq_alloc_aligned(kvq_i8t_scratch_bytes(cols, n, nt));
        assert_non_null(buf);
        kvq_cpu_matmul_i8t(cw, &spec, kvq_aqlm_rows_scalar, x, ys, n, nt, buf);
        for (int k = 0; k < nk; k++) {
            memset(y, 0xff, sizeof(float) * (size_t)n * rows);
            kvq_cpu_matmul_i8t(cw, ks[k], kvq_aqlm_rows_scalar, x, y, n, nt, buf);
            if (memcmp(y, ys, sizeof(float) * (size_t)n * rows))
                fail_msg("%s n=%d: panel kernel %d differs from the scalar spec", what, n, k);
        }
        kvq_free_aligned(buf);
    }
    kvq_cpu_weight_free(cw);
    /* 2. the dispatch on every ISA path, against the reference and the bound */
    kvq_isa saved = kvq_cpu_isa();
    for (int i = 0; i < 5; i++) {
        int n = ns[i];
        kvq_ref_matmul(&w->d, x, yr, n);
        path pa;
        for (int pi = 0; path_get(pi, &pa); pi++) {
            int nt = 1 + (i + pi) % 3;
            kvq_cpu_weight *c2 = path_matmul(&w->d, x, y, n, nt, what);
            int tiles = n >= kvq_i8t_min_n(c2);
            double e = tu_rel_l2(y, yr, (size_t)n * rows);
            if (tiles && !(e <= KVQ_I8T_REL_L2 && e > 1e-5))
                fail_msg("%s n=%d path=%s: rel L2 %.3g not in (1e-5, %.0e]", what, n, path_name(&pa), e, KVQ_I8T_REL_L2);
            if (!tiles && !(e <= path_tol(&pa, &w->d, n)))
                fail_msg("%s n=%d path=%s: rel L2 %.3g without int8 tiles", what, n, path_name(&pa), e);
            for (int t = 0; tiles && t < n; t++)
                for (int o = 0; o < rows; o++) {
                    const float *xt = x + (size_t)t * cols, *wo = W + (size_t)o * cols;
                    double bound = tu_i8_block_bound(wo, xt, cols, KVQ_I8T_KB);
                    double r = yr[(size_t)t * rows + o], d = fabs(y[(size_t)t * rows + o] - r);
                    if (!(d <= bound * 1.001 + 1e-4 * (fabs(r) + 1.0)))
                        fail_msg("%s n=%d path=%s: token %d row %d off by %.3g > bound %.3g", what, n, path_name(&pa), t, o,
                                 d, bound);
                }
            if (tiles && i == 2) print_message("%s n=%d path=%s: rel L2 %.2e\n", what, n, path_name(&pa), e);
            kvq_cpu_weight_free(c2);
        }
    }
    path_reset(saved);
    w->d.exact = 1;
    free(x), free(y), free(yr), free(ys), free(W);
}

static void test_i8tile(void **state) {
    (void)state;
    wdesc w;
    make_aqlm(&w, 37, 13 * 8, 2, 8, 8, 1, 1); /* 2x8, one short block, a partial panel, bias */
    check_i8t(&w, "i8t 2x8 37x104");
    wdesc_free(&w);
    make_aqlm(&w, 130, 70 * 16, 2, 8, 16, 1, 0); /* g16, 1120 = 4 blocks + 96 */
    check_i8t(&w, "i8t 2x8g16 130x1120");
    wdesc_free(&w);
    make_aqlm(&w, 150, 1032, 1, 16, 8, 2, 0); /* 1x16, several panels and threads */
    check_i8t(&w, "i8t 1x16 150x1032");
    wdesc_free(&w);
    make_aqlm(&w, 64, 520, 3, 8, 8, 1, 0); /* odd M */
    check_i8t(&w, "i8t 3x8 64x520");
    wdesc_free(&w);
    make_aqlm(&w, 70, 11008, 2, 8, 8, 1, 0); /* Llama-2-7B's down_proj columns: 43 blocks, chunks of KVQ_I8T_KC */
    check_i8t(&w, "i8t 2x8 70x11008");
    wdesc_free(&w);
}

/* The AVX2 table lookups by gathers and by plain loads give the same bits (the dispatcher times
 * the two and keeps the faster): random f32 tables and starting sums, chunks of steps of every
 * length mod 4 from even starts, row ranges of whole 64-row blocks. */
static void test_avx2_lut_same_bits(void **state) {
    (void)state;
#if defined(__x86_64__)
    if (!kvq_cpu_isa_available(KVQ_ISA_AVX2)) skip();
    wdesc w;
    make_aqlm(&w, 200, 61 * 8, 2, 8, 8, 1, 0); /* rows_pad 256, 122 steps */
    kvq_cpu_weight *cw = kvq_cpu_weight_new(&w.d);
    assert_non_null(cw);
    int steps = cw->G * cw->M, pad = cw->rows_pad;
    float *lut = kvq_alloc_aligned(sizeof(float) * 256 * (size_t)steps);
    float *a = kvq_alloc_aligned(sizeof(float) * (size_t)pad), *b = kvq_alloc_aligned(sizeof(float) * (size_t)pad);
    assert_true(lut && a && b);
    tu_rand_fill(lut, 256 * (size_t)steps, &rng);
    static const int ranges[][4] = {{0, 122, 0, 256}, {0, 1, 0, 64}, {2, 5, 64, 256}, {4, 11, 0, 128},
                                    {10, 23, 192, 256}, {16, 32, 0, 256}, {100, 122, 64, 192}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        int s0 = ranges[i][0], s1 = ranges[i][1], r0 = ranges[i][2], r1 = ranges[i][3];
        tu_rand_fill(a, (size_t)pad, &rng);
        memcpy(b, a, sizeof(float) * (size_t)pad);
        kvq_aqlm_lut_gemv_avx2(cw, lut + (size_t)s0 * 256, s0, s1, a, r0, r1);
        kvq_aqlm_lut_gemv_rows(cw, lut + (size_t)s0 * 256, s0, s1, b, r0, r1);
        if (memcmp(a, b, sizeof(float) * (size_t)(r1 - r0)))
            fail_msg("steps [%d, %d) rows [%d, %d): gathers and loads differ", s0, s1, r0, r1);
    }
    kvq_free_aligned(lut), kvq_free_aligned(a), kvq_free_aligned(b);
    kvq_cpu_weight_free(cw);
    wdesc_free(&w);
#else
    skip();
#endif
}

static void expect_reject(kvq_weight_desc d, const char *why) {
    d.name = "model.layers.7.mlp.odd_proj";
    kvq_cpu_weight *cw = kvq_cpu_weight_new(&d);
    if (cw) fail_msg("accepted %s", why);
    if (!strstr(kvq_last_error(), d.name)) fail_msg("%s: error does not name the weight: %s", why, kvq_last_error());
}

static void test_unsupported(void **state) {
    (void)state;
    wdesc w;
    make_aqlm(&w, 4, 32, 2, 8, 8, 1, 0);
    kvq_weight_desc d = w.d;
    d.cols = 36; /* codes buffer is big enough for the check to happen first */
    expect_reject(d, "cols not a multiple of in_group");
    d = w.d, d.in_group = 4;
    expect_reject(d, "in_group 4");
    d = w.d, d.n_codebooks = 9;
    expect_reject(d, "9 codebooks");
    d = w.d, d.n_codebooks = 0;
    expect_reject(d, "0 codebooks");
    d = w.d, d.nbits = 17;
    expect_reject(d, "17-bit codes");
    d = w.d, d.nbits = 7;
    expect_reject(d, "7-bit codes");
    d = w.d, d.nbits = 12;
    expect_reject(d, "12-bit codes in int8");
    d = w.d, d.codes = NULL;
    expect_reject(d, "missing codes");
    d = w.d, d.bias = w.scales.p, d.bias_fmt = KVQ_W_AQLM;
    expect_reject(d, "AQLM bias");
    d = w.d, d.rows = 0;
    expect_reject(d, "zero rows");
    d = w.d, d.fmt = (kvq_wformat)42;
    expect_reject(d, "unknown format");
    d = (kvq_weight_desc){.fmt = KVQ_W_F16, .rows = 2, .cols = 2};
    expect_reject(d, "dense without data");
    wdesc_free(&w);
    kvq_cpu_weight_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_tiny_aqlm), cmocka_unit_test(test_dense),      cmocka_unit_test(test_aqlm_shapes),
        cmocka_unit_test(test_threaded),      cmocka_unit_test(test_cb8),     cmocka_unit_test(test_lut8),     cmocka_unit_test(test_i8),
        cmocka_unit_test(test_i8tile),        cmocka_unit_test(test_avx2_lut_same_bits),
        cmocka_unit_test(test_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
