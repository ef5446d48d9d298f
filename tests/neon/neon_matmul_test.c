/* Standalone check of the NEON matmul kernels (no cmocka): built for aarch64
 * by run.sh and run under qemu. kvq_cpu_matmul on the NEON and scalar paths
 * against kvq_ref_matmul for dense F32/F16/BF16 and AQLM weights (8-bit codes
 * through int16 tables, 12/16-bit codes through codeword loads), shapes that
 * are not multiples of the kernels' tiles, 1..3 threads and several batch
 * sizes (GEMV, per-token tables, tile GEMM). Exit status 1 on any mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "neon_check.h"
#include "ref/ref.h"
#include "util.h"

static uint64_t g_st = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
    g_st ^= g_st << 13;
    g_st ^= g_st >> 7;
    g_st ^= g_st << 17;
    return (uint32_t)(g_st >> 32);
}
static float randf(void) { return (float)(rnd() >> 8) * (2.0f / 16777216.0f) - 1.0f; }

static int g_fail, g_cases;

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* Runs one weight on every path and batch size; buffers are one byte off
 * alignment half of the time (misaligned tensors are copied, aligned used in place). */
static void check(const kvq_weight_desc *d, const char *what) {
    static const int ns[] = {1, 3, 17};
    int rows = d->rows, cols = d->cols;
    float *x = malloc(sizeof(float) * 17 * (size_t)cols), *y = malloc(sizeof(float) * 17 * (size_t)rows),
          *yr = malloc(sizeof(float) * 17 * (size_t)rows), *ys = malloc(sizeof(float) * 17 * (size_t)rows);
    /* int8 codebook (cb8) or int8 codewords and dot products (i8): scalar is the spec, fp16 within the bound */
    int cb8 = (d->cb8 || d->i8) && d->n_codebooks == 1 && d->nbits > 8;
    for (size_t i = 0; i < 17 * (size_t)cols; i++) x[i] = randf();
    for (int ni = 0; ni < 3; ni++) {
        int n = ns[ni];
        kvq_ref_matmul(d, x, yr, n);
        for (int isa = KVQ_ISA_SCALAR; isa <= KVQ_ISA_NEON; isa += KVQ_ISA_NEON - KVQ_ISA_SCALAR) {
            kvq_cpu_set_isa((kvq_isa)isa);
            kvq_cpu_weight *w = kvq_cpu_weight_new(d);
            if (!w) {
                printf("FAIL %s: %s\n", what, kvq_last_error());
                g_fail = 1;
                continue;
            }
            memset(y, 0xff, sizeof(float) * (size_t)n * rows);
            kvq_cpu_matmul(w, x, y, n, 1 + (ni + isa) % 3);
            /* int16 tables (NEON, 8-bit codes, per-token tables) have their stated bound */
            double tol = isa == KVQ_ISA_NEON && d->fmt == KVQ_W_AQLM && d->nbits == 8 && n < 16 ? KVQ_LUT_I16_REL_L2 : 1e-5;
            double e = rel_l2(y, yr, (size_t)n * rows);
            g_cases++;
            if (cb8) {
                tol = d->i8 ? KVQ_I8_REL_L2 : KVQ_CB8_REL_L2;
                if (isa == KVQ_ISA_SCALAR) memcpy(ys, y, sizeof(float) * (size_t)n * rows);
                else if (!(rel_l2(y, ys, (size_t)n * rows) <= 1e-5)) {
                    printf("FAIL %s n=%d: NEON vs scalar on the int8 codebook %.3g\n", what, n,
                           rel_l2(y, ys, (size_t)n * rows));
                    g_fail = 1;
                }
            }
            if (!(e <= tol) || (cb8 && !(e > 1e-6))) {
                printf("FAIL %s n=%d isa=%s: rel L2 %.3g > %.1g\n", what, n, kvq_isa_name((kvq_isa)isa), e, tol);
                g_fail = 1;
            }
            kvq_cpu_weight_free(w);
        }
    }
    free(x);
    free(y);
    free(yr);
    free(ys);
}

static void dense_case(kvq_wformat f, int rows, int cols, int off) {
    size_t n = (size_t)rows * cols, es = f == KVQ_W_F32 ? 4 : 2;
    char *block = malloc(n * es + 1), *p = block + off;
    for (size_t i = 0; i < n; i++) {
        float v = randf();
        if (f == KVQ_W_F32) memcpy(p + 4 * i, &v, 4);
        else {
            uint16_t h = f == KVQ_W_F16 ? kvq_f32_to_f16(v) : to_bf16(v);
            memcpy(p + 2 * i, &h, 2);
        }
    }
    kvq_weight_desc d = {.fmt = f, .rows = rows, .cols = cols, .data = p, .name = "dense"};
    char what[96];
    snprintf(what, sizeof what, "dense fmt=%d %dx%d off=%d", (int)f, rows, cols, off);
    check(&d, what);
    free(block);
}

static void aqlm_case(int rows, int cols, int M, int nbits, int ig, int off, int cb8) { /* cb8 2: i8 instead */
    int cbytes = nbits > 8 ? 2 : 1;
    size_t n_codes = (size_t)rows * (cols / ig) * M, K = (size_t)1 << nbits;
    char *codes = malloc(n_codes * cbytes + 1), *cb = malloc((size_t)M * K * ig * 2 + 1), *sc = malloc((size_t)rows * 2 + 1);
    for (size_t i = 0; i < n_codes * cbytes; i++) codes[i + off] = (char)rnd(); /* negative int16 codes too */
    for (size_t i = 0; i < (size_t)M * K * ig; i++) {
        uint16_t h = kvq_f32_to_f16(randf());
        memcpy(cb + off + 2 * i, &h, 2);
    }
    for (int o = 0; o < rows; o++) {
        uint16_t h = kvq_f32_to_f16(0.5f + randf());
        memcpy(sc + off + 2 * o, &h, 2);
    }
    kvq_weight_desc d = {.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = M, .nbits = nbits, .in_group = ig,
                         .code_bytes = cbytes, .codes = codes + off, .codebooks = cb + off, .scales = sc + off,
                         .name = "aqlm", .cb8 = cb8 == 1, .i8 = cb8 == 2, .exact = 1}; /* tiles: i8t_case */
    char what[96];
    snprintf(what, sizeof what, "aqlm %dx%d M=%d nbits=%d ig=%d off=%d cb8=%d", rows, cols, M, nbits, ig, off, cb8);
    check(&d, what);
    free(codes);
    free(cb);
    free(sc);
}

/* Int8 tiles for prompts (45 tokens, not exact): the sdot panel kernel bit-identical to the scalar
 * spec on the same rows, and the NEON dispatch within KVQ_I8T_REL_L2 of the reference (and off
 * f32 rounding: the tiles are in use) where the CPU has sdot. */
static void i8t_case(int rows, int cols, int M, int nbits, int ig) {
    int cbytes = nbits > 8 ? 2 : 1, n = 45;
    size_t n_codes = (size_t)rows * (cols / ig) * M, K = (size_t)1 << nbits;
    char *codes = malloc(n_codes * cbytes), *cb = malloc((size_t)M * K * ig * 2), *sc = malloc((size_t)rows * 2);
    for (size_t i = 0; i < n_codes * cbytes; i++) codes[i] = (char)rnd();
    for (size_t i = 0; i < (size_t)M * K * ig; i++) {
        uint16_t h = kvq_f32_to_f16(randf());
        memcpy(cb + 2 * i, &h, 2);
    }
    for (int o = 0; o < rows; o++) {
        uint16_t h = kvq_f32_to_f16(0.5f + randf());
        memcpy(sc + 2 * o, &h, 2);
    }
    kvq_weight_desc d = {.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = M, .nbits = nbits, .in_group = ig,
                         .code_bytes = cbytes, .codes = codes, .codebooks = cb, .scales = sc, .name = "aqlm"};
    float *x = malloc(sizeof(float) * n * (size_t)cols), *y = malloc(sizeof(float) * n * (size_t)rows),
          *yr = malloc(sizeof(float) * n * (size_t)rows), *ys = malloc(sizeof(float) * n * (size_t)rows);
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = randf();
    kvq_ref_matmul(&d, x, yr, n);
    kvq_cpu_set_isa(KVQ_ISA_NEON);
    kvq_cpu_weight *w = kvq_cpu_weight_new(&d);
    g_cases++;
    if (kvq_cpu_has_dotprod()) {
        static const kvq_i8t_kernel spec = {kvq_i8t_panel_scalar, kvq_i8t_qblock_scalar, 0},
                                    neon = {kvq_i8t_panel_neon, kvq_i8t_qblock_scalar, 0};
        void *buf = kvq_alloc_aligned(kvq_i8t_scratch_bytes(cols, n, 2));
        kvq_cpu_matmul_i8t(w, &spec, kvq_aqlm_rows_scalar, x, ys, n, 2, buf);
        kvq_cpu_matmul_i8t(w, &neon, kvq_aqlm_rows_scalar, x, y, n, 2, buf);
        kvq_free_aligned(buf);
        if (memcmp(y, ys, sizeof(float) * n * (size_t)rows)) {
            printf("FAIL i8t %dx%d M=%d nbits=%d: sdot panel kernel differs from the scalar spec\n", rows, cols, M, nbits);
            g_fail = 1;
        }
    }
    memset(y, 0xff, sizeof(float) * n * (size_t)rows);
    kvq_cpu_matmul(w, x, y, n, 2);
    double e = rel_l2(y, yr, (size_t)n * rows);
    int tiles = n >= kvq_i8t_min_n(w);
    if (!(e <= (tiles ? KVQ_I8T_REL_L2 : 1e-5)) || (tiles && !(e > 1e-6))) {
        printf("FAIL i8t %dx%d M=%d nbits=%d: rel L2 %.3g (tiles %d)\n", rows, cols, M, nbits, e, tiles);
        g_fail = 1;
    }
    kvq_cpu_weight_free(w);
    free(codes), free(cb), free(sc), free(x), free(y), free(yr), free(ys);
}

int main(void) {
    if (!kvq_cpu_isa_available(KVQ_ISA_NEON)) {
        printf("FAIL: NEON not reported available\n");
        return 1;
    }
    static const int shapes[][2] = {{1, 8}, {37, 67}, {70, 104}, {130, 264}};
    for (int f = 0; f < 3; f++)
        for (int s = 0; s < 4; s++) dense_case((kvq_wformat)f, shapes[s][0], shapes[s][1], (f + s) % 2);
    static const int Ms[] = {1, 2, 3}, nbits[] = {8, 12, 16}, igs[] = {8, 16};
    int k = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++, k++) aqlm_case(37 + 40 * (k % 3), 13 * igs[c], Ms[a], nbits[b], igs[c], k % 2, 0);
    aqlm_case(301, 1024, 2, 8, 8, 0, 0); /* 2x8 over several 64-row units and threads */
    aqlm_case(301, 1024, 1, 16, 8, 0, 0);
    aqlm_case(37, 104, 1, 16, 8, 1, 1); /* int8 codebook (opt-in) */
    aqlm_case(70, 208, 1, 16, 16, 0, 1);
    aqlm_case(37, 104, 1, 16, 8, 1, 2); /* int8 codewords and dot products (opt-in): odd group count */
    aqlm_case(70, 208, 1, 16, 16, 0, 2); /* g16 */
    aqlm_case(301, 1032, 1, 16, 8, 0, 2); /* several threads, a short last step */
    i8t_case(37, 104, 2, 8, 8);    /* 2x8: a partial panel, one short block */
    i8t_case(150, 1032, 1, 16, 8); /* 1x16: several panels and threads */
    if (g_fail) return 1;
    printf("ok: %d matmul cases, NEON and scalar vs reference\n", g_cases);
    return 0;
}
