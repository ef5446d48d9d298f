/* Evaluation context: KV cache, activation buffers, logits. */
#ifndef KVQ_CONTEXT_H
#define KVQ_CONTEXT_H

#include "model/model.h"

/* What a context keeps on one device: activations for up to p.n_batch tokens (f32 row-major,
 * widths: kvq_act_widths) and the KV cache of the layers that device runs. */
typedef struct {
    kvq_buf *x;      /* residual stream [n][n_embd] */
    kvq_buf *xb;     /* normed input [n][n_embd] */
    kvq_buf *xo;     /* a block's output before it joins the residual [n][n_embd] */
    kvq_buf *q;      /* [n][n_head*head_dim] */
    kvq_buf *k, *v;  /* [n][n_head_kv*head_dim] */
    kvq_buf *att;    /* attention output [n][n_head*head_dim] */
    kvq_buf *hb, *hb2; /* FFN hidden [n * experts used][n_ff] */
    kvq_buf *fused;  /* fused qkv / gate_up output before the split (Phi-3), else NULL */
    kvq_buf *moe_out, *router; /* experts' outputs [n * used][n_embd], router logits [n][n_expert] */
    kvq_kvbuf *kv;
    kvq_kv_desc kd;  /* shape and types of kv (n_layer: this device's layers) */
    int layer0;      /* the model layer of kv's layer 0 */
} kvq_acts;

struct kvq_context {
    kvq_model *m;
    kvq_context_params p;
    int n_past;
    const float *rope_freqs; /* the table the cache was made with: longrope's long one while n_past is past rope_orig_ctx */
    int32_t *hist;           /* longrope with n_ctx past rope_orig_ctx: the token at each cache position, to make the
                              * cache again with the other table when the sequence crosses rope_orig_ctx; else NULL */
    int n_hist;              /* hist[0 .. n_hist-1] are known (kvq_kv_fill_random's rows are not) */
    float attn_scale;        /* 1/sqrt(head_dim), times longrope's attention factor squared */
    kvq_acts act[2];         /* per kvq_model.dev */
    float *xfer;             /* the residual crossing from the CPU's layers to the GPU's [n_batch][n_embd] */
    float *router_host;      /* router logits on the host [n_batch][n_expert] */
    int32_t *route;          /* expert of each (token, slot) [n_batch * used] */
    float *route_w;          /* its weight in the token's mix */
    kvq_buf *logits;         /* [logits_buf_rows][n_vocab], on the last device */
    int logits_buf_rows;
    float *logits_host;      /* rows of the last kvq_eval call */
    int logits_rows, logits_cap;
    char note[192];          /* kvq_context_note */
    double *embd_sum;        /* p.embeddings: final-normed hidden states summed since the cache was empty [n_embd] */
    float *embd_rows;        /* one piece's rows read back [n_batch][n_embd] */
    int embd_n;              /* positions summed in embd_sum */
};

/* One context's share of a forward pass: rows row0 .. row0+n-1 of the activations. */
typedef struct {
    kvq_context *c;
    int row0, n;
} kvq_graph_seq;

/* graph.c: one forward pass over n <= c->p.n_batch rows in c's activation buffers, made of
 * the tokens of one or more contexts (seqs, in row order; c itself first, at row 0). Each
 * context's rows go to its own cache at its positions n_past.. (n_past is not advanced).
 * Logits into dst, sequence after sequence: every row of one whose context has p.logits_all set,
 * else its last row (c->logits must hold them all). */
/* embeddings.c: adds n rows of final-normed hidden state (xb on device D) to c's sums; the
 * sums restart when these rows begin at position 0. */
kvq_status kvq_embd_add(kvq_context *c, const kvq_dev *D, const kvq_buf *xb, int n);

kvq_status kvq_graph_forward(kvq_context *c, const kvq_graph_seq *seqs, int n_seq, const int32_t *ids, int n, float *dst);

#endif
