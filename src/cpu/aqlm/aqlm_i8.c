/* 1x16 AQLM through int8 codewords and integer dot products (opt-in,
 * kvq_weight_desc.i8): the upload's int8 codebook, the activations'
 * quantization and the scalar kernel every SIMD one is checked against.
 *
 * The fp16 1x16 codebook is 1 MiB: the exact kernels' codeword loads miss L2
 * and one fp16 load + convert + FMA per code sets their pace. Here the
 * codebook is int8, 512 KiB for 65536 x 8: it stays in L2. A scale per
 * codeword would keep small codewords precise, but a second random load per
 * code (a separate scale array) halved the kernels' speed (micro-benchmark,
 * README), and an 8-byte codeword has no room for one. So at load the
 * codewords are renumbered (codes remapped as they are copied) in order of
 * max|v|, and each of KVQ_I8_CLASSES runs of equal size shares one scale,
 * the largest of its members: the scale is a function of the code's top
 * bits, a register permute. Codeword c: q_c = round(v_c / s_c), s_c = its
 * class's max|v| / 127. Activations are quantized per 32 values (d_b =
 * max|x_b| / 127), and a group g with code c adds s_c * d_b * (q_c . xq_g),
 * the dot product in integers. Per output o, with row scale r_o, the error
 * against the fp16 weights is at most
 *   |r_o| * sum_g ( s_c / 2 * |x_g|_1 + |q_c s_c|_1 * d_b / 2 )
 * (each weight is off by at most s_c / 2, each activation by d_b / 2), plus
 * f32 rounding; tests/test_matmul.c checks every output against it. */
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
    for (int k = 0; k < KVQ_I8_CLASSES; k++) {
        float mx;
        memcpy(&mx, &key[order[(size_t)k * per + per - 1]], 4); /* the class's largest */
        w->cbq_cls[k] = mx / 127.0f;
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

/* A token's stride (bytes of q; qu takes as many, d an eighth): a multiple
 * of 64, plus one line when it is a multiple of 1 KiB. With 4096 columns
 * every token's q (and qu) fell in the same L1 set, and 8 tokens per pass
 * asked one 8-way set for more lines than it holds. */
static int cols_pad(int cols) {
    int p = (cols + 63) / 64 * 64;
    return p % 1024 ? p : p + 64;
}

size_t kvq_i8_act_bytes(int cols, int n) {
    size_t p = (size_t)cols_pad(cols) * (size_t)n;
    return p * 2 + p / 8; /* qu, q, d (f32 per 32) */
}

kvq_i8_act kvq_i8_act_at(void *buf, int cols, int n) {
    size_t p = (size_t)cols_pad(cols) * (size_t)n;
    char *b = buf;
    return (kvq_i8_act){cols_pad(cols), (const int8_t *)(b + p), (const float *)(b + 2 * p), (const uint8_t *)b, 1};
}

void kvq_i8_quantize(const kvq_i8_act *a, const float *x, int cols, int t0, int t1) {
    int P = a->cols_pad, nb = P / 32;
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * cols;
        int8_t *q = (int8_t *)(uintptr_t)(a->q + (size_t)t * P);
        float *d = (float *)(uintptr_t)(a->d + (size_t)t * nb);
        uint8_t *qu = (uint8_t *)(uintptr_t)(a->qu + (size_t)t * P);
        for (int b = 0; b < nb; b++) {
            int k0 = b * 32, k1 = k0 + 32 < cols ? k0 + 32 : cols;
            float mx = 0.0f, v[32];
            for (int k = 0; k < 32; k++) v[k] = k0 + k < k1 ? xt[k0 + k] : 0.0f;
            for (int k = 0; k < 32; k++) mx = fabsf(v[k]) > mx || v[k] != v[k] ? fabsf(v[k]) : mx; /* NaN sticks */
            if (!(mx <= 3.0e38f)) { /* inf or NaN: the block's outputs become NaN */
                memset(q + k0, 0, 32);
                d[b] = NAN;
                continue;
            }
            float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
            d[b] = mx / 127.0f;
            for (int k = 0; k < 32; k++) {
                float s = v[k] * inv;
                s = s < -127.0f ? -127.0f : s > 127.0f ? 127.0f : s;
                q[k0 + k] = (int8_t)kvq_round_ne(s);
            }
        }
        for (int k = 0; k < P; k++) qu[k] = (uint8_t)q[k] ^ 0x80u;
    }
}

/* The spec of the scheme: per group an exact int32 dot product, then scaled. */
void kvq_aqlm_i8_gemv_scalar(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1) {
    int ig = w->ig, G = w->G, per_blk = 32 / ig, nb = a->cols_pad / 32;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        for (int t = 0; t < n; t++) {
            const int8_t *q = a->q + (size_t)t * a->cols_pad;
            const float *d = a->d + (size_t)t * nb;
            float acc = 0.0f;
            for (int g = 0; g < G; g++) {
                const int8_t *cw = w->cbq + (size_t)c[g] * ig, *xq = q + (size_t)g * ig;
                int32_t dot = 0;
                for (int j = 0; j < ig; j++) dot += cw[j] * xq[j];
                acc += (float)dot * (w->cbq_cls[c[g] >> w->cbq_shift] * d[g / per_blk]);
            }
            y[(size_t)t * ldy + o] = w->scales[o] * acc;
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
 * accumulators and the constants fit the 32 registers), else AVX2's
 * (maddubs, plain loads); sdot on NEON CPUs with the dot-product extension;
 * the scalar spec otherwise. */
typedef struct {
    kvq_i8_gemv_fn fn;
    int max_t;
} i8_kern;
static i8_kern i8_kernel(void) {
    switch (kvq_cpu_isa()) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX512:
        return kvq_cpu_has_vnni() ? (i8_kern){kvq_aqlm_i8_gemv_vnni, KVQ_I8_VNNI_MAX_T}
                                  : (i8_kern){kvq_aqlm_i8_gemv_avx2, KVQ_GEMV_MAX_T};
    case KVQ_ISA_AVX2: return (i8_kern){kvq_aqlm_i8_gemv_avx2, KVQ_GEMV_MAX_T};
#endif
#if defined(__aarch64__)
    case KVQ_ISA_NEON:
        return (i8_kern){kvq_cpu_has_dotprod() ? kvq_aqlm_i8_gemv_neon : kvq_aqlm_i8_gemv_scalar, KVQ_GEMV_MAX_T};
#endif
    default: return (i8_kern){kvq_aqlm_i8_gemv_scalar, KVQ_GEMV_MAX_T};
    }
}

/* Int8 codewords (w->cbq), any number of tokens: every token quantized once,
 * then rows split among threads. A few tokens share each pass over a row's
 * codes (the kernel's max_t per call); more go through blocks of
 * KVQ_I8_ROWS rows, all tokens per block, so the codes come from memory once.
 * Prompts take this path too (the weight keeps no fp16 codebook for the tile
 * dequantize + f32 GEMM), so prompt and decode compute the same products. */
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
