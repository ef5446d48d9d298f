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
 * better than six copies of the other twelve steps (README, "Supported models"). With offload
 * (-ngl) each layer runs on its model.dev with that device's activations and cache (kvq_acts);
 * the residual x crosses to the next device where the layers change hands (cross()). */
#include <math.h>

#include "context.h"

/* y = norm(x) with the model's kind of norm, on device D. */
static void norm(const kvq_context *c, const kvq_dev *D, const kvq_wt *g, const kvq_buf *x, kvq_buf *y, int n) {
    const kvq_hparams *hp = &c->m->hp;
    if (hp->layer_norm) D->be->layer_norm(D->b, x, g, y, n, hp->n_embd, hp->rms_eps, 1);
    else D->be->rms_norm(D->b, x, g, y, n, hp->n_embd, hp->rms_eps);
}

/* q, k, v from the normed input h: three matmuls, or one fused matmul split by columns. */
static void qkv_projections(const kvq_context *c, const kvq_layer *L, kvq_acts *A, int n) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_backend *be = c->m->dev[L->dev].be;
    kvq_bctx *b = c->m->dev[L->dev].b;
    const kvq_buf *h = A->xb;
    if (!hp->fused_qkv) {
        be->matmul(b, L->lin[KVQ_LIN_Q], h, A->q, n);
        be->matmul(b, L->lin[KVQ_LIN_K], h, A->k, n);
        be->matmul(b, L->lin[KVQ_LIN_V], h, A->v, n);
        return;
    }
    size_t qd = (size_t)hp->n_head * hp->head_dim * sizeof(float), kvd = (size_t)hp->n_head_kv * hp->head_dim * sizeof(float);
    size_t row = qd + 2 * kvd;
    be->matmul(b, L->lin[KVQ_LIN_Q], h, A->fused, n);
    be->copy_rows(b, A->fused, 0, row, A->q, 0, qd, qd, n);
    be->copy_rows(b, A->fused, qd, row, A->k, 0, kvd, kvd, n);
    be->copy_rows(b, A->fused, qd + kvd, row, A->v, 0, kvd, kvd, n);
}

/* hb = act(hb) * hb2 over count values. */
static void gated_act(const kvq_context *c, const kvq_dev *D, kvq_acts *A, size_t count) {
    if (c->m->hp.gelu) D->be->geglu(D->b, A->hb, A->hb2, count);
    else D->be->swiglu(D->b, A->hb, A->hb2, count);
}

/* x += in·W (in = act(in)·hb2 for the down projection, glu), then with g xb = norm(x): through the
 * backend's optional fused entries where it has them (their norm is RMSNorm only). */
static void residual(const kvq_context *c, const kvq_dev *D, const kvq_wt *w, kvq_buf *in, int glu, kvq_acts *A, int n,
                     const kvq_wt *g) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_backend *be = D->be;
    const kvq_wt *fg = hp->layer_norm ? NULL : g;
    if (glu && be->matmul_glu_add) {
        be->matmul_glu_add(D->b, w, in, A->hb2, hp->gelu, A->x, n, fg, A->xb, hp->rms_eps);
    } else if (!glu && be->matmul_add) {
        be->matmul_add(D->b, w, in, A->x, n, fg, A->xb, hp->rms_eps);
    } else {
        if (glu) gated_act(c, D, A, (size_t)n * hp->n_ff);
        be->matmul(D->b, w, in, A->xo, n);
        be->add(D->b, A->x, A->xo, (size_t)n * hp->n_embd);
        fg = NULL;
    }
    if (g && !fg) norm(c, D, g, A->x, A->xb, n);
}

/* x += attention(h)·Wo for layer l, then xb = norm(x) with g when given. Each sequence's rows attend over its own context's cache at
 * that context's positions; rows of other contexts pass through those contexts' buffers. */
static void attention_block(kvq_context *c, const kvq_graph_seq *seqs, int n_seq, int l, int n, const kvq_wt *g) {
    const kvq_model *m = c->m;
    const kvq_hparams *hp = &m->hp;
    const kvq_layer *L = &m->layers[l];
    const kvq_backend *be = m->dev[L->dev].be;
    kvq_bctx *b = m->dev[L->dev].b;
    kvq_acts *A = &c->act[L->dev];
    const int mode = hp->rope_pairs ? KVQ_ROPE_PAIRS : KVQ_ROPE_HALF, kl = l - A->layer0;
    const size_t qd = (size_t)hp->n_head * hp->head_dim * sizeof(float), kvd = (size_t)hp->n_head_kv * hp->head_dim * sizeof(float);
    qkv_projections(c, L, A, n);
    if (hp->qk_norm) {
        be->layer_norm(b, A->q, L->q_norm, A->q, n * hp->n_head, hp->head_dim, hp->rms_eps, hp->n_head);
        be->layer_norm(b, A->k, L->k_norm, A->k, n * hp->n_head_kv, hp->head_dim, hp->rms_eps, hp->n_head_kv);
    }
    for (int i = 0; i < n_seq; i++) {
        kvq_context *sc = seqs[i].c;
        kvq_acts *S = &sc->act[L->dev];
        const int r0 = seqs[i].row0, ns = seqs[i].n, pos0 = sc->n_past;
        const kvq_attn_desc ad = {
            .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .scale = sc->attn_scale, .window = hp->sliding_window,
        };
        if (sc != c) {
            be->copy(b, A->q, r0 * qd, S->q, 0, ns * qd);
            be->copy(b, A->k, r0 * kvd, S->k, 0, ns * kvd);
            be->copy(b, A->v, r0 * kvd, S->v, 0, ns * kvd);
        }
        if (be->rope_kv_store) {
            be->rope_kv_store(b, S->kv, kl, S->q, S->k, S->v, hp->n_head, pos0, ns, sc->rope_freqs, mode);
        } else {
            be->rope(b, S->q, ns, hp->n_head, hp->head_dim, pos0, sc->rope_freqs, mode);
            be->rope(b, S->k, ns, hp->n_head_kv, hp->head_dim, pos0, sc->rope_freqs, mode);
            be->kv_store(b, S->kv, kl, S->k, S->v, pos0, ns);
        }
        be->attention(b, S->kv, kl, &ad, S->q, S->att, pos0, ns);
        if (sc != c) be->copy(b, S->att, 0, A->att, r0 * qd, ns * qd);
    }
    residual(c, &m->dev[L->dev], L->lin[KVQ_LIN_O], A->att, 0, A, n, g);
}

/* x += (act(h·Wgate) * h·Wup)·Wdown, then xb = norm(x) with g when given. */
static void ffn_dense(kvq_context *c, const kvq_layer *L, int n, const kvq_wt *g) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_dev *D = &c->m->dev[L->dev];
    const kvq_backend *be = D->be;
    kvq_bctx *b = D->b;
    kvq_acts *A = &c->act[L->dev];
    if (hp->fused_qkv) { /* gate_up_proj: the gate's columns, then the up's */
        size_t ff = (size_t)hp->n_ff * sizeof(float);
        be->matmul(b, L->lin[KVQ_LIN_GATE], A->xb, A->fused, n);
        be->copy_rows(b, A->fused, 0, 2 * ff, A->hb, 0, ff, ff, n);
        be->copy_rows(b, A->fused, ff, 2 * ff, A->hb2, 0, ff, ff, n);
    } else {
        be->matmul(b, L->lin[KVQ_LIN_GATE], A->xb, A->hb, n);
        be->matmul(b, L->lin[KVQ_LIN_UP], A->xb, A->hb2, n);
    }
    residual(c, D, L->lin[KVQ_LIN_DOWN], A->hb, 1, A, n, g);
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
static kvq_status ffn_moe(kvq_context *c, const kvq_layer *L, int n) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_dev *D = &c->m->dev[L->dev];
    const kvq_backend *be = D->be;
    kvq_bctx *b = D->b;
    kvq_acts *A = &c->act[L->dev];
    const int E = hp->n_expert, k = hp->n_expert_used, rows = n * k;
    be->matmul(b, L->router, A->xb, A->router, n);
    kvq_status s = be->buf_read(b, A->router, 0, c->router_host, sizeof(float) * (size_t)n * E);
    if (s) return s;
    route_tokens(c, n);
    be->matmul_routed(b, (const kvq_wt *const *)L->moe[KVQ_MOE_GATE], E, A->xb, A->hb, rows, c->route, k);
    be->matmul_routed(b, (const kvq_wt *const *)L->moe[KVQ_MOE_UP], E, A->xb, A->hb2, rows, c->route, k);
    gated_act(c, D, A, (size_t)rows * hp->n_ff);
    be->matmul_routed(b, (const kvq_wt *const *)L->moe[KVQ_MOE_DOWN], E, A->hb, A->moe_out, rows, c->route, 1);
    be->add_weighted(b, A->x, A->moe_out, c->route_w, n, k, hp->n_embd);
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

/* The residual stream of n rows moves to the other device (offload): one read, one write. */
static kvq_status cross(kvq_context *c, int from, int to, int n) {
    const kvq_dev *F = &c->m->dev[from], *T = &c->m->dev[to];
    size_t bytes = (size_t)n * c->m->hp.n_embd * sizeof(float);
    kvq_status s = F->be->buf_read(F->b, c->act[from].x, 0, c->xfer, bytes);
    if (!s) T->be->buf_write(T->b, c->act[to].x, 0, c->xfer, bytes);
    return s;
}

kvq_status kvq_graph_forward(kvq_context *c, const kvq_graph_seq *seqs, int n_seq, const int32_t *ids, int n, float *dst) {
    const kvq_model *m = c->m;
    const kvq_hparams *hp = &m->hp;
    const size_t d = (size_t)hp->n_embd;
    int dev = 0, normed = 0; /* normed: xb already holds this layer's input norm (fused into the last projection) */
    kvq_status s;

    const kvq_dev *D = &m->dev[0];
    D->be->get_rows(D->b, m->embed, ids, n, c->act[0].x);
    if (m->embed_scale != 1.0f) D->be->scale(D->b, c->act[0].x, (size_t)n * d, m->embed_scale);
    for (int l = 0; l < hp->n_layer; l++) {
        const kvq_layer *L = &m->layers[l];
        if (L->dev != dev && (s = cross(c, dev, L->dev, n))) return s;
        dev = L->dev;
        D = &m->dev[dev];
        kvq_acts *A = &c->act[dev];
        if (!normed) norm(c, D, L->attn_norm, A->x, A->xb, n);
        /* parallel blocks (Cohere) feed the FFN the attention's input h, not a new norm of x */
        attention_block(c, seqs, n_seq, l, n, hp->parallel_block ? NULL : L->ffn_norm);
        const kvq_layer *next = l + 1 < hp->n_layer && m->layers[l + 1].dev == dev ? &m->layers[l + 1] : NULL;
        normed = next && !hp->n_expert;
        if (!hp->n_expert) ffn_dense(c, L, n, next ? next->attn_norm : NULL);
        else if ((s = ffn_moe(c, L, n))) return s;
    }
    if (dev != m->n_dev - 1 && (s = cross(c, dev, m->n_dev - 1, n))) return s;
    D = &m->dev[m->n_dev - 1];
    kvq_acts *A = &c->act[m->n_dev - 1];

    /* embeddings: every row's final-normed state before the LM head's rows are picked */
    if (c->p.embeddings && n_seq == 1) {
        norm(c, D, m->out_norm, A->x, A->xb, n);
        if ((s = kvq_embd_add(c, D, A->xb, n))) return s;
    }
    /* LM head: every row of a sequence whose context has logits_all (perplexity, speculative
     * verification), otherwise its last row; moved down in order (a later sequence's rows lie
     * past every row written before them). */
    int rows = 0;
    for (int i = 0; i < n_seq; i++) rows += seqs[i].c->p.logits_all ? seqs[i].n : 1;
    if (rows != n)
        for (int i = 0, o = 0; i < n_seq; i++) { /* a sequence with logits_all keeps all its rows */
            int k = seqs[i].c->p.logits_all ? seqs[i].n : 1;
            for (int j = seqs[i].row0 + seqs[i].n - k; j < seqs[i].row0 + seqs[i].n; j++, o++)
                if (j != o) D->be->copy(D->b, A->x, (size_t)j * d * sizeof(float), A->x, (size_t)o * d * sizeof(float), d * sizeof(float));
        }
    norm(c, D, m->out_norm, A->x, A->xb, rows);
    D->be->matmul(D->b, m->lm_head, A->xb, c->logits, rows);
    size_t count = (size_t)rows * hp->n_vocab;
    if ((s = D->be->buf_read(D->b, c->logits, 0, dst, count * sizeof(float)))) return s;
    if (hp->logit_scale != 1.0f)
        for (size_t i = 0; i < count; i++) dst[i] *= hp->logit_scale;
    return KVQ_OK;
}
