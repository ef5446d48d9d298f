/* Vulkan weights: checks, upload to device-local buffers (split by rows when a
 * tensor exceeds b->max_buffer), AQLM code repacking, sizes. The layout is
 * described in vk_weights.h; vk_matmul.c runs it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vulkan/vk_weights.h"

/* Dense rows of a piece are rounded to this many values. */
#define ROW_PAD 8
/* Shader grid limits: mm_dense_vec and mm_tile cover 64 rows per workgroup, mm_lut
 * 1024, get_rows one id per group along y (at least 65535 groups on every device). */
#define MAX_PIECE_ROWS (64 * 65535)
/* Shared memory the AQLM shaders need (mm_lut: 16 KiB table + staged x). */
#define AQLM_SHARED_BYTES (20 * 1024 + 512) /* + the fused norm's 64 floats (shaders/mm_fuse.glsl) */
/* Host batch for padded dense uploads. */
#define UPLOAD_BATCH (4u << 20)

static size_t dense_size(kvq_wformat f) { return f == KVQ_W_F32 ? 4 : 2; }
static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* Bytes of one stored row in a piece. */
static size_t row_bytes(const kvq_weight_desc *d) {
    if (d->fmt != KVQ_W_AQLM) return round_up((size_t)d->cols, ROW_PAD) * dense_size(d->fmt);
    size_t cs = d->nbits > 8 ? 2 : 1, codes = (size_t)(d->cols / d->in_group) * (size_t)d->n_codebooks;
    return round_up(codes * cs, 16);
}

static size_t codebook_bytes(const kvq_weight_desc *d) {
    return (size_t)d->n_codebooks * ((size_t)1 << d->nbits) * (size_t)d->in_group * 2;
}

/* Why this backend cannot run d (written to why), or NULL when it can. */
static const char *unsupported(kvq_bctx *b, const kvq_weight_desc *d, char *why, size_t n) {
    if (d->rows < 1 || d->cols < 1) return snprintf(why, n, "empty shape %dx%d", d->rows, d->cols), why;
    if (d->fmt != KVQ_W_F32 && d->fmt != KVQ_W_F16 && d->fmt != KVQ_W_BF16 && d->fmt != KVQ_W_AQLM)
        return snprintf(why, n, "unknown weight format %d", (int)d->fmt), why;
    if (d->bias && d->bias_fmt != KVQ_W_F32 && d->bias_fmt != KVQ_W_F16 && d->bias_fmt != KVQ_W_BF16)
        return snprintf(why, n, "bias format %d is not dense", (int)d->bias_fmt), why;
    if (d->fmt == KVQ_W_AQLM) {
        int M = d->n_codebooks;
        if (M != 1 && M != 2 && M != 4 && M != 8)
            return snprintf(why, n, "AQLM with %d codebooks (the Vulkan shaders take 1, 2, 4 or 8)", M), why;
        if (d->nbits < 8 || d->nbits > 16)
            return snprintf(why, n, "AQLM with %d-bit codebooks (the Vulkan shaders take 8..16)", d->nbits), why;
        if (d->in_group != 8 && d->in_group != 16)
            return snprintf(why, n, "AQLM in_group_size %d (the Vulkan shaders take 8 or 16)", d->in_group), why;
        if (d->cols % d->in_group) return snprintf(why, n, "cols %d not a multiple of in_group %d", d->cols, d->in_group), why;
        if ((d->code_bytes != 1 && d->code_bytes != 2) || (d->nbits > 8 && d->code_bytes != 2))
            return snprintf(why, n, "%d-byte codes for %d-bit codebooks", d->code_bytes, d->nbits), why;
        if (b->props.limits.maxComputeSharedMemorySize < AQLM_SHARED_BYTES)
            return snprintf(why, n, "device has %u bytes of shared memory, the AQLM shaders need %d",
                            b->props.limits.maxComputeSharedMemorySize, AQLM_SHARED_BYTES), why;
        /* the codebook is bound whole: it must fit the device's real limit (it is never
         * split, so KVQ_VK_MAX_BUFFER does not apply to it) */
        if (codebook_bytes(d) > b->props.limits.maxStorageBufferRange)
            return snprintf(why, n, "codebook of %zu bytes exceeds the device's storage buffer range %u",
                            codebook_bytes(d), b->props.limits.maxStorageBufferRange), why;
    }
    if (row_bytes(d) > b->max_buffer)
        return snprintf(why, n, "one row takes %zu bytes, more than the largest buffer (%llu)", row_bytes(d),
                        (unsigned long long)b->max_buffer), why;
    return NULL;
}

int kvq_vk_weight_supported(kvq_bctx *b, const kvq_weight_desc *d) {
    char why[256];
    return unsupported(b, d, why, sizeof why) == NULL;
}

void kvq_vk_weight_free(kvq_bctx *b, kvq_wt *w) {
    if (!w) return;
    for (int i = 0; i < w->n_pieces; i++)
        if (w->pieces[i].buf != w->vec) vk_buf_free(b, w->pieces[i].buf); /* norm gains share it */
    free(w->pieces);
    vk_buf_free(b, w->codebooks);
    vk_buf_free(b, w->scales);
    vk_buf_free(b, w->bias);
    vk_buf_free(b, w->vec);
    free(w);
}

size_t kvq_vk_weight_bytes(kvq_bctx *b, const kvq_wt *w) {
    (void)b;
    return w ? w->bytes : 0;
}

/* Norm gains, one row or one per head (q/k norms): the weights that get an f32 copy
 * (w->vec), as the CPU backend keeps one. */
static int small_dense(const kvq_weight_desc *d) {
    return d->rows == 1 || (d->rows <= 128 && (size_t)d->rows * d->cols <= ((size_t)1 << 20));
}

vk_bind kvq_vk_weight_vec(const kvq_wt *w) {
    /* only norm gains (small dense weights) carry the f32 copy; anything else is a caller bug,
     * answered with the first piece so the binding is at least valid */
    return w->vec ? vk_whole(w->vec) : vk_whole(w->pieces[0].buf);
}

/* Allocates and uploads n bytes (src may be NULL: upload later). Sets kvq_fail naming
 * the tensor on failure. */
static kvq_buf *new_buf(kvq_bctx *b, const kvq_weight_desc *d, const char *what, size_t n, const void *src) {
    kvq_buf *x = vk_buf_new(b, n, 0);
    if (!x) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", kvq_last_error());
        kvq_fail(KVQ_ERR_NOMEM, "%s: cannot allocate %zu bytes of device memory for its %s (%s)", d->name, n, what, msg);
        return NULL;
    }
    if (src && vk_upload_now(b, x, 0, src, n) != KVQ_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", kvq_last_error());
        kvq_fail(KVQ_ERR_BACKEND, "%s: upload of its %s failed (%s)", d->name, what, msg);
        vk_buf_free(b, x);
        return NULL;
    }
    return x;
}

static kvq_status upload_fail(const kvq_weight_desc *d, const char *what) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", kvq_last_error());
    return kvq_fail(KVQ_ERR_BACKEND, "%s: upload of its %s failed (%s)", d->name, what, msg);
}

static float dense_at(kvq_wformat f, const void *p, size_t i) {
    if (f == KVQ_W_F32) return kvq_rd_f32(p, i);
    uint16_t h = kvq_rd_u16(p, i);
    return f == KVQ_W_F16 ? kvq_f16_to_f32(h) : kvq_bf16_to_f32(h);
}

/* f32 copy of a dense [count] array (bias, scales, norm gains) on the device. */
static kvq_buf *f32_buf(kvq_bctx *b, const kvq_weight_desc *d, const char *what, kvq_wformat f, const void *src,
                        size_t count) {
    float *tmp = malloc(count * sizeof *tmp);
    if (!tmp) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of host memory", d->name), NULL;
    for (size_t i = 0; i < count; i++) tmp[i] = dense_at(f, src, i);
    kvq_buf *x = new_buf(b, d, what, count * sizeof *tmp, tmp);
    free(tmp);
    return x;
}

/* Dense piece: rows row0.. with the stride padded; straight from the mapping when no
 * padding is needed, else through a host batch. */
static kvq_status fill_dense(kvq_bctx *b, const kvq_weight_desc *d, const kvq_wt *w, vk_piece *p) {
    size_t es = dense_size(d->fmt), src_row = (size_t)d->cols * es, dst_row = (size_t)w->stride * es;
    const char *src = (const char *)d->data + (size_t)p->row0 * src_row;
    if (src_row == dst_row) {
        if (vk_upload_now(b, p->buf, 0, src, (size_t)p->rows * dst_row) != KVQ_OK)
            return upload_fail(d, "rows");
        return KVQ_OK;
    }
    size_t batch = UPLOAD_BATCH / dst_row;
    if (batch < 1) batch = 1;
    if (batch > (size_t)p->rows) batch = (size_t)p->rows;
    char *tmp = calloc(batch, dst_row);
    if (!tmp) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of host memory", d->name);
    for (size_t r0 = 0; r0 < (size_t)p->rows; r0 += batch) {
        size_t nr = (size_t)p->rows - r0 < batch ? (size_t)p->rows - r0 : batch;
        for (size_t r = 0; r < nr; r++) memcpy(tmp + r * dst_row, src + (r0 + r) * src_row, src_row);
        if (vk_upload_now(b, p->buf, r0 * dst_row, tmp, nr * dst_row) != KVQ_OK) {
            free(tmp);
            return upload_fail(d, "rows");
        }
    }
    free(tmp);
    return KVQ_OK;
}

/* AQLM piece: codes reduced mod 2^nbits, repacked into 16-byte chunks, chunk-major.
 * Checkpoints whose codes already have the stored width (int8 for 8 bits, int16 for
 * 16) only move 16-byte runs; other widths go code by code. */
static kvq_status fill_aqlm(kvq_bctx *b, const kvq_weight_desc *d, const kvq_wt *w, vk_piece *p) {
    size_t rows = (size_t)p->rows, n_codes = (size_t)(d->cols / d->in_group) * (size_t)d->n_codebooks;
    size_t per = 16 / (size_t)w->cs, src_row = n_codes * (size_t)d->code_bytes;
    uint8_t *tmp = calloc(rows * (size_t)w->n_chunks, 16);
    if (!tmp) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of host memory", d->name);
    int same = d->code_bytes == w->cs && d->nbits == 8 * w->cs;
    uint32_t mask = (1u << d->nbits) - 1u;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)d->codes + ((size_t)p->row0 + r) * src_row;
        if (same) {
            for (size_t c = 0; c < (size_t)w->n_chunks; c++) {
                size_t off = c * 16, len = src_row - off < 16 ? src_row - off : 16;
                memcpy(tmp + (c * rows + r) * 16, src + off, len);
            }
            continue;
        }
        for (size_t q = 0; q < n_codes; q++) {
            uint32_t v = d->code_bytes == 1 ? src[q] : (uint32_t)src[2 * q] | (uint32_t)src[2 * q + 1] << 8;
            v &= mask;
            uint8_t *dst = tmp + ((q / per) * rows + r) * 16 + (q % per) * (size_t)w->cs;
            dst[0] = (uint8_t)v;
            if (w->cs == 2) dst[1] = (uint8_t)(v >> 8);
        }
    }
    kvq_status s = vk_upload_now(b, p->buf, 0, tmp, rows * (size_t)w->n_chunks * 16);
    free(tmp);
    return s == KVQ_OK ? KVQ_OK : upload_fail(d, "codes");
}

/* Largest sum |c_j| over the codewords of all codebooks. */
static float codeword_l1_max(const kvq_weight_desc *d) {
    size_t words = (size_t)d->n_codebooks << d->nbits;
    float best = 0;
    for (size_t c = 0; c < words; c++) {
        float s = 0;
        for (int j = 0; j < d->in_group; j++) {
            float v = kvq_f16_to_f32(kvq_rd_u16(d->codebooks, c * (size_t)d->in_group + (size_t)j));
            s += v < 0 ? -v : v;
        }
        if (s > best || s != s) best = s; /* a NaN codeword keeps NaN: the shader then scales by 1 */
    }
    return best;
}

kvq_wt *kvq_vk_weight_upload(kvq_bctx *b, const kvq_weight_desc *d) {
    char why[256];
    if (unsupported(b, d, why, sizeof why)) {
        kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: the Vulkan backend cannot run this weight: %s", d->name, why);
        return NULL;
    }
    kvq_wt *w = calloc(1, sizeof *w);
    if (!w) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of host memory", d->name), NULL;
    w->fmt = d->fmt;
    w->rows = d->rows;
    w->cols = d->cols;
    w->stride = (int)round_up((size_t)d->cols, ROW_PAD);
    if (d->fmt == KVQ_W_AQLM) {
        w->M = d->n_codebooks;
        w->nbits = d->nbits;
        w->ig = d->in_group;
        w->cs = d->nbits > 8 ? 2 : 1;
        w->n_chunks = (int)(row_bytes(d) / 16);
        w->lut16 = d->nbits == 8 && b->caps.fp16 && !b->exact;
        w->cb_l1 = codeword_l1_max(d);
    }
    if (d->fmt != KVQ_W_AQLM && !d->bias && small_dense(d) && d->cols % ROW_PAD == 0 &&
        (size_t)d->rows * d->cols * 4 <= b->max_buffer) {
        /* norm gains: one f32 copy serves the norms (vec) and any matmul (as f32 rows) */
        size_t count = (size_t)d->rows * d->cols;
        w->pieces = calloc(1, sizeof *w->pieces);
        if (!w->pieces || !(w->vec = f32_buf(b, d, "f32 copy", d->fmt, d->data, count))) {
            kvq_vk_weight_free(b, w);
            return NULL;
        }
        w->fmt = KVQ_W_F32;
        w->n_pieces = 1;
        w->pieces[0] = (vk_piece){w->vec, 0, d->rows};
        w->bytes = count * 4;
        return w;
    }
    size_t rb = row_bytes(d), per = b->max_buffer / rb;
    if (per > MAX_PIECE_ROWS) per = MAX_PIECE_ROWS;
    w->n_pieces = (int)(((size_t)d->rows + per - 1) / per);
    w->pieces = calloc((size_t)w->n_pieces, sizeof *w->pieces);
    if (!w->pieces) {
        free(w);
        return kvq_fail(KVQ_ERR_NOMEM, "%s: out of host memory", d->name), NULL;
    }
    for (int i = 0; i < w->n_pieces; i++) {
        vk_piece *p = &w->pieces[i];
        p->row0 = (int)((size_t)i * per);
        p->rows = d->rows - p->row0 < (int)per ? d->rows - p->row0 : (int)per;
        p->buf = new_buf(b, d, "rows", (size_t)p->rows * rb, NULL);
        if (!p->buf) goto fail;
        w->bytes += (size_t)p->rows * rb;
        if ((d->fmt == KVQ_W_AQLM ? fill_aqlm(b, d, w, p) : fill_dense(b, d, w, p)) != KVQ_OK) goto fail;
    }
    if (d->fmt == KVQ_W_AQLM) {
        if (!(w->codebooks = new_buf(b, d, "codebooks", codebook_bytes(d), d->codebooks))) goto fail;
        if (!(w->scales = f32_buf(b, d, "scales", KVQ_W_F16, d->scales, (size_t)d->rows))) goto fail;
        w->bytes += codebook_bytes(d) + (size_t)d->rows * 4;
    }
    if (d->bias) {
        if (!(w->bias = f32_buf(b, d, "bias", d->bias_fmt, d->bias, (size_t)d->rows))) goto fail;
        w->bytes += (size_t)d->rows * 4;
    }
    if (d->fmt != KVQ_W_AQLM && small_dense(d)) {
        size_t count = (size_t)d->rows * d->cols;
        if (!(w->vec = f32_buf(b, d, "f32 copy", d->fmt, d->data, count))) goto fail;
        w->bytes += count * 4;
    }
    return w;
fail:
    kvq_vk_weight_free(b, w);
    return NULL;
}
