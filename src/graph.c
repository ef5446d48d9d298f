/* The Llama / Mistral forward pass, written as a sequence of backend ops.
 *
 *   x = embed[ids]
 *   for each layer:
 *       h  = rmsnorm(x) ; q,k,v = h·Wq, h·Wk, h·Wv ; rope(q, k)
 *       cache[pos] = k, v                (quantized on store)
 *       x += attention(q, cache)·Wo
 *       h  = rmsnorm(x) ; x += (silu(h·Wgate) * h·Wup)·Wdown
 *   logits = rmsnorm(x)·Wlm
 */
#include <math.h>

#include "context.h"

kvq_status kvq_graph_forward(kvq_context *c, const int32_t *ids, int n, float *dst) {
    const kvq_model *m = c->m;
    const kvq_hparams *hp = &m->hp;
    const kvq_backend *be = m->be;
    kvq_bctx *b = m->bctx;
    const int d = hp->n_embd, pos0 = c->n_past;
    const kvq_attn_desc ad = {
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .scale = 1.0f / sqrtf((float)hp->head_dim),
        .window = hp->sliding_window,
    };

    be->get_rows(b, m->embed, ids, n, c->x);
    for (int l = 0; l < hp->n_layer; l++) {
        const kvq_layer *L = &m->layers[l];
        /* attention block */
        be->rms_norm(b, c->x, L->attn_norm, c->xb, n, d, hp->rms_eps);
        be->matmul(b, L->lin[KVQ_LIN_Q], c->xb, c->q, n);
        be->matmul(b, L->lin[KVQ_LIN_K], c->xb, c->k, n);
        be->matmul(b, L->lin[KVQ_LIN_V], c->xb, c->v, n);
        be->rope(b, c->q, n, hp->n_head, hp->head_dim, pos0, m->rope_freqs, KVQ_ROPE_HALF);
        be->rope(b, c->k, n, hp->n_head_kv, hp->head_dim, pos0, m->rope_freqs, KVQ_ROPE_HALF);
        be->kv_store(b, c->kv, l, c->k, c->v, pos0, n);
        be->attention(b, c->kv, l, &ad, c->q, c->att, pos0, n);
        be->matmul(b, L->lin[KVQ_LIN_O], c->att, c->xb, n);
        be->add(b, c->x, c->xb, (size_t)n * d);
        /* MLP block */
        be->rms_norm(b, c->x, L->ffn_norm, c->xb, n, d, hp->rms_eps);
        be->matmul(b, L->lin[KVQ_LIN_GATE], c->xb, c->hb, n);
        be->matmul(b, L->lin[KVQ_LIN_UP], c->xb, c->hb2, n);
        be->swiglu(b, c->hb, c->hb2, (size_t)n * hp->n_ff);
        be->matmul(b, L->lin[KVQ_LIN_DOWN], c->hb, c->xb, n);
        be->add(b, c->x, c->xb, (size_t)n * d);
    }

    /* LM head: every row for perplexity, otherwise only the last one. */
    int rows = c->p.logits_all ? n : 1;
    if (!c->p.logits_all && n > 1)
        be->copy(b, c->x, (size_t)(n - 1) * d * sizeof(float), c->x, 0, (size_t)d * sizeof(float));
    be->rms_norm(b, c->x, m->out_norm, c->xb, rows, d, hp->rms_eps);
    be->matmul(b, m->lm_head, c->xb, c->logits, rows);
    return be->buf_read(b, c->logits, 0, dst, (size_t)rows * hp->n_vocab * sizeof(float));
}
