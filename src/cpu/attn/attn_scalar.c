/* Portable attention kernels: K and V are dequantized one 32-value block at a
 * time into f32 and used by every query row of the group before moving on.
 * The fallback on CPUs without a SIMD path, and the baseline the SIMD
 * kernels are compared with. */
#include <math.h>
#include <string.h>

#include "cpu/attn/attn_kernels.h"
#include "util.h"

/* Block b (32 values) of a cache row as f32. */
static void load_block(kvq_cache_type t, const uint8_t *row, int b, float *x) {
    switch (t) {
    case KVQ_CACHE_F32: memcpy(x, row + (size_t)b * KVQ_QK * 4, KVQ_QK * 4); break;
    case KVQ_CACHE_F16:
        for (int j = 0; j < KVQ_QK; j++) x[j] = kvq_f16_to_f32(kvq_rd_u16(row, (size_t)b * KVQ_QK + j));
        break;
    case KVQ_CACHE_Q8: {
        const uint8_t *blk = row + (size_t)b * sizeof(kvq_block_q8);
        float d = kvq_f16_to_f32(kvq_rd_u16(blk, 0));
        for (int j = 0; j < KVQ_QK; j++) x[j] = (float)(int8_t)blk[2 + j] * d;
        break;
    }
    case KVQ_CACHE_Q4: {
        const uint8_t *blk = row + (size_t)b * sizeof(kvq_block_q4);
        float d = kvq_f16_to_f32(kvq_rd_u16(blk, 0));
        for (int j = 0; j < KVQ_QK / 2; j++) {
            x[j] = (float)((blk[2 + j] & 0x0F) - 8) * d;
            x[j + KVQ_QK / 2] = (float)((blk[2 + j] >> 4) - 8) * d;
        }
        break;
    }
    }
}

static void qk(kvq_cache_type tk, const uint8_t *k, size_t rb, int np, const float *q, const void *prep, int nr,
               int hd, float *s) {
    const int lds = KVQ_ATTN_BP;
    (void)prep;
    float x[KVQ_QK];
    for (int j = 0; j < np; j++) {
        for (int r = 0; r < nr; r++) s[(size_t)r * lds + j] = 0.0f;
        for (int b = 0; b < hd / KVQ_QK; b++) {
            load_block(tk, k + (size_t)j * rb, b, x);
            for (int r = 0; r < nr; r++) {
                const float *qr = q + (size_t)r * hd + b * KVQ_QK;
                float dot = 0.0f;
                for (int i = 0; i < KVQ_QK; i++) dot += qr[i] * x[i];
                s[(size_t)r * lds + j] += dot;
            }
        }
    }
}

static void av(kvq_cache_type tv, const uint8_t *v, size_t rb, int np, const float *w, int nr, int hd, float *acc) {
    const int ldw = KVQ_ATTN_BP;
    float x[KVQ_QK];
    for (int j = 0; j < np; j++)
        for (int b = 0; b < hd / KVQ_QK; b++) {
            load_block(tv, v + (size_t)j * rb, b, x);
            for (int r = 0; r < nr; r++) {
                const float wr = w[(size_t)r * ldw + j];
                float *a = acc + (size_t)r * hd + b * KVQ_QK;
                for (int i = 0; i < KVQ_QK; i++) a[i] += wr * x[i];
            }
        }
}

static float exp_sum(float *x, int n, float m) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    return sum;
}

static float vmax(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

const kvq_attn_kernels kvq_attn_scalar = {
    .qk = qk,
    .av = av,
    .exp_sum = exp_sum,
    .max = vmax,
};
