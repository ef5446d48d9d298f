/* The CPU backend: fills the kvq_backend table with host memory and the
 * kernels of cpu_kernels.h. Ops run immediately, so buf_read is a memcpy. */
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "util.h"

struct kvq_bctx {
    int n_threads;
    int aqlm_cb8;  /* kvq_backend_opts.aqlm_cb8, passed to every weight */
    int aqlm_lut8; /* kvq_backend_opts.aqlm_lut8, likewise */
    int aqlm_i8;   /* kvq_backend_opts.aqlm_i8, likewise */
    int exact;     /* kvq_backend_opts.exact, likewise */
    kvq_status err; /* first failure of an op since the last buf_read (ops cannot fail individually) */
    char err_msg[256]; /* its message, for buf_read to report */
    char desc[256];
};

/* Keeps the first failure of an op (and its one-line message) for the next buf_read. */
static void cpu_error(kvq_bctx *b, kvq_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cpu_error(kvq_bctx *b, kvq_status s, const char *fmt, ...) {
    if (b->err) return;
    b->err = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err_msg, sizeof b->err_msg, fmt, ap);
    va_end(ap);
}

struct kvq_buf {
    size_t bytes;
    float *data;
};

struct kvq_wt {
    kvq_cpu_weight *w;
    float *vec; /* f32 copy of a small dense weight (norm gains), NULL otherwise */
};

struct kvq_kvbuf {
    kvq_kv_desc d;
    int hd_row; /* values per stored row: head_dim rounded up to whole 32-value blocks */
    size_t row_k, row_v;
    uint8_t *k, *v; /* [layer][kv head][n_ctx] rows */
};

static kvq_status cpu_init(const kvq_backend_opts *o, kvq_bctx **out) {
    kvq_bctx *b = calloc(1, sizeof *b);
    if (!b) return kvq_fail(KVQ_ERR_NOMEM, "cpu backend: out of memory");
    b->n_threads = o && o->n_threads > 0 ? o->n_threads : omp_get_num_procs();
    b->aqlm_cb8 = o && o->aqlm_cb8;
    b->aqlm_lut8 = o && o->aqlm_lut8;
    /* aqlm_i8: 1 (auto) where this CPU class decodes faster with it, 2 always; exact means
     * exact everywhere; cb8 is asked for */
    int i8 = !o || o->exact || o->aqlm_cb8 ? 0 : o->aqlm_i8 >= 2 ? 2 : o->aqlm_i8 == 1 && kvq_cpu_i8_wins();
    b->aqlm_i8 = i8 != 0;
    b->exact = o && o->exact;
    char kn[160];
    kvq_cpu_kernel_names(kn, sizeof kn, b->aqlm_cb8 ? 0 : i8);
    snprintf(b->desc, sizeof b->desc, "cpu: %d threads, %s; %s%s%s%s", b->n_threads, kvq_cpu_class_name(), kn,
             b->aqlm_cb8 ? ", int8 AQLM codebooks" : "", b->aqlm_lut8 ? ", int8 AQLM tables" : "",
             b->exact ? ", exact prompts" : "");
    *out = b;
    return KVQ_OK;
}

static void cpu_release(kvq_bctx *b) { free(b); }
static const char *cpu_describe(kvq_bctx *b) { return b->desc; }

static kvq_buf *cpu_buf_new(kvq_bctx *b, size_t bytes) {
    kvq_buf *buf = calloc(1, sizeof *buf);
    if (buf) buf->data = kvq_alloc_aligned(bytes);
    if (!buf || !buf->data) {
        free(buf);
        kvq_fail(KVQ_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    buf->bytes = bytes;
    return buf;
}

static void cpu_buf_free(kvq_bctx *b, kvq_buf *buf) {
    if (!buf) return;
    kvq_free_aligned(buf->data);
    free(buf);
}

static void cpu_buf_write(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n) {
    memcpy((char *)dst->data + off, src, n);
}

static kvq_status cpu_buf_read(kvq_bctx *b, const kvq_buf *src, size_t off, void *dst, size_t n) {
    if (b->err) {
        kvq_status s = b->err;
        b->err = KVQ_OK;
        return kvq_fail(s, "%s", b->err_msg);
    }
    if (off > src->bytes || n > src->bytes - off) return kvq_fail(KVQ_ERR_ARG, "cpu backend: read past buffer end");
    memcpy(dst, (const char *)src->data + off, n);
    return KVQ_OK;
}

static kvq_wt *cpu_weight_upload(kvq_bctx *b, const kvq_weight_desc *d) {
    kvq_wt *w = calloc(1, sizeof *w);
    if (!w) {
        kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", d->name);
        return NULL;
    }
    kvq_weight_desc dd = *d;
    dd.cb8 = b->aqlm_cb8;
    dd.lut8 = b->aqlm_lut8;
    dd.i8 = b->aqlm_i8;
    dd.exact = b->exact;
    w->w = kvq_cpu_weight_new(&dd);
    /* f32 copies of small dense tensors: norm gains (one row, or one per head for q/k norms) */
    int small = d->rows == 1 || (d->fmt != KVQ_W_AQLM && d->rows <= 128 && (size_t)d->rows * d->cols <= ((size_t)1 << 20));
    if (w->w && small) {
        w->vec = kvq_alloc_aligned((size_t)d->rows * d->cols * sizeof(float));
        if (w->vec)
            for (int r = 0; r < d->rows; r++) kvq_cpu_weight_row(w->w, r, w->vec + (size_t)r * d->cols);
        else
            kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", d->name);
    }
    if (!w->w || (small && !w->vec)) {
        if (w->w) kvq_cpu_weight_free(w->w);
        free(w);
        return NULL;
    }
    return w;
}

static void cpu_weight_free(kvq_bctx *b, kvq_wt *w) {
    if (!w) return;
    kvq_cpu_weight_free(w->w);
    kvq_free_aligned(w->vec);
    free(w);
}

static size_t cpu_weight_bytes(kvq_bctx *b, const kvq_wt *w) { return kvq_cpu_weight_bytes(w->w); }

/* The attention kernels take rows in whole blocks of 32 values. A head_dim with a
 * tail (80: Phi-2; only f32/f16 caches, the context refuses q8/q4 there) is stored
 * zero-padded to the next block, and queries are padded the same way: the zeros
 * add nothing to q·k, and the padded lanes of the output are dropped. */
static int cpu_kv_row_values(int head_dim) { return (head_dim + KVQ_QK - 1) / KVQ_QK * KVQ_QK; }

static kvq_kvbuf *cpu_kv_new(kvq_bctx *b, const kvq_kv_desc *d) {
    if (d->head_dim % KVQ_QK && (d->type_k >= KVQ_CACHE_Q8 || d->type_v >= KVQ_CACHE_Q8)) {
        kvq_fail(KVQ_ERR_UNSUPPORTED, "cpu backend: a q8/q4 KV cache needs head_dim to be a multiple of %d (model has %d)",
                 KVQ_QK, d->head_dim);
        return NULL;
    }
    kvq_kvbuf *kv = calloc(1, sizeof *kv);
    if (!kv) goto oom;
    kv->d = *d;
    kv->hd_row = cpu_kv_row_values(d->head_dim);
    kv->row_k = kvq_kv_row_bytes(d->type_k, kv->hd_row);
    kv->row_v = kvq_kv_row_bytes(d->type_v, kv->hd_row);
    size_t rows, bk, bv;
    if (!kvq_mul_ok((size_t)d->n_layer * d->n_head_kv, (size_t)d->n_ctx, &rows) || !kvq_mul_ok(rows, kv->row_k, &bk) ||
        !kvq_mul_ok(rows, kv->row_v, &bv))
        goto oom;
    kv->k = kvq_alloc_aligned(bk);
    kv->v = kvq_alloc_aligned(bv);
    if (!kv->k || !kv->v) goto oom;
    return kv;
oom:
    if (kv) {
        kvq_free_aligned(kv->k);
        kvq_free_aligned(kv->v);
        free(kv);
    }
    kvq_fail(KVQ_ERR_NOMEM, "cpu backend: cannot allocate the KV cache (%d positions)", d->n_ctx);
    return NULL;
}

static size_t cpu_kv_bytes(kvq_bctx *b, const kvq_kv_desc *d, int positions) {
    const int hd = cpu_kv_row_values(d->head_dim);
    size_t row = kvq_kv_row_bytes(d->type_k, hd) + kvq_kv_row_bytes(d->type_v, hd);
    return (size_t)d->n_layer * d->n_head_kv * (size_t)positions * row;
}

static void cpu_kv_free(kvq_bctx *b, kvq_kvbuf *kv) {
    if (!kv) return;
    kvq_free_aligned(kv->k);
    kvq_free_aligned(kv->v);
    free(kv);
}

/* kv_read / kv_write: rows as stored, less the zero padding to whole 32-value blocks that
 * f16/f32 rows of an odd-sized head carry here (q8/q4 rows have none). */
static uint8_t *kv_row_at(const kvq_kvbuf *kv, int layer, int v, int h, int pos, size_t *row_bytes) {
    const kvq_kv_desc *d = &kv->d;
    size_t row = ((size_t)layer * d->n_head_kv + (size_t)h) * d->n_ctx + (size_t)pos;
    *row_bytes = v ? kv->row_v : kv->row_k;
    return (v ? kv->v : kv->k) + row * *row_bytes;
}

static kvq_status kv_range_ok(const kvq_kvbuf *kv, int layer, int pos0, int n) {
    const kvq_kv_desc *d = &kv->d;
    if (layer < 0 || layer >= d->n_layer || pos0 < 0 || n < 0 || n > d->n_ctx - pos0)
        return kvq_fail(KVQ_ERR_ARG, "cpu backend: KV rows %d..%d of layer %d are outside the cache", pos0, pos0 + n, layer);
    return KVQ_OK;
}

static kvq_status cpu_kv_read(kvq_bctx *b, const kvq_kvbuf *kv, int layer, int v, int pos0, int n, void *dst) {
    (void)b;
    kvq_status s = kv_range_ok(kv, layer, pos0, n);
    if (s) return s;
    const size_t rb = kvq_kv_row_bytes(v ? kv->d.type_v : kv->d.type_k, kv->d.head_dim);
    uint8_t *out = dst;
    for (int h = 0; h < kv->d.n_head_kv; h++)
        for (int p = 0; p < n; p++, out += rb) {
            size_t stored;
            memcpy(out, kv_row_at(kv, layer, v, h, pos0 + p, &stored), rb);
        }
    return KVQ_OK;
}

static kvq_status cpu_kv_write(kvq_bctx *b, kvq_kvbuf *kv, int layer, int v, int pos0, int n, const void *src) {
    (void)b;
    kvq_status s = kv_range_ok(kv, layer, pos0, n);
    if (s) return s;
    const size_t rb = kvq_kv_row_bytes(v ? kv->d.type_v : kv->d.type_k, kv->d.head_dim);
    const uint8_t *in = src;
    for (int h = 0; h < kv->d.n_head_kv; h++)
        for (int p = 0; p < n; p++, in += rb) {
            size_t stored;
            uint8_t *row = kv_row_at(kv, layer, v, h, pos0 + p, &stored);
            memcpy(row, in, rb);
            memset(row + rb, 0, stored - rb);
        }
    return KVQ_OK;
}

static void cpu_get_rows(kvq_bctx *b, const kvq_wt *w, const int32_t *ids, int n, kvq_buf *out) {
    int cols = kvq_cpu_weight_cols(w->w);
#pragma omp parallel for num_threads(b->n_threads) if (n > 1)
    for (int i = 0; i < n; i++) kvq_cpu_weight_row(w->w, ids[i], out->data + (size_t)i * cols);
}

static void cpu_matmul(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n) {
    kvq_cpu_matmul(w->w, x->data, y->data, n, b->n_threads);
}

static void cpu_rms_norm(kvq_bctx *b, const kvq_buf *x, const kvq_wt *g, kvq_buf *y, int n, int dim, float eps) {
#pragma omp parallel for num_threads(b->n_threads) if (n > 1)
    for (int t = 0; t < n; t++) {
        const float *xr = x->data + (size_t)t * dim;
        float *yr = y->data + (size_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) yr[i] = xr[i] * inv * g->vec[i];
    }
}

static void cpu_rope(kvq_bctx *b, kvq_buf *x, int n, int n_heads, int head_dim, int pos0, const float *inv_freq, int mode) {
    int half = head_dim / 2, pairs = mode == KVQ_ROPE_PAIRS;
#pragma omp parallel for num_threads(b->n_threads) if (n > 1)
    for (int t = 0; t < n; t++) {
        /* cos/sin for a chunk of frequencies, shared by all heads of the token */
        float cs[2 * 256];
        for (int i0 = 0; i0 < half; i0 += 256) {
            int cnt = half - i0 < 256 ? half - i0 : 256;
            for (int i = 0; i < cnt; i++) {
                double ang = (double)(pos0 + t) * inv_freq[i0 + i];
                cs[2 * i] = (float)cos(ang);
                cs[2 * i + 1] = (float)sin(ang);
            }
            for (int h = 0; h < n_heads; h++) {
                float *v = x->data + ((size_t)t * n_heads + h) * head_dim;
                for (int i = 0; i < cnt; i++) {
                    int j = i0 + i, ja = pairs ? 2 * j : j, jb = pairs ? 2 * j + 1 : j + half;
                    float a = v[ja], c = v[jb];
                    v[ja] = a * cs[2 * i] - c * cs[2 * i + 1];
                    v[jb] = c * cs[2 * i] + a * cs[2 * i + 1];
                }
            }
        }
    }
}

static void cpu_layer_norm(kvq_bctx *b, const kvq_buf *x, const kvq_wt *g, kvq_buf *y, int n, int dim, float eps, int g_rows) {
#pragma omp parallel for num_threads(b->n_threads) if (n > 1)
    for (int t = 0; t < n; t++) {
        const float *xr = x->data + (size_t)t * dim, *gr = g->vec + (size_t)(t % g_rows) * dim;
        float *yr = y->data + (size_t)t * dim;
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++) mean += xr[i];
        mean /= dim;
        for (int i = 0; i < dim; i++) var += (xr[i] - mean) * (xr[i] - mean);
        float inv = (float)(1.0 / sqrt(var / dim + eps)), mf = (float)mean;
        for (int i = 0; i < dim; i++) yr[i] = (xr[i] - mf) * inv * gr[i];
    }
}

static void cpu_swiglu(kvq_bctx *b, kvq_buf *gate, const kvq_buf *up, size_t count) {
    float *g = gate->data;
    const float *u = up->data;
#pragma omp parallel for num_threads(b->n_threads) if (count > 4096)
    for (size_t i = 0; i < count; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_geglu(kvq_bctx *b, kvq_buf *gate, const kvq_buf *up, size_t count) {
    float *g = gate->data;
    const float *u = up->data;
#pragma omp parallel for num_threads(b->n_threads) if (count > 4096)
    for (size_t i = 0; i < count; i++) {
        float v = g[i];
        g[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))) * u[i];
    }
}

static void cpu_add(kvq_bctx *b, kvq_buf *acc, const kvq_buf *x, size_t count) {
    float *a = acc->data;
    const float *v = x->data;
    for (size_t i = 0; i < count; i++) a[i] += v[i];
}

static void cpu_scale(kvq_bctx *b, kvq_buf *x, size_t count, float s) {
    float *a = x->data;
    for (size_t i = 0; i < count; i++) a[i] *= s;
}

static void cpu_copy(kvq_bctx *b, const kvq_buf *src, size_t so, kvq_buf *dst, size_t dof, size_t bytes) {
    memmove((char *)dst->data + dof, (const char *)src->data + so, bytes);
}

static void cpu_copy_rows(kvq_bctx *b, const kvq_buf *src, size_t so, size_t ss, kvq_buf *dst, size_t dof, size_t ds,
                          size_t row_bytes, int rows) {
    for (int r = 0; r < rows; r++)
        memmove((char *)dst->data + dof + (size_t)r * ds, (const char *)src->data + so + (size_t)r * ss, row_bytes);
}

/* Rows are grouped by expert: each expert's rows are gathered, go through one batched
 * matmul (its codes stream once) and are scattered back. */
static void cpu_matmul_routed(kvq_bctx *b, const kvq_wt *const *w, int n_w, const kvq_buf *x, kvq_buf *y, int n,
                              const int32_t *route, int x_div) {
    if (b->err) return;
    const int cols = kvq_cpu_weight_cols(w[0]->w), rows = kvq_cpu_weight_rows(w[0]->w);
    int *sel = malloc(sizeof(int) * (size_t)n);
    float *xs = kvq_alloc_aligned(sizeof(float) * (size_t)n * cols), *ys = kvq_alloc_aligned(sizeof(float) * (size_t)n * rows);
    if (!sel || !xs || !ys) {
        cpu_error(b, KVQ_ERR_NOMEM, "matmul_routed: out of memory for %d rows", n);
        goto done;
    }
    for (int r = 0; r < n; r++)
        if (route[r] < 0 || route[r] >= n_w) {
            cpu_error(b, KVQ_ERR_ARG, "matmul_routed: route %d names expert %d of %d", r, route[r], n_w);
            goto done;
        }
    for (int e = 0; e < n_w; e++) {
        int cnt = 0;
        for (int r = 0; r < n; r++)
            if (route[r] == e) sel[cnt++] = r;
        if (!cnt) continue;
        for (int i = 0; i < cnt; i++)
            memcpy(xs + (size_t)i * cols, x->data + (size_t)(sel[i] / x_div) * cols, sizeof(float) * cols);
        kvq_cpu_matmul(w[e]->w, xs, ys, cnt, b->n_threads);
        for (int i = 0; i < cnt; i++) memcpy(y->data + (size_t)sel[i] * rows, ys + (size_t)i * rows, sizeof(float) * rows);
    }
done:
    free(sel);
    kvq_free_aligned(xs);
    kvq_free_aligned(ys);
}

static void cpu_add_weighted(kvq_bctx *b, kvq_buf *acc, const kvq_buf *src, const float *wts, int n, int k, int dim) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) {
            const float *s = src->data + ((size_t)i * k + j) * dim;
            float *a = acc->data + (size_t)i * dim, wt = wts[i * k + j];
            for (int c = 0; c < dim; c++) a[c] += wt * s[c];
        }
}

/* Rows of n tokens × heads at head_dim hd, copied to width hd_row with zeros after
 * each (see cpu_kv_row_values); NULL when out of memory. */
static float *pad_rows(const float *x, size_t rows, int hd, int hd_row) {
    float *p = malloc(rows * (size_t)hd_row * sizeof *p);
    if (!p) return NULL;
    for (size_t r = 0; r < rows; r++) {
        memcpy(p + r * hd_row, x + r * hd, (size_t)hd * sizeof *p);
        memset(p + r * hd_row + hd, 0, (size_t)(hd_row - hd) * sizeof *p);
    }
    return p;
}

static void cpu_kv_store(kvq_bctx *b, kvq_kvbuf *kv, int layer, const kvq_buf *k, const kvq_buf *v, int pos0, int n) {
    const kvq_kv_desc *d = &kv->d;
    size_t layer_rows = (size_t)d->n_head_kv * d->n_ctx;
    const int hd = kv->hd_row, nh = d->n_head_kv;
    const float *kd = k->data, *vd = v->data;
    float *kp = NULL, *vp = NULL;
    if (hd != d->head_dim) {
        kd = kp = pad_rows(k->data, (size_t)n * nh, d->head_dim, hd);
        vd = vp = pad_rows(v->data, (size_t)n * nh, d->head_dim, hd);
        if (!kp || !vp) {
            cpu_error(b, KVQ_ERR_NOMEM, "cpu backend: out of memory padding %d KV rows", n * nh);
            goto done;
        }
    }
#pragma omp parallel for collapse(2) num_threads(b->n_threads) if (n > 1)
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < nh; h++) {
            size_t row = (size_t)layer * layer_rows + (size_t)h * d->n_ctx + (size_t)(pos0 + t);
            const float *ks = kd + ((size_t)t * nh + h) * hd, *vs = vd + ((size_t)t * nh + h) * hd;
            kvq_cpu_kv_store_row(d->type_k, d->rotate_k, ks, kv->k + row * kv->row_k, hd);
            kvq_cpu_kv_store_row(d->type_v, d->rotate_v, vs, kv->v + row * kv->row_v, hd);
        }
    }
done:
    free(kp);
    free(vp);
}

static void cpu_attention(kvq_bctx *b, const kvq_kvbuf *kv, int layer, const kvq_attn_desc *a, const kvq_buf *q,
                          kvq_buf *out, int pos0, int n) {
    const kvq_kv_desc *d = &kv->d;
    size_t layer_rows = (size_t)d->n_head_kv * d->n_ctx;
    kvq_cpu_attn_args args = {
        .a = *a,
        .type_k = d->type_k,
        .type_v = d->type_v,
        .rotate_k = d->rotate_k,
        .rotate_v = d->rotate_v,
        .k = kv->k + (size_t)layer * layer_rows * kv->row_k,
        .v = kv->v + (size_t)layer * layer_rows * kv->row_v,
        .n_ctx = d->n_ctx,
    };
    const size_t rows = (size_t)n * a->n_head;
    const float *qd = q->data;
    float *od = out->data, *qp = NULL, *op = NULL;
    if (kv->hd_row != a->head_dim) {
        args.a.head_dim = kv->hd_row;
        qd = qp = pad_rows(q->data, rows, a->head_dim, kv->hd_row);
        od = op = malloc(rows * kv->hd_row * sizeof *op);
        if (!qp || !op) {
            cpu_error(b, KVQ_ERR_NOMEM, "cpu backend: out of memory padding %zu query rows", rows);
            goto done;
        }
    }
    const int rc = kvq_cpu_attention(&args, qd, od, pos0, n, b->n_threads);
    if (rc == -2)
        cpu_error(b, KVQ_ERR_UNSUPPORTED, "cpu backend: attention rows of %d values are not whole blocks", args.a.head_dim);
    else if (rc != 0)
        cpu_error(b, KVQ_ERR_NOMEM, "cpu backend: out of memory for attention scratch");
    else if (op)
        for (size_t r = 0; r < rows; r++) memcpy(out->data + r * a->head_dim, op + r * kv->hd_row, (size_t)a->head_dim * sizeof *op);
done:
    free(qp);
    free(op);
}

static double cpu_bandwidth(kvq_bctx *b) { return kvq_cpu_read_bw_gbs((size_t)256 << 20, b->n_threads, 3); }

const kvq_backend kvq_backend_cpu = {
    .name = "cpu",
    .weights_in_place = 1,
    .parallel_upload = 1,
    .exact_rows = KVQ_CPU_EXACT_ROWS,
    .init = cpu_init,
    .release = cpu_release,
    .describe = cpu_describe,
    .buf_new = cpu_buf_new,
    .buf_free = cpu_buf_free,
    .buf_write = cpu_buf_write,
    .buf_read = cpu_buf_read,
    .weight_supported = NULL,
    .weight_upload = cpu_weight_upload,
    .weight_free = cpu_weight_free,
    .weight_bytes = cpu_weight_bytes,
    .kv_new = cpu_kv_new,
    .kv_free = cpu_kv_free,
    .kv_bytes = cpu_kv_bytes,
    .kv_read = cpu_kv_read,
    .kv_write = cpu_kv_write,
    .get_rows = cpu_get_rows,
    .matmul = cpu_matmul,
    .rms_norm = cpu_rms_norm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .add = cpu_add,
    .scale = cpu_scale,
    .layer_norm = cpu_layer_norm,
    .copy = cpu_copy,
    .copy_rows = cpu_copy_rows,
    .matmul_routed = cpu_matmul_routed,
    .add_weighted = cpu_add_weighted,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .flush = NULL,
    .device_ms = NULL,
    .bandwidth_gbs = cpu_bandwidth,
};
