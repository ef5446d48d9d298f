/* AQLM weights on the CPU: upload (validation, repacking) and the scalar
 * kernels every SIMD path is checked against.
 *
 * Two layouts, picked by code width:
 *  - nbits == 8 ("LUT"): per token we build lut[g][m][c] = codebook[m][c]·x_g
 *    (256 entries per group and codebook), then each output is a sum of G*M
 *    table lookups. Codes are repacked as uint8 [row block][g][m][16 rows] so
 *    one (g, m) step of a 16-row block is one 16-byte load feeding one gather.
 *  - nbits > 8 ("GATHER"): the table would be 2^nbits entries per group, so we
 *    gather the codewords themselves (codebooks pre-converted to f32) and FMA
 *    them with x. Codes are uint16 [row][g][m], already reduced mod 2^nbits. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_matmul_impl.h"
#include "util.h"

static const char *wname(const kvq_weight_desc *d) { return d->name ? d->name : "(unnamed weight)"; }

static int check(const kvq_weight_desc *d) {
    const char *nm = wname(d);
    if (d->n_codebooks < 1 || d->n_codebooks > 8)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: AQLM with %d codebooks (supported: 1..8)", nm, d->n_codebooks);
    if (d->nbits < 8 || d->nbits > 16)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: AQLM with %d-bit codes (supported: 8..16)", nm, d->nbits);
    if (d->in_group != 8 && d->in_group != 16)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: AQLM in_group %d (supported: 8, 16)", nm, d->in_group);
    if (d->cols % d->in_group != 0)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: cols %d not a multiple of AQLM in_group %d", nm, d->cols,
                        d->in_group);
    if ((d->code_bytes != 1 && d->code_bytes != 2) || d->code_bytes * 8 < d->nbits)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: %d-byte AQLM codes cannot hold %d bits", nm, d->code_bytes, d->nbits);
    if (!d->codes || !d->codebooks || !d->scales)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: AQLM weight without codes, codebooks or scales", nm);
    return KVQ_OK;
}

/* Aligned array owned by w (counted in w->bytes); NULL + kvq_fail on failure. */
static void *alloc_for(size_t n, size_t size, kvq_cpu_weight *w, const kvq_weight_desc *d) {
    size_t bytes;
    void *p = kvq_mul_ok(n, size, &bytes) ? kvq_alloc_aligned(bytes ? bytes : 1) : NULL;
    if (!p) {
        kvq_fail(KVQ_ERR_NOMEM, "%s: cannot allocate %zu x %zu bytes for AQLM weight", wname(d), n, size);
        return NULL;
    }
    w->bytes += bytes;
    return p;
}

/* Codes for all rows, reduced mod 2^nbits, into the layout of w->kind. */
static void repack_codes(kvq_cpu_weight *w, const kvq_weight_desc *d) {
    size_t G = (size_t)w->G, M = (size_t)w->M, per_row = G * M;
    uint32_t mask = (1u << d->nbits) - 1u;
    if (w->kind == KVQ_CW_AQLM_LUT) {
        uint8_t *dst = w->codes;
        memset(dst, 0, (size_t)w->rows_pad * per_row); /* padding rows: code 0, scale 0 */
        for (size_t o = 0; o < (size_t)w->rows; o++) {
            uint8_t *blk = dst + (o / KVQ_AQLM_RB) * per_row * KVQ_AQLM_RB + o % KVQ_AQLM_RB;
            for (size_t i = 0; i < per_row; i++) {
                size_t src = o * per_row + i;
                uint32_t c = d->code_bytes == 1 ? ((const uint8_t *)d->codes)[src] : kvq_rd_u16(d->codes, src);
                blk[i * KVQ_AQLM_RB] = (uint8_t)(c & mask);
            }
        }
    } else {
        uint16_t *dst = w->codes;
        size_t total = (size_t)w->rows * per_row;
        for (size_t i = 0; i < total; i++) {
            uint32_t c = d->code_bytes == 1 ? ((const uint8_t *)d->codes)[i] : kvq_rd_u16(d->codes, i);
            dst[i] = (uint16_t)(c & mask);
        }
    }
}

int kvq_cpu_aqlm_init(kvq_cpu_weight *w, const kvq_weight_desc *d) {
    int st = check(d);
    if (st != KVQ_OK) return st;
    w->M = d->n_codebooks;
    w->nbits = d->nbits;
    w->ig = d->in_group;
    w->G = d->cols / d->in_group;
    w->kind = d->nbits == 8 ? KVQ_CW_AQLM_LUT : KVQ_CW_AQLM_GATHER;
    w->rows_pad = (w->rows + KVQ_AQLM_RB - 1) / KVQ_AQLM_RB * KVQ_AQLM_RB;

    size_t K = (size_t)1 << d->nbits, M = (size_t)w->M, ig = (size_t)w->ig;
    size_t n_codes = (size_t)w->rows_pad * (size_t)w->G * M; /* fits: rows*cols already checked */
    /* The caller frees whatever was allocated when we fail half way. */
    if (!(w->codes = alloc_for(n_codes, w->kind == KVQ_CW_AQLM_LUT ? 1 : 2, w, d))) return KVQ_ERR_NOMEM;
    if (!(w->cb = alloc_for(M * K * ig, sizeof(float), w, d))) return KVQ_ERR_NOMEM;
    if (!(w->scales = alloc_for((size_t)w->rows_pad, sizeof(float), w, d))) return KVQ_ERR_NOMEM;
    if (w->kind == KVQ_CW_AQLM_LUT && !(w->cb_t = alloc_for(M * ig * 256, sizeof(float), w, d))) return KVQ_ERR_NOMEM;

    repack_codes(w, d);
    for (size_t i = 0; i < M * K * ig; i++) w->cb[i] = kvq_f16_to_f32(kvq_rd_u16(d->codebooks, i));
    if (w->cb_t)
        for (size_t m = 0; m < M; m++)
            for (size_t c = 0; c < 256; c++)
                for (size_t j = 0; j < ig; j++) w->cb_t[(m * ig + j) * 256 + c] = w->cb[(m * 256 + c) * ig + j];
    for (int o = 0; o < w->rows_pad; o++)
        w->scales[o] = o < w->rows ? kvq_f16_to_f32(kvq_rd_u16(d->scales, (size_t)o)) : 0.0f;
    return KVQ_OK;
}

/* ---- scalar kernels ---- */

void kvq_aqlm_lut_build_scalar(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    int M = w->M, ig = w->ig;
    for (int g = g0; g < g1; g++) {
        const float *xg = x + (size_t)g * ig;
        for (int m = 0; m < M; m++) {
            float *l = lut + ((size_t)g * M + m) * 256;
            const float *cb = w->cb + (size_t)m * 256 * ig;
            for (int c = 0; c < 256; c++) {
                float s = 0.0f;
                for (int j = 0; j < ig; j++) s += cb[c * ig + j] * xg[j];
                l[c] = s;
            }
        }
    }
}

void kvq_aqlm_lut_gemv_scalar(const kvq_cpu_weight *w, const float *lut, float *y, int b0, int b1) {
    size_t step = (size_t)w->G * w->M * KVQ_AQLM_RB;
    for (int b = b0; b < b1; b++) {
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)b * step;
        float acc[KVQ_AQLM_RB] = {0};
        for (int g = 0; g < w->G; g++) {
            for (int m = 0; m < w->M; m++, c += KVQ_AQLM_RB) {
                const float *l = lut + ((size_t)g * w->M + m) * 256;
                for (int r = 0; r < KVQ_AQLM_RB; r++) acc[r] += l[c[r]];
            }
        }
        for (int r = 0; r < KVQ_AQLM_RB; r++) {
            int o = b * KVQ_AQLM_RB + r;
            if (o < w->rows) y[o] = w->scales[o] * acc[r];
        }
    }
}

void kvq_aqlm_gather_gemv_scalar(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1) {
    size_t K = (size_t)1 << w->nbits, ig = (size_t)w->ig, M = (size_t)w->M;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * w->G * M;
        float acc = 0.0f;
        for (size_t g = 0; g < (size_t)w->G; g++, c += M) {
            const float *xg = x + g * ig;
            for (size_t m = 0; m < M; m++) {
                const float *cw = w->cb + (m * K + c[m]) * ig;
                for (size_t j = 0; j < ig; j++) acc += cw[j] * xg[j];
            }
        }
        y[o] = w->scales[o] * acc;
    }
}

void kvq_aqlm_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out) {
    size_t K = (size_t)1 << w->nbits, ig = (size_t)w->ig;
    for (int o = r0; o < r1; o++) {
        float *dst = out + (size_t)(o - r0) * w->cols, s = w->scales[o];
        for (size_t g = 0; g < (size_t)w->G; g++) {
            for (size_t j = 0; j < ig; j++) {
                float v = 0.0f;
                for (int m = 0; m < w->M; m++) v += w->cb[((size_t)m * K + kvq_cw_code(w, (size_t)o, g, (size_t)m)) * ig + j];
                dst[g * ig + j] = s * v;
            }
        }
    }
}
