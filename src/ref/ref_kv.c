/* Reference KV cache formats and attention: the spec the fused CPU kernels
 * (src/cpu/cpu_kv.c, attn/attn_*.c) are tested against, byte for byte on the
 * store side and numerically on the attention side.
 *
 * Quantization (both formats use symmetric 32-value blocks, fp16 scale d, and
 * quantize with the inverse of the fp16-rounded d so the stored scale is the
 * one that was actually used):
 *   q8: d = absmax/127, q = round(x/d) clamped to −127..127.
 *   q4: ggml Q4_0 style: m = the signed value of largest magnitude, d = m/−8,
 *       q = round(x/d) clamped to −8..7, stored q+8. m itself lands exactly on
 *       level −8, so all 16 levels are used and the step is absmax/8; plain
 *       symmetric absmax/7 only uses 15 levels with a 14% larger step. Measured
 *       RMS error of absmax/7 is 13% higher on Gaussian data (what rotated
 *       rows look like) and 5% higher on uniform data (tests/test_kv_attn.c
 *       re-checks the Gaussian case). The price: values of the opposite sign
 *       beyond 7.5|d| clip to +7 (error up to |d|); all others are within |d|/2.
 * round() is round-half-away-from-zero (roundf); d is clamped to the largest
 * finite fp16 so a row of huge values stays finite. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref/ref.h"
#include "util.h"

void kvq_ref_hadamard(float *x, int n) {
    assert(n > 0 && (n & (n - 1)) == 0);
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

static float f16_clamped_scale(float d, uint16_t *dh) {
    if (d > 65504.0f) d = 65504.0f;
    if (d < -65504.0f) d = -65504.0f;
    *dh = kvq_f32_to_f16(d);
    return kvq_f16_to_f32(*dh);
}

static void quant_q8(const float *x, kvq_block_q8 *b) {
    float amax = 0.0f;
    for (int j = 0; j < KVQ_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    uint16_t dh;
    float d = f16_clamped_scale(amax / 127.0f, &dh);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    memcpy(&b->d, &dh, 2);
    for (int j = 0; j < KVQ_QK; j++) {
        float q = roundf(x[j] * id);
        if (q > 127.0f) q = 127.0f;
        if (q < -127.0f) q = -127.0f;
        b->qs[j] = (int8_t)q;
    }
}

static void quant_q4(const float *x, kvq_block_q4 *b) {
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < KVQ_QK; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            m = x[j];
        }
    uint16_t dh;
    float d = f16_clamped_scale(m / -8.0f, &dh);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    memcpy(&b->d, &dh, 2);
    uint8_t nib[KVQ_QK];
    for (int j = 0; j < KVQ_QK; j++) {
        float q = roundf(x[j] * id);
        if (q > 7.0f) q = 7.0f;
        if (q < -8.0f) q = -8.0f;
        nib[j] = (uint8_t)((int)q + 8);
    }
    for (int j = 0; j < KVQ_QK / 2; j++) b->qs[j] = (uint8_t)(nib[j] | (nib[j + KVQ_QK / 2] << 4));
}

void kvq_ref_kv_store_row(kvq_cache_type t, int rotate, const float *x, void *row, int head_dim) {
    float stackbuf[512]; /* head_dim <= 512 in every model kvq knows; larger ones go to the heap */
    float *tmp = head_dim <= 512 ? stackbuf : malloc((size_t)head_dim * sizeof *tmp);
    if (!tmp) abort();
    memcpy(tmp, x, (size_t)head_dim * sizeof *tmp);
    if (rotate) kvq_ref_hadamard(tmp, head_dim);
    uint8_t *out = row;
    switch (t) {
    case KVQ_CACHE_F32: memcpy(out, tmp, (size_t)head_dim * 4); break;
    case KVQ_CACHE_F16:
        for (int i = 0; i < head_dim; i++) {
            uint16_t h = kvq_f32_to_f16(tmp[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        break;
    case KVQ_CACHE_Q8:
        for (int b = 0; b < head_dim / KVQ_QK; b++) {
            kvq_block_q8 blk;
            quant_q8(tmp + b * KVQ_QK, &blk);
            memcpy(out + b * sizeof blk, &blk, sizeof blk);
        }
        break;
    case KVQ_CACHE_Q4:
        for (int b = 0; b < head_dim / KVQ_QK; b++) {
            kvq_block_q4 blk;
            quant_q4(tmp + b * KVQ_QK, &blk);
            memcpy(out + b * sizeof blk, &blk, sizeof blk);
        }
        break;
    }
    if (tmp != stackbuf) free(tmp);
}

void kvq_ref_kv_load_row(kvq_cache_type t, const void *row, float *x, int head_dim) {
    const uint8_t *in = row;
    switch (t) {
    case KVQ_CACHE_F32: memcpy(x, in, (size_t)head_dim * 4); break;
    case KVQ_CACHE_F16:
        for (int i = 0; i < head_dim; i++) x[i] = kvq_f16_to_f32(kvq_rd_u16(in, (size_t)i));
        break;
    case KVQ_CACHE_Q8:
        for (int b = 0; b < head_dim / KVQ_QK; b++) {
            kvq_block_q8 blk;
            memcpy(&blk, in + b * sizeof blk, sizeof blk);
            float d = kvq_f16_to_f32(blk.d);
            for (int j = 0; j < KVQ_QK; j++) x[b * KVQ_QK + j] = (float)blk.qs[j] * d;
        }
        break;
    case KVQ_CACHE_Q4:
        for (int b = 0; b < head_dim / KVQ_QK; b++) {
            kvq_block_q4 blk;
            memcpy(&blk, in + b * sizeof blk, sizeof blk);
            float d = kvq_f16_to_f32(blk.d);
            for (int j = 0; j < KVQ_QK / 2; j++) {
                x[b * KVQ_QK + j] = (float)((blk.qs[j] & 0x0F) - 8) * d;
                x[b * KVQ_QK + j + KVQ_QK / 2] = (float)((blk.qs[j] >> 4) - 8) * d;
            }
        }
        break;
    }
}

void kvq_ref_attention(int n_head, int n_head_kv, int head_dim, float scale, int window,
                       kvq_cache_type type_k, int rotate_k, const void *k,
                       kvq_cache_type type_v, int rotate_v, const void *v, int n_ctx,
                       const float *q, float *out, int pos0, int n) {
    const size_t kb = kvq_kv_row_bytes(type_k, head_dim), vb = kvq_kv_row_bytes(type_v, head_dim);
    const int n_rep = n_head / n_head_kv;
    float *qr = malloc((size_t)head_dim * sizeof *qr);
    float *row = malloc((size_t)head_dim * sizeof *row);
    float *o = malloc((size_t)head_dim * sizeof *o);
    double *acc = malloc((size_t)head_dim * sizeof *acc);
    double *s = malloc((size_t)(pos0 + n) * sizeof *s);
    assert(qr && row && o && acc && s);
    for (int i = 0; i < n; i++) {
        const int pos = pos0 + i;
        assert(pos < n_ctx);
        const int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
        for (int h = 0; h < n_head; h++) {
            const int g = h / n_rep;
            memcpy(qr, q + ((size_t)i * n_head + h) * head_dim, (size_t)head_dim * sizeof *qr);
            /* H is orthonormal, so (Hq)·(Hk) = q·k. */
            if (rotate_k) kvq_ref_hadamard(qr, head_dim);
            double mx = -INFINITY;
            for (int p = lo; p <= pos; p++) {
                kvq_ref_kv_load_row(type_k, (const uint8_t *)k + ((size_t)g * n_ctx + p) * kb, row, head_dim);
                double dot = 0;
                for (int j = 0; j < head_dim; j++) dot += (double)qr[j] * row[j];
                s[p] = dot * scale;
                if (s[p] > mx) mx = s[p];
            }
            double sum = 0;
            for (int j = 0; j < head_dim; j++) acc[j] = 0;
            for (int p = lo; p <= pos; p++) {
                double w = exp(s[p] - mx);
                sum += w;
                kvq_ref_kv_load_row(type_v, (const uint8_t *)v + ((size_t)g * n_ctx + p) * vb, row, head_dim);
                for (int j = 0; j < head_dim; j++) acc[j] += w * row[j];
            }
            for (int j = 0; j < head_dim; j++) o[j] = (float)(acc[j] / sum);
            /* Σ w·(H v) = H(Σ w·v), and H is its own inverse. */
            if (rotate_v) kvq_ref_hadamard(o, head_dim);
            memcpy(out + ((size_t)i * n_head + h) * head_dim, o, (size_t)head_dim * sizeof *o);
        }
    }
    free(qr);
    free(row);
    free(o);
    free(acc);
    free(s);
}
