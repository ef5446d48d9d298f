/* The forward pass of every family, written as a sequence of backend ops.
 *
 *   x = embed[ids]                                   (Gemma: × sqrt(n_embd))
 *   for each layer:
 *       h  = norm(x)                                 (RMSNorm; Cohere: LayerNorm)
 *       q,k,v = h·Wq, h·Wk, h·Wv                     (Phi-3: one qkv matrix, split; Qwen2: + bias)
 *       q,k = qk_norm(q,k)                           (Command-R+)
 *       rope(q, k) ; cache[pos] = k, v               (quantized on store)
 *       x += attention(q, cache)·Wo
 *       h  = norm(x)                                 (Cohere: skipped, the FFN reads the same h)
 *       x += act(h·Wgate) * (h·Wup) · Wdown          (SiLU; Gemma: tanh GELU; Mixtral: the top-k experts)
 *   logits = norm(x)·Wlm                             (Cohere: × logit_scale)
 *
 * The families differ by one step each, so one forward with a named switch per step reads
 * better than six copies of the other twelve steps (README, "Supported models"). */
#include <math.h>

#include "context.h"

/* y = norm(x) with the model's kind of norm. */
static void norm(kvq_context *c, const kvq_wt *g, const kvq_buf *x, kvq_buf *y, int n) {
    const kvq_hparams *hp = &c->m->hp;
    if (hp->layer_norm) c->m->be->layer_norm(c->m->bctx, x, g, y, n, hp->n_embd, hp->rms_eps, 1);
    else c->m->be->rms_norm(c->m->bctx, x, g, y, n, hp->n_embd, hp->rms_eps);
}

/* q, k, v from the normed input h: three matmuls, or one fused matmul split by columns. */
static void qkv_projections(kvq_context *c, const kvq_layer *L, const kvq_buf *h, int n) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_backend *be = c->m->be;
    kvq_bctx *b = c->m->bctx;
    if (!hp->fused_qkv) {
        be->matmul(b, L->lin[KVQ_LIN_Q], h, c->q, n);
        be->matmul(b, L->lin[KVQ_LIN_K], h, c->k, n);
        be->matmul(b, L->lin[KVQ_LIN_V], h, c->v, n);
        return;
    }
    size_t qd = (size_t)hp->n_head * hp->head_dim * sizeof(float), kvd = (size_t)hp->n_head_kv * hp->head_dim * sizeof(float);
    size_t row = qd + 2 * kvd;
    be->matmul(b, L->lin[KVQ_LIN_Q], h, c->fused, n);
    be->copy_rows(b, c->fused, 0, row, c->q, 0, qd, qd, n);
    be->copy_rows(b, c->fused, qd, row, c->k, 0, kvd, kvd, n);
    be->copy_rows(b, c->fused, qd + kvd, row, c->v, 0, kvd, kvd, n);
}

/* x += attention(h)·Wo for layer l. Each sequence's rows attend over its own context's cache at
 * that context's positions; rows of other contexts pass through those contexts' buffers. */
static void attention_block(kvq_context *c, const kvq_graph_seq *seqs, int n_seq, int l, const kvq_buf *h, int n) {
    const kvq_model *m = c->m;
    const kvq_hparams *hp = &m->hp;
    const kvq_layer *L = &m->layers[l];
    const kvq_backend *be = m->be;
    kvq_bctx *b = m->bctx;
    const int mode = hp->rope_pairs ? KVQ_ROPE_PAIRS : KVQ_ROPE_HALF;
    const size_t qd = (size_t)hp->n_head * hp->head_dim * sizeof(float), kvd = (size_t)hp->n_head_kv * hp->head_dim * sizeof(float);
    qkv_projections(c, L, h, n);
    if (hp->qk_norm) {
        be->layer_norm(b, c->q, L->q_norm, c->q, n * hp->n_head, hp->head_dim, hp->rms_eps, hp->n_head);
        be->layer_norm(b, c->k, L->k_norm, c->k, n * hp->n_head_kv, hp->head_dim, hp->rms_eps, hp->n_head_kv);
    }
    for (int i = 0; i < n_seq; i++) {
        kvq_context *sc = seqs[i].c;
        const int r0 = seqs[i].row0, ns = seqs[i].n, pos0 = sc->n_past;
        const kvq_attn_desc ad = {
            .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .scale = sc->attn_scale, .window = hp->sliding_window,
        };
        if (sc != c) {
            be->copy(b, c->q, r0 * qd, sc->q, 0, ns * qd);
            be->copy(b, c->k, r0 * kvd, sc->k, 0, ns * kvd);
            be->copy(b, c->v, r0 * kvd, sc->v, 0, ns * kvd);
        }
        be->rope(b, sc->q, ns, hp->n_head, hp->head_dim, pos0, sc->rope_freqs, mode);
        be->rope(b, sc->k, ns, hp->n_head_kv, hp->head_dim, pos0, sc->rope_freqs, mode);
        be->kv_store(b, sc->kv, l, sc->k, sc->v, pos0, ns);
        be->attention(b, sc->kv, l, &ad, sc->q, sc->att, pos0, ns);
        if (sc != c) be->copy(b, sc->att, 0, c->att, r0 * qd, ns * qd);
    }
    be->matmul(b, L->lin[KVQ_LIN_O], c->att, c->xo, n);
    be->add(b, c->x, c->xo, (size_t)n * hp->n_embd);
}

/* hb = act(hb) * hb2 over count values. */
static void gated_act(kvq_context *c, size_t count) {
    if (c->m->hp.gelu) c->m->be->geglu(c->m->bctx, c->hb, c->hb2, count);
    else c->m->be->swiglu(c->m->bctx, c->hb, c->hb2, count);
}

/* x += (act(h·Wgate) * h·Wup)·Wdown. */
static void ffn_dense(kvq_context *c, const kvq_layer *L, const kvq_buf *h, int n) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_backend *be = c->m->be;
    kvq_bctx *b = c->m->bctx;
    if (hp->fused_qkv) { /* gate_up_proj: the gate's columns, then the up's */
        size_t ff = (size_t)hp->n_ff * sizeof(float);
        be->matmul(b, L->lin[KVQ_LIN_GATE], h, c->fused, n);
        be->copy_rows(b, c->fused, 0, 2 * ff, c->hb, 0, ff, ff, n);
        be->copy_rows(b, c->fused, ff, 2 * ff, c->hb2, 0, ff, ff, n);
    } else {
        be->matmul(b, L->lin[KVQ_LIN_GATE], h, c->hb, n);
        be->matmul(b, L->lin[KVQ_LIN_UP], h, c->hb2, n);
    }
    gated_act(c, (size_t)n * hp->n_ff);
    be->matmul(b, L->lin[KVQ_LIN_DOWN], c->hb, c->xo, n);
    be->add(b, c->x, c->xo, (size_t)n * hp->n_embd);
}

/* Mixtral's routing (HF MixtralSparseMoeBlock): softmax over the router logits, the top k
 * experts, their weights renormalized to sum to 1. Ties go to the lower expert index. */
static void route_tokens(kvq_context *c, int n) {
    const int E = c->m->hp.n_expert, k = c->m->hp.n_expert_used;
    for (int t = 0; t < n; t++) {
        const float *lg = c->router_host + (size_t)t * E;
        int32_t *sel = c->route + (size_t)t * k;
        float *wt = c->route_w + (size_t)t * k;
        float mx = lg[0];
        for (int e = 1; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
        double sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= sel[i] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            sel[j] = best;
            wt[j] = expf(lg[best] - mx); /* the softmax's denominator cancels in the renormalization */
            sum += wt[j];
        }
        for (int j = 0; j < k; j++) wt[j] = (float)(wt[j] / sum);
    }
}

/* x += Σ_j w_j · expert_j(h): the router runs dense and is read back, then each token's rows go
 * through its experts (matmul_routed groups them so an expert's weights stream once). */
static kvq_status ffn_moe(kvq_context *c, const kvq_layer *L, const kvq_buf *h, int n) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_backend *be = c->m->be;
    kvq_bctx *b = c->m->bctx;
    const int E = hp->n_expert, k = hp->n_expert_used, rows = n * k;
    be->matmul(b, L->router, h, c->router, n);
    kvq_status s = be->buf_read(b, c->router, 0, c->router_host, sizeof(float) * (size_t)n * E);
    if (s) return s;
    route_tokens(c, n);
    be->matmul_routed(b, (const kvq_wt *const *)L->moe[KVQ_MOE_GATE], E, h, c->hb, rows, c->route, k);
    be->matmul_routed(b, (const kvq_wt *const *)L->moe[KVQ_MOE_UP], E, h, c->hb2, rows, c->route, k);
    gated_act(c, (size_t)rows * hp->n_ff);
    be->matmul_routed(b, (const kvq_wt *const *)L->moe[KVQ_MOE_DOWN], E, c->hb, c->moe_out, rows, c->route, 1);
    be->add_weighted(b, c->x, c->moe_out, c->route_w, n, k, hp->n_embd);
    return KVQ_OK;
}

kvq_status kvq_graph_check_backend(const kvq_hparams *hp, const kvq_backend *be) {
    const char *missing = NULL;
    if (hp->layer_norm && !be->layer_norm) missing = "layer_norm";
    if (hp->gelu && !be->geglu) missing = "geglu";
    if (hp->embed_scale && !be->scale) missing = "scale";
    if (hp->fused_qkv && !be->copy_rows) missing = "copy_rows";
    if (hp->n_expert && (!be->matmul_routed || !be->add_weighted)) missing = "matmul_routed and add_weighted";
    if (missing) return kvq_fail(KVQ_ERR_UNSUPPORTED, "backend %s cannot run %s yet (no %s)", be->name, hp->arch, missing);
    return KVQ_OK;
}

kvq_status kvq_graph_forward(kvq_context *c, const kvq_graph_seq *seqs, int n_seq, const int32_t *ids, int n, float *dst) {
    const kvq_model *m = c->m;
    const kvq_hparams *hp = &m->hp;
    const kvq_backend *be = m->be;
    kvq_bctx *b = m->bctx;
    const size_t d = (size_t)hp->n_embd;
    kvq_status s;

    be->get_rows(b, m->embed, ids, n, c->x);
    if (m->embed_scale != 1.0f) be->scale(b, c->x, (size_t)n * d, m->embed_scale);
    for (int l = 0; l < hp->n_layer; l++) {
        const kvq_layer *L = &m->layers[l];
        norm(c, L->attn_norm, c->x, c->xb, n);
        attention_block(c, seqs, n_seq, l, c->xb, n);
        /* parallel blocks (Cohere) feed the FFN the attention's input h, not a new norm of x */
        if (!hp->parallel_block) norm(c, L->ffn_norm, c->x, c->xb, n);
        if (!hp->n_expert) ffn_dense(c, L, c->xb, n);
        else if ((s = ffn_moe(c, L, c->xb, n))) return s;
    }

    /* LM head: every row for perplexity, otherwise the last row of each sequence, moved to
     * row i (in order: a later sequence's last row lies past every row written before it). */
    int rows = c->p.logits_all && n_seq == 1 ? n : n_seq;
    if (rows != n)
        for (int i = 0; i < n_seq; i++) {
            size_t last = (size_t)(seqs[i].row0 + seqs[i].n - 1);
            if (last != (size_t)i) be->copy(b, c->x, last * d * sizeof(float), c->x, (size_t)i * d * sizeof(float), d * sizeof(float));
        }
    norm(c, m->out_norm, c->x, c->xb, rows);
    be->matmul(b, m->lm_head, c->xb, c->logits, rows);
    size_t count = (size_t)rows * hp->n_vocab;
    if ((s = be->buf_read(b, c->logits, 0, dst, count * sizeof(float)))) return s;
    if (hp->logit_scale != 1.0f)
        for (size_t i = 0; i < count; i++) dst[i] *= hp->logit_scale;
    return KVQ_OK;
}
