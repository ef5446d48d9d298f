/* 1x16 AQLM through int8 codewords and integer dot products (the default
 * for one-codebook gather weights at steps of 1..16 tokens; desc i8): the
 * upload's int8 codebook, the activations' quantization and the scalar
 * kernel every SIMD one is checked against.
 *
 * The fp16 1x16 codebook is 1 MiB: the exact kernels' codeword loads miss L2
 * and one fp16 load + convert + FMA per code sets their pace. Here the
 * codebook is int8, 512 KiB for 65536 x 8: it stays in L2. A scale per
 * codeword would keep small codewords precise, but a second random load per
 * code (a separate scale array) halved the kernels' speed (micro-benchmark,
 * README), and an 8-byte codeword has no room for one. So at load the
 * codewords are renumbered (codes remapped as they are copied) in order of
 * max|v|, and each of KVQ_I8_CLASSES runs of equal size shares one scale,
 * a function of the code's top bits (a register permute). The scales are
 * powers of two of one base: s_k = base * 2^e_k, e_k in [0, 8], base =
 * max|v| over the codebook / (127 * 256), e_k the least that holds the
 * class's largest |v| in 127 steps. So q_c << e_c is the codeword in units of
 * base, |q_c << e_c| <= 127 * 256 = 32512: an int16. Activations are
 * quantized per block of 256 values to 12 bits (d_b = max|x_b| / 2047, |xq|
 * <= 2047, int16), and a token's products add up exactly in int32 lanes of at
 * most 32 products each (32 * 32512 * 2047 = 2.13e9 < 2^31) whatever the
 * codewords' classes: one float conversion per lane and 256 values
 * (aqlm_i8_avx512.c). Output o, with row scale r_o: y_o = r_o * base * sum_b
 * d_b * S_b, S_b the exact block sum of (q_c << e_c) * xq (an ISA converts
 * its lanes' partial sums and adds them in f32). Its error against the fp16
 * weights is at most
 *   |r_o| * sum_g ( s_c / 2 * |x_g|_1 + |q_c s_c|_1 * d_b / 2 )
 * (each weight is off by at most s_c / 2 <= its class's max|v| / 127, each
 * activation by d_b / 2), plus f32 rounding; tests/test_matmul.c checks
 * every output against it. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

size_t kvq_i8_codebook_bytes(const kvq_cpu_weight *w) { return round64(((size_t)1 << w->nbits) * (size_t)w->ig); }

/* Codewords in ascending order of key (stable: ties keep code order), by
 * LSD radix on the keys' bits (non-negative floats order as their bits). */
static void sort_by_key(const uint32_t *key, uint32_t *order, uint32_t *tmp, size_t K) {
    for (size_t c = 0; c < K; c++) order[c] = (uint32_t)c;
    for (int shift = 0; shift < 32; shift += 8) {
        size_t count[257] = {0};
        for (size_t i = 0; i < K; i++) count[((key[order[i]] >> shift) & 255) + 1]++;
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (size_t i = 0; i < K; i++) tmp[count[(key[order[i]] >> shift) & 255]++] = order[i];
        memcpy(order, tmp, K * sizeof *order);
    }
}

int kvq_i8_codebook(kvq_cpu_weight *w, const kvq_weight_desc *d, void *dst) {
    size_t K = (size_t)1 << w->nbits, ig = (size_t)w->ig, per = K / KVQ_I8_CLASSES;
    uint32_t *key = malloc(K * sizeof *key), *order = malloc(K * sizeof *order), *tmp = malloc(K * sizeof *tmp);
    uint16_t *perm = malloc(K * sizeof *perm);
    if (!key || !order || !tmp || !perm) {
        free(key), free(order), free(tmp), free(perm);
        return kvq_fail(KVQ_ERR_NOMEM, "%s: no memory for the int8 codebook", d->name ? d->name : "(unnamed weight)");
    }
    for (size_t c = 0; c < K; c++) {
        float mx = 0.0f;
        for (size_t j = 0; j < ig; j++) mx = fmaxf(mx, fabsf(kvq_f16_to_f32(kvq_rd_u16(d->codebooks, c * ig + j))));
        memcpy(&key[c], &mx, 4);
    }
    sort_by_key(key, order, tmp, K);
    w->cbq = dst;
    w->cbq_shift = w->nbits - 6; /* K / 64 codewords per class */
    float top;
    memcpy(&top, &key[order[K - 1]], 4);
    top /= 127.0f; /* the scale of the largest class, e = 8 */
    for (int k = 0; k < KVQ_I8_CLASSES; k++) {
        float mx;
        memcpy(&mx, &key[order[(size_t)k * per + per - 1]], 4); /* the class's largest */
        int e = 0;
        while (e < 8 && mx > 127.0f * ldexpf(top, e - 8)) e++;
        w->cbq_cls[k] = ldexpf(top, e - 8);
    }
    for (size_t n = 0; n < K; n++) { /* new code n holds old codeword order[n] */
        size_t c = order[n];
        float s = w->cbq_cls[n / per], inv = s > 0.0f ? 1.0f / s : 0.0f;
        perm[c] = (uint16_t)n;
        for (size_t j = 0; j < ig; j++) {
            float q = kvq_f16_to_f32(kvq_rd_u16(d->codebooks, c * ig + j)) * inv;
            w->cbq[n * ig + j] = (int8_t)lrintf(fminf(fmaxf(q, -127.0f), 127.0f));
        }
    }
    w->cbq_perm = perm;
    free(key), free(order), free(tmp);
    return KVQ_OK;
}

/* A token's stride (values of q; q16 takes twice the bytes, d an eighth):
 * a multiple of 64, plus one line when it is a multiple of 1 KiB. With 4096
 * columns every token's q fell in the same L1 set, and 8 tokens per pass
 * asked one 8-way set for more lines than it holds. */
static int cols_pad(int cols) {
    int p = (cols + 63) / 64 * 64;
    return p % 1024 ? p : p + 64;
}

size_t kvq_i8_act_bytes(int cols, int n) {
    size_t p = (size_t)cols_pad(cols) * (size_t)n;
    return p * 2 + p / 8; /* q16, d (f32 per 32) */
}

kvq_i8_act kvq_i8_act_at(void *buf, int cols, int n) {
    size_t p = (size_t)cols_pad(cols) * (size_t)n;
    char *b = buf;
    return (kvq_i8_act){cols_pad(cols), (const float *)(b + 2 * p), (const int16_t *)b, 1};
}

void kvq_i8_quantize(const kvq_i8_act *a, const float *x, int cols, int t0, int t1) {
    int P = a->cols_pad, nb = P / 32;
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * cols;
        float *d = (float *)(uintptr_t)(a->d + (size_t)t * nb);
        int16_t *q16 = (int16_t *)(uintptr_t)(a->q16 + (size_t)t * P);
        for (int k0 = 0; k0 < P; k0 += KVQ_I8_ABLK) {
            int k1 = k0 + KVQ_I8_ABLK < P ? k0 + KVQ_I8_ABLK : P, kc = k1 < cols ? k1 : cols;
            float mx = 0.0f;
            for (int k = k0; k < kc; k++) mx = fabsf(xt[k]) > mx || xt[k] != xt[k] ? fabsf(xt[k]) : mx; /* NaN sticks */
            float db = mx / KVQ_I8_AMAX, inv = mx > 0.0f ? KVQ_I8_AMAX / mx : 0.0f;
            if (!(mx <= 3.0e38f)) db = NAN, inv = 0.0f; /* inf or NaN: the block's outputs become NaN */
            for (int k = k0; k < k1; k++) {
                float s = k < kc ? xt[k] * inv : 0.0f;
                s = s < -KVQ_I8_AMAX ? -KVQ_I8_AMAX : s > KVQ_I8_AMAX ? KVQ_I8_AMAX : s;
                q16[k] = (int16_t)kvq_round_ne(s);
            }
            for (int k = k0; k < k1; k += 32) d[k / 32] = db; /* per 32 for the kernels that scale per group */
        }
    }
}

/* The spec of the scheme: per block of KVQ_I8_ABLK values an exact sum
 * of the codewords in units of base times the activations, then scaled. */
void kvq_aqlm_i8_gemv_scalar(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1) {
    int ig = w->ig, G = w->G, per_blk = KVQ_I8_ABLK / ig, nb = a->cols_pad / 32;
    int16_t ex[KVQ_I8_CLASSES];
    float base;
    kvq_i8_exponents(w, ex, &base);
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        for (int t = 0; t < n; t++) {
            const int16_t *q = a->q16 + (size_t)t * a->cols_pad;
            const float *d = a->d + (size_t)t * nb;
            float acc = 0.0f;
            for (int g0 = 0; g0 < G; g0 += per_blk) {
                int64_t sum = 0; /* exact: up to 8.5e9 over a block */
                for (int g = g0; g < G && g < g0 + per_blk; g++) {
                    const int8_t *cw = w->cbq + (size_t)c[g] * ig;
                    const int16_t *xq = q + (size_t)g * ig;
                    int e = ex[c[g] >> w->cbq_shift];
                    for (int j = 0; j < ig; j++) sum += cw[j] * (1 << e) * xq[j]; /* < 2^31 */
                }
                acc += (float)sum * d[g0 * ig / 32];
            }
            y[(size_t)t * ldy + o] = w->scales[o] * (base * acc);
        }
    }
}

/* ---- dispatch (kvq_cpu_matmul hands every matmul of a cbq weight here) ---- */

static void add_bias(const kvq_cpu_weight *w, float *y, int r0, int r1) {
    if (w->bias)
        for (int o = r0; o < r1; o++) y[o] += w->bias[o];
}

/* The int8-codeword kernel (weights with cbq) for the current ISA and the
 * most tokens it takes per pass over a row's codewords: VNNI on AVX-512 CPUs
 * that have it (8: one gather serves a whole 2-8 token step; its 16
 * accumulators and the constants fit the 32 registers), else the ymm ones
 * (vpdpwssd with AVX-VNNI, else vpmaddwd; plain loads); smlal on NEON; the
 * scalar spec otherwise. */
typedef struct {
    kvq_i8_gemv_fn fn;
    int max_t;
} i8_kern;
static i8_kern i8_kernel(void) {
    switch (kvq_cpu_isa()) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX512:
        if (kvq_cpu_has_vnni()) return (i8_kern){kvq_aqlm_i8_gemv_vnni, KVQ_I8_VNNI_MAX_T};
        /* AVX-512 without VNNI runs the ymm kernels */
        __attribute__((fallthrough));
    case KVQ_ISA_AVX2:
#if defined(KVQ_HAVE_AVXVNNI)
        if (kvq_cpu_has_avxvnni()) return (i8_kern){kvq_aqlm_i8_gemv_avxvnni, KVQ_GEMV_MAX_T};
#endif
        return (i8_kern){kvq_aqlm_i8_gemv_avx2, KVQ_GEMV_MAX_T};
#endif
#if defined(__aarch64__)
    case KVQ_ISA_NEON:
        return (i8_kern){kvq_aqlm_i8_gemv_neon, KVQ_GEMV_MAX_T};
#endif
    default: return (i8_kern){kvq_aqlm_i8_gemv_scalar, KVQ_GEMV_MAX_T};
    }
}

/* Int8 codewords (w->cbq), any number of tokens: every token quantized once,
 * then rows split among threads. A few tokens share each pass over a row's
 * codes (the kernel's max_t per call); more go through blocks of
 * KVQ_I8_ROWS rows, all tokens per block, so the codes come from memory once.
 * kvq_cpu_matmul sends steps of up to 16 tokens here; longer prompts take
 * the int8 tiles on rows dequantized from the same codewords, which run a 7B
 * prompt several times faster than this (one gather per code and token pass). */
#define KVQ_I8_ROWS 16
void kvq_cpu_matmul_i8(const kvq_cpu_weight *w, const float *x, float *y, int n, int nt, void *buf) {
    i8_kern k = i8_kernel();
    kvq_i8_act a = kvq_i8_act_at(buf, w->cols, n);
    if (n == 1) kvq_i8_quantize(&a, x, w->cols, 0, 1); /* a few µs: not worth waking the threads twice */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads(), r0, r1;
        if (n > 1) {
            kvq_split(n, T, t, &r0, &r1);
            kvq_i8_quantize(&a, x, w->cols, r0, r1);
#pragma omp barrier
        }
        kvq_split(w->rows, T, t, &r0, &r1);
        int rb = n <= k.max_t ? r1 - r0 : KVQ_I8_ROWS;
        for (int b0 = r0; b0 < r1; b0 += rb) {
            int b1 = b0 + rb < r1 ? b0 + rb : r1;
            for (int t0 = 0; t0 < n; t0 += k.max_t) {
                int nn = n - t0 < k.max_t ? n - t0 : k.max_t;
                kvq_i8_act at = kvq_i8_act_token(&a, t0);
                at.cb_prefetch = b0 == r0 && t0 == 0; /* once per thread, not per block of a prompt */
                float *yt = y + (size_t)t0 * w->rows;
                k.fn(w, &at, nn, yt, (size_t)w->rows, b0, b1);
                for (int i = 0; i < nn; i++) add_bias(w, yt + (size_t)i * w->rows, b0, b1);
            }
        }
    }
}
