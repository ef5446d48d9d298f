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
    const float *rope_freqs; /* the model's short or long (longrope past rope_orig_ctx) frequencies */
    float attn_scale;        /* 1/sqrt(head_dim), times longrope's attention factor squared */
    /* activations for up to p.n_batch tokens, f32 row-major (widths: kvq_act_widths) */
    kvq_buf *x;      /* residual stream [n][n_embd] */
    kvq_buf *xb;     /* normed input [n][n_embd] */
    kvq_buf *xo;     /* a block's output before it joins the residual [n][n_embd] */
    kvq_buf *q;      /* [n][n_head*head_dim] */
    kvq_buf *k, *v;  /* [n][n_head_kv*head_dim] */
    kvq_buf *att;    /* attention output [n][n_head*head_dim] */
    kvq_buf *hb, *hb2; /* FFN hidden [n * experts used][n_ff] */
    kvq_buf *fused;  /* fused qkv / gate_up output before the split (Phi-3), else NULL */
    kvq_buf *moe_out, *router; /* experts' outputs [n * used][n_embd], router logits [n][n_expert] */
    float *router_host;        /* router logits on the host [n_batch][n_expert] */
    int32_t *route;            /* expert of each (token, slot) [n_batch * used] */
    float *route_w;            /* its weight in the token's mix */
    kvq_buf *logits; /* [n_batch or 1][n_vocab] */
    float *logits_host;   /* rows of the last kvq_eval call */
    int logits_rows, logits_cap;
};

/* graph.c: one forward pass over n <= n_batch tokens at positions n_past..; the
 * logits of the last row (or of every row with logits_all) go to dst. */
kvq_status kvq_graph_forward(kvq_context *c, const int32_t *ids, int n, float *dst);

#endif
