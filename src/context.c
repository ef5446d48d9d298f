/* kvq_context_*: KV cache and activation buffers on the model's backend, kvq_eval. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "kv_format.h"
#include "resources.h"

kvq_context_params kvq_context_default_params(void) {
    kvq_context_params p = {
        .n_ctx = 0, .n_batch = 512, .type_k = KVQ_CACHE_F16, .type_v = KVQ_CACHE_F16, .kv_rotate = -1, .logits_all = 0};
    return p;
}

static int is_quantized(kvq_cache_type t) { return t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4; }

/* Rotation applies to quantized rows only: by default to q4, with kv_rotate=1 to q8 too. */
static int want_rotate(kvq_cache_type t, int kv_rotate) {
    if (kv_rotate < 0) return t == KVQ_CACHE_Q4;
    return kv_rotate && is_quantized(t);
}

static kvq_status check_params(const kvq_hparams *hp, kvq_context_params *p) {
    if ((unsigned)p->type_k > KVQ_CACHE_Q4 || (unsigned)p->type_v > KVQ_CACHE_Q4)
        return kvq_fail(KVQ_ERR_ARG, "unknown KV cache type");
    if (p->n_ctx < 0 || p->n_batch < 0) return kvq_fail(KVQ_ERR_ARG, "n_ctx and n_batch must not be negative");
    if (p->n_ctx == 0) p->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p->n_batch == 0) p->n_batch = 512;
    if (p->n_batch > p->n_ctx) p->n_batch = p->n_ctx;
    if ((is_quantized(p->type_k) || is_quantized(p->type_v)) && hp->head_dim % KVQ_QK)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "q8/q4 KV cache needs head_dim to be a multiple of %d (model has %d)", KVQ_QK, hp->head_dim);
    int pow2 = (hp->head_dim & (hp->head_dim - 1)) == 0;
    if (!pow2 && p->kv_rotate == 1)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "KV rotation needs a power-of-two head_dim (model has %d)", hp->head_dim);
    if (!pow2) p->kv_rotate = 0;
    return kvq_mem_check(hp, p->n_ctx, p->n_batch, p->logits_all, p->type_k, p->type_v);
}

/* Activations and the cache of layers [l0, l1) on device d. */
static kvq_status acts_new(kvq_context *c, int d, int l0, int l1, const kvq_kv_desc *kd0) {
    const kvq_model *m = c->m;
    const kvq_dev *D = &m->dev[d];
    kvq_acts *A = &c->act[d];
    kvq_act_widths w;
    kvq_act_widths_of(&m->hp, &w);
    A->kd = *kd0;
    A->kd.n_layer = l1 - l0;
    A->layer0 = l0;
    if (l1 > l0 && !(A->kv = D->be->kv_new(D->b, &A->kd))) return KVQ_ERR_NOMEM; /* none where only the embedding is */
    size_t nb = (size_t)c->p.n_batch * sizeof(float);
    kvq_buf **bufs[] = {&A->x, &A->xb, &A->xo, &A->q, &A->att, &A->k, &A->v, &A->hb, &A->hb2, &A->fused, &A->moe_out, &A->router};
    size_t widths[] = {w.x, w.xb, w.xo, w.q, w.att, w.k, w.v, w.hb, w.hb2, w.fused, w.moe_out, w.router};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] && !(*bufs[i] = D->be->buf_new(D->b, nb * widths[i]))) return KVQ_ERR_NOMEM;
    return KVQ_OK;
}

static void acts_free(kvq_context *c, int d) {
    const kvq_dev *D = &c->m->dev[d];
    kvq_acts *A = &c->act[d];
    if (!D->be) return;
    D->be->kv_free(D->b, A->kv);
    kvq_buf *bufs[] = {A->x, A->xb, A->xo, A->q, A->k, A->v, A->att, A->hb, A->hb2, A->fused, A->moe_out, A->router};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) D->be->buf_free(D->b, bufs[i]);
}

kvq_status kvq_context_new(kvq_model *m, const kvq_context_params *params, kvq_context **out) {
    *out = NULL;
    kvq_context_params p = params ? *params : kvq_context_default_params();
    const kvq_hparams *hp = &m->hp;
    kvq_status s = check_params(hp, &p);
    if (s) return s;
    kvq_context *c = calloc(1, sizeof *c);
    if (!c) return kvq_fail(KVQ_ERR_NOMEM, "out of memory");
    c->m = m;
    c->p = p;
    kvq_kv_desc kd = {
        .n_layer = hp->n_layer, .n_ctx = p.n_ctx, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
        .type_k = p.type_k, .type_v = p.type_v,
        .rotate_k = want_rotate(p.type_k, p.kv_rotate), .rotate_v = want_rotate(p.type_v, p.kv_rotate),
        .n_head = hp->n_head,
    };
    /* longrope: the short table until a sequence grows past rope_orig_ctx (rope_follow) */
    c->rope_freqs = m->rope_freqs;
    float af = hp->rope_scaling == KVQ_ROPE_LONGROPE ? hp->rope_attn_factor : 1.0f;
    c->attn_scale = af * af / sqrtf((float)hp->head_dim);
    int split = m->n_dev > 1 ? m->gpu_from : hp->n_layer;
    kvq_backend_stats st0, st1;
    kvq_model_backend_stats(m, &st0);
    s = acts_new(c, 0, 0, split, &kd);
    if (!s && m->n_dev > 1) s = acts_new(c, 1, split, hp->n_layer, &kd);
    size_t nb = (size_t)p.n_batch * sizeof(float);
    if (!s && m->n_dev > 1 && !(c->xfer = malloc(nb * hp->n_embd))) s = kvq_fail(KVQ_ERR_NOMEM, "out of memory for the offload crossing");
    if (!s && hp->n_expert) {
        size_t rows = (size_t)p.n_batch * hp->n_expert_used;
        c->router_host = malloc(nb * hp->n_expert);
        c->route = malloc(sizeof(int32_t) * rows);
        c->route_w = malloc(sizeof(float) * rows);
        if (!c->router_host || !c->route || !c->route_w) s = kvq_fail(KVQ_ERR_NOMEM, "out of memory for the experts' routes");
    }
    const kvq_dev *last = &m->dev[m->n_dev - 1];
    c->logits_buf_rows = p.logits_all ? p.n_batch : 1;
    if (!s && !(c->logits = last->be->buf_new(last->b, sizeof(float) * (size_t)c->logits_buf_rows * hp->n_vocab))) s = KVQ_ERR_NOMEM;
    if (!s && !(c->logits_host = malloc(sizeof(float) * hp->n_vocab))) s = kvq_fail(KVQ_ERR_NOMEM, "out of memory for logits");
    if (!s && m->rope_freqs_long && p.n_ctx > hp->rope_orig_ctx && !(c->hist = malloc(sizeof(int32_t) * (size_t)p.n_ctx)))
        s = kvq_fail(KVQ_ERR_NOMEM, "out of memory for the token history");
    c->logits_cap = 1;
    kvq_model_backend_stats(m, &st1);
    if (!s && st1.host_fallback_bytes > st0.host_fallback_bytes)
        snprintf(c->note, sizeof c->note, "warning: the GPU is full: %.1f MiB of this context's KV cache and activations "
                 "are in host memory, read over the bus (fewer GPU layers or a smaller context avoid it)",
                 (double)(st1.host_fallback_bytes - st0.host_fallback_bytes) / (1 << 20));
    if (s) {
        kvq_context_free(c);
        return s;
    }
    *out = c;
    return KVQ_OK;
}

const char *kvq_context_note(const kvq_context *c) { return c->note; }

void kvq_context_free(kvq_context *c) {
    if (!c) return;
    for (int d = 0; d < c->m->n_dev; d++) acts_free(c, d);
    const kvq_dev *last = &c->m->dev[c->m->n_dev - 1];
    last->be->buf_free(last->b, c->logits);
    free(c->xfer);
    free(c->router_host);
    free(c->route);
    free(c->route_w);
    free(c->logits_host);
    free(c->hist);
    free(c->embd_sum);
    free(c->embd_rows);
    free(c);
}

static kvq_status check_tokens(const kvq_context *c, const int32_t *ids, int n) {
    const kvq_hparams *hp = &c->m->hp;
    if (n <= 0 || !ids) return kvq_fail(KVQ_ERR_ARG, "kvq_eval: no tokens");
    if (n > c->p.n_ctx - c->n_past)
        return kvq_fail(KVQ_ERR_ARG, "context full: %d new tokens do not fit (%d already in the cache, n_ctx (-c) is %d)", n, c->n_past,
                        c->p.n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->n_vocab)
            return kvq_fail(KVQ_ERR_ARG, "token id %d is outside the vocabulary (0..%d)", ids[i], hp->n_vocab - 1);
    return KVQ_OK;
}

/* Notes n tokens about to go to positions n_past.. while the history is whole up to there. */
static void hist_push(kvq_context *c, const int32_t *ids, int n) {
    if (!c->hist || c->n_hist < c->n_past) return;
    if (ids != c->hist + c->n_past) memcpy(c->hist + c->n_past, ids, sizeof(int32_t) * (size_t)n);
    c->n_hist = c->n_past + n;
}

/* n tokens from n_past on, n_batch at a time; logits into logits_host (every row with logits_all). */
static kvq_status eval_pieces(kvq_context *c, const int32_t *ids, int n) {
    const int nv = c->m->hp.n_vocab;
    for (int done = 0; done < n;) {
        int nb = n - done < c->p.n_batch ? n - done : c->p.n_batch;
        float *dst = c->p.logits_all ? c->logits_host + (size_t)done * nv : c->logits_host;
        kvq_graph_seq seq = {c, 0, nb};
        kvq_status s = kvq_graph_forward(c, &seq, 1, ids + done, nb, dst);
        if (s) return s;
        hist_push(c, ids + done, nb);
        c->n_past += nb;
        done += nb;
    }
    return KVQ_OK;
}

/* Longrope as HF runs it: every position on the long table exactly when the sequence, with the
 * n tokens about to come, is longer than rope_orig_ctx. When that flips, every cached row was
 * made with the other table (deeper layers' through earlier layers' outputs, so turning K alone
 * would not do): the cached tokens are evaluated again, as HF's generate drops its cache at the
 * crossing. Random rows (kvq_kv_fill_random) have no tokens and just keep going. On failure the
 * cache holds the tokens redone so far (n_past says how many). */
static kvq_status rope_follow(kvq_context *c, int n) {
    const kvq_model *m = c->m;
    if (!c->hist) return KVQ_OK;
    const float *want = c->n_past + n > m->hp.rope_orig_ctx ? m->rope_freqs_long : m->rope_freqs;
    if (want == c->rope_freqs) return KVQ_OK;
    c->rope_freqs = want;
    int redo = c->n_past;
    if (!redo || c->n_hist < redo) return KVQ_OK;
    c->n_past = 0;
    int all = c->p.logits_all;
    c->p.logits_all = 0; /* only the cache is wanted: the last row's logits, overwritten next */
    kvq_status s = eval_pieces(c, c->hist, redo);
    c->p.logits_all = all;
    return s;
}

/* Room for rows of logits in c's device buffer. */
static kvq_status grow_logits(kvq_context *c, int rows) {
    if (rows <= c->logits_buf_rows) return KVQ_OK;
    const kvq_dev *last = &c->m->dev[c->m->n_dev - 1];
    kvq_buf *nb = last->be->buf_new(last->b, sizeof(float) * (size_t)rows * c->m->hp.n_vocab);
    if (!nb) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d rows of logits", rows);
    last->be->buf_free(last->b, c->logits);
    c->logits = nb;
    c->logits_buf_rows = rows;
    return KVQ_OK;
}

kvq_status kvq_eval(kvq_context *c, const int32_t *ids, int n) {
    const kvq_hparams *hp = &c->m->hp;
    kvq_status s = check_tokens(c, ids, n);
    if (s) return s;
    int rows = c->p.logits_all ? n : 1;
    if (rows > c->logits_cap) {
        float *nl = realloc(c->logits_host, sizeof(float) * (size_t)rows * hp->n_vocab);
        if (!nl) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d rows of logits", rows);
        c->logits_host = nl;
        c->logits_cap = rows;
    }
    /* pieces of at most n_batch rows on the device (logits_all turned on after creation) */
    if (c->p.logits_all && (s = grow_logits(c, rows < c->p.n_batch ? rows : c->p.n_batch))) return s;
    if (!(s = rope_follow(c, n))) s = eval_pieces(c, ids, n);
    c->logits_rows = s ? 0 : rows;
    return s;
}

/* One forward for all contexts when their tokens fit ctx[0]'s batch: the weights stream once
 * for every context's rows (all of a logits_all context's rows come back, its last otherwise).
 * Otherwise one context after the other. */
kvq_status kvq_eval_batch(kvq_context *const *ctx, const int32_t *const *ids, const int *n, int count) {
    if (count <= 0 || !ctx || !ids || !n) return kvq_fail(KVQ_ERR_ARG, "kvq_eval_batch: nothing to evaluate");
    int total = 0, rows = 0, serial = 0;
    kvq_status s;
    for (int i = 0; i < count; i++) {
        if (!ctx[i] || ctx[i]->m != ctx[0]->m) return kvq_fail(KVQ_ERR_ARG, "kvq_eval_batch: contexts must share one model");
        for (int j = 0; j < i; j++)
            if (ctx[j] == ctx[i]) return kvq_fail(KVQ_ERR_ARG, "kvq_eval_batch: context %d is also context %d", i, j);
        if ((s = check_tokens(ctx[i], ids[i], n[i]))) return s;
        if (n[i] > ctx[i]->p.n_batch) serial = 1;
        total += n[i];
        rows += ctx[i]->p.logits_all ? n[i] : 1;
    }
    kvq_context *c = ctx[0];
    if (count == 1 || serial || total > c->p.n_batch) {
        for (int i = 0; i < count; i++)
            if ((s = kvq_eval(ctx[i], ids[i], n[i]))) return s;
        return KVQ_OK;
    }
    const int nv = c->m->hp.n_vocab;
    if ((s = grow_logits(c, rows))) return s;
    for (int i = 0; i < count; i++) {
        int k = ctx[i]->p.logits_all ? n[i] : 1;
        if (k > ctx[i]->logits_cap) {
            float *nl = realloc(ctx[i]->logits_host, sizeof(float) * (size_t)k * nv);
            if (!nl) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d rows of logits", k);
            ctx[i]->logits_host = nl;
            ctx[i]->logits_cap = k;
        }
    }
    kvq_graph_seq *seqs = malloc(sizeof *seqs * (size_t)count);
    int32_t *all = malloc(sizeof(int32_t) * (size_t)total);
    float *dst = malloc(sizeof(float) * (size_t)rows * nv);
    s = seqs && all && dst ? KVQ_OK : kvq_fail(KVQ_ERR_NOMEM, "out of memory for a batch of %d contexts", count);
    for (int i = 0, r = 0; !s && i < count; r += n[i], i++) {
        seqs[i] = (kvq_graph_seq){ctx[i], r, n[i]};
        memcpy(all + r, ids[i], sizeof(int32_t) * (size_t)n[i]);
    }
    /* a context crossing rope_orig_ctx first makes its own cache again, alone (rope_follow) */
    for (int i = 0; !s && i < count; i++) s = rope_follow(ctx[i], n[i]);
    if (!s) s = kvq_graph_forward(c, seqs, count, all, total, dst);
    for (int i = 0, o = 0; i < count; i++) {
        int k = ctx[i]->p.logits_all ? n[i] : 1;
        if (!s) {
            memcpy(ctx[i]->logits_host, dst + (size_t)o * nv, sizeof(float) * (size_t)k * nv);
            hist_push(ctx[i], ids[i], n[i]);
            ctx[i]->n_past += n[i];
        }
        ctx[i]->logits_rows = s ? 0 : k;
        o += k;
    }
    free(seqs), free(all), free(dst);
    return s;
}

kvq_status kvq_logits_all_set(kvq_context *c, int on) {
    if (!c) return kvq_fail(KVQ_ERR_ARG, "kvq_logits_all_set: no context");
    c->p.logits_all = on != 0; /* the logits' buffers grow at the next evaluation */
    return KVQ_OK;
}

int kvq_n_past(const kvq_context *c) { return c->n_past; }
int kvq_n_ctx(const kvq_context *c) { return c->p.n_ctx; }

kvq_status kvq_kv_truncate(kvq_context *c, int n_past) {
    if (n_past < 0 || n_past > c->n_past) return kvq_fail(KVQ_ERR_ARG, "kvq_kv_truncate: %d is outside 0..%d", n_past, c->n_past);
    c->n_past = n_past; /* rows past n_past are simply overwritten later */
    if (c->n_hist > n_past) c->n_hist = n_past;
    return KVQ_OK;
}

const float *kvq_logits(const kvq_context *c) {
    if (c->logits_rows <= 0) return NULL;
    return c->logits_host + (size_t)(c->logits_rows - 1) * c->m->hp.n_vocab;
}

const float *kvq_logits_row(const kvq_context *c, int i) {
    if (i < 0 || i >= c->logits_rows) return NULL;
    return c->logits_host + (size_t)i * c->m->hp.n_vocab;
}

static size_t kv_bytes(const kvq_context *c, int positions) {
    size_t sum = 0;
    for (int d = 0; d < c->m->n_dev; d++)
        if (c->act[d].kv) sum += c->m->dev[d].be->kv_bytes(c->m->dev[d].b, &c->act[d].kd, positions);
    return sum;
}

size_t kvq_kv_bytes_total(const kvq_context *c) { return kv_bytes(c, c->p.n_ctx); }
size_t kvq_kv_bytes_used(const kvq_context *c) { return kv_bytes(c, c->n_past); }
