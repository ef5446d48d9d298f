/* Sentence embeddings: with kvq_context_params.embeddings a context keeps the sum of the
 * final-normed hidden states of the positions it evaluates (the rows the LM head would read),
 * so a caller gets their mean without the logits of every position. */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "util.h"

int kvq_model_n_embd(const kvq_model *m) { return m ? m->hp.n_embd : 0; }

kvq_status kvq_embd_add(kvq_context *c, const kvq_dev *D, const kvq_buf *xb, int n) {
    const size_t d = (size_t)c->m->hp.n_embd;
    if (!c->embd_sum) { /* made at the first use: contexts without the flag never pay for it */
        c->embd_sum = calloc(d, sizeof *c->embd_sum);
        c->embd_rows = malloc(sizeof *c->embd_rows * d * (size_t)c->p.n_batch);
        if (!c->embd_sum || !c->embd_rows) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for the embedding sums");
    }
    kvq_status s = D->be->buf_read(D->b, xb, 0, c->embd_rows, sizeof *c->embd_rows * d * (size_t)n);
    if (s) return s;
    /* a forward at position 0 begins a new sequence (and longrope's re-evaluation starts over) */
    if (c->n_past == 0) {
        memset(c->embd_sum, 0, sizeof *c->embd_sum * d);
        c->embd_n = 0;
    }
    for (int i = 0; i < n; i++) {
        const float *r = c->embd_rows + (size_t)i * d;
        for (size_t j = 0; j < d; j++) c->embd_sum[j] += r[j];
    }
    c->embd_n += n;
    return KVQ_OK;
}

kvq_status kvq_embedding(const kvq_context *c, float *out) {
    if (!c || !out) return kvq_fail(KVQ_ERR_ARG, "kvq_embedding: no context or output");
    if (!c->p.embeddings) return kvq_fail(KVQ_ERR_ARG, "kvq_embedding: the context was made without the embeddings flag");
    if (!c->embd_sum || c->embd_n == 0 || c->n_past == 0) return kvq_fail(KVQ_ERR_ARG, "kvq_embedding: nothing evaluated yet");
    const int d = c->m->hp.n_embd;
    for (int j = 0; j < d; j++) out[j] = (float)(c->embd_sum[j] / c->embd_n);
    return KVQ_OK;
}
