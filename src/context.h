/* Evaluation context: KV cache, activation buffers, logits. */
#ifndef KVQ_CONTEXT_H
#define KVQ_CONTEXT_H

#include "model/model.h"

struct kvq_context {
    kvq_model *m;
    kvq_context_params p;
    kvq_kvbuf *kv;
    kvq_kv_desc kd;  /* shape and types of kv */
    int n_past;
    /* activations for up to p.n_batch tokens, f32 row-major */
    kvq_buf *x;      /* residual stream [n][n_embd] */
    kvq_buf *xb;     /* normed input / block output [n][n_embd] */
    kvq_buf *q;      /* [n][n_head*head_dim] */
    kvq_buf *k, *v;  /* [n][n_head_kv*head_dim] */
    kvq_buf *att;    /* attention output [n][n_head*head_dim] */
    kvq_buf *hb, *hb2; /* MLP [n][n_ff] */
    kvq_buf *logits; /* [n_batch or 1][n_vocab] */
    float *logits_host;   /* rows of the last kvq_eval call */
    int logits_rows, logits_cap;
};

/* graph.c: one forward pass over n <= n_batch tokens at positions n_past..; the
 * logits of the last row (or of every row with logits_all) go to dst. */
kvq_status kvq_graph_forward(kvq_context *c, const int32_t *ids, int n, float *dst);

#endif
