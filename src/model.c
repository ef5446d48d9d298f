/* kvq_model_*: config + tokenizer + checkpoint -> weights on a backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

kvq_model_params kvq_model_default_params(void) {
    kvq_model_params p = {.backend = NULL, .n_threads = 0};
    return p;
}

static kvq_status pick_backend(kvq_model *m, const kvq_model_params *p) {
    kvq_backend_opts o = {.n_threads = p->n_threads};
    if (p->backend && *p->backend) {
        m->be = kvq_backend_find(p->backend);
        if (!m->be) return kvq_fail(KVQ_ERR_UNSUPPORTED, "backend '%s' is not built into this kvq", p->backend);
        return m->be->init(&o, &m->bctx);
    }
    kvq_status s = KVQ_ERR_UNSUPPORTED;
    for (int i = 0; i < kvq_backend_count() && s != KVQ_OK; i++) {
        m->be = kvq_backend_get(i);
        s = m->be->init(&o, &m->bctx);
    }
    return s;
}

static kvq_status check_shapes(const kvq_hparams *hp, const char *dir) {
    if (hp->head_dim > 1024) return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s/config.json: head_dim %d is too large (<= 1024)", dir, hp->head_dim);
    return KVQ_OK;
}

kvq_status kvq_model_load(const char *dir, const kvq_model_params *params, kvq_model **out) {
    *out = NULL;
    kvq_model_params dp = kvq_model_default_params();
    const kvq_model_params *p = params ? params : &dp;
    kvq_model *m = calloc(1, sizeof *m);
    if (!m) return kvq_fail(KVQ_ERR_NOMEM, "out of memory");
    kvq_status s;
    if ((s = kvq_hparams_load(dir, &m->hp)) || (s = check_shapes(&m->hp, dir)) || (s = kvq_tokenizer_load(dir, &m->tok)) ||
        (s = kvq_st_open_dir(&m->st, dir)) || (s = pick_backend(m, p)) || (s = kvq_model_load_weights(m, dir, &m->st)))
        goto fail;
    int half = m->hp.head_dim / 2;
    float *freqs = malloc(sizeof(float) * (size_t)half);
    m->rope_freqs = freqs ? m->be->buf_new(m->bctx, sizeof(float) * (size_t)half) : NULL;
    if (!m->rope_freqs) {
        free(freqs);
        s = kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kvq_hparams_rope_freqs(&m->hp, freqs);
    m->be->buf_write(m->bctx, m->rope_freqs, 0, freqs, sizeof(float) * (size_t)half);
    free(freqs);
    const kvq_hparams *hp = &m->hp;
    snprintf(m->desc, sizeof m->desc, "%s, %d layers, hidden %d, heads %d/%d x %d, vocab %d, %s, %.1f MiB of weights",
             hp->arch, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_vocab,
             hp->aqlm ? (hp->aqlm_codebooks == 1 && hp->aqlm_nbits == 16 ? "AQLM 1x16" : hp->aqlm_codebooks == 2 && hp->aqlm_nbits == 8 ? "AQLM 2x8" : "AQLM")
                      : "dense",
             (double)m->weight_bytes / (1 << 20));
    *out = m;
    return KVQ_OK;
fail:
    kvq_model_free(m);
    return s;
}

void kvq_model_free(kvq_model *m) {
    if (!m) return;
    if (m->bctx) {
        const kvq_backend *be = m->be;
        if (m->layers) {
            for (int l = 0; l < m->hp.n_layer; l++) {
                be->weight_free(m->bctx, m->layers[l].attn_norm);
                be->weight_free(m->bctx, m->layers[l].ffn_norm);
                for (int k = 0; k < KVQ_LIN_COUNT; k++) be->weight_free(m->bctx, m->layers[l].lin[k]);
            }
        }
        if (m->lm_head != m->embed) be->weight_free(m->bctx, m->lm_head);
        be->weight_free(m->bctx, m->embed);
        be->weight_free(m->bctx, m->out_norm);
        be->buf_free(m->bctx, m->rope_freqs);
        be->release(m->bctx);
    }
    kvq_st_close(&m->st); /* after the backend: its weights may point into the mapping */
    free(m->layers);
    kvq_tokenizer_free(m->tok);
    kvq_hparams_free(&m->hp);
    free(m);
}

const kvq_tokenizer *kvq_model_tokenizer(const kvq_model *m) { return m->tok; }
int kvq_model_n_vocab(const kvq_model *m) { return m->hp.n_vocab; }
int kvq_model_n_ctx_train(const kvq_model *m) { return m->hp.n_ctx_train; }
const char *kvq_model_backend_name(const kvq_model *m) { return m->be->describe(m->bctx); }
const char *kvq_model_desc(const kvq_model *m) { return m->desc; }
size_t kvq_model_weight_bytes(const kvq_model *m) {
    return m->lm_head == m->embed ? m->weight_bytes : m->weight_bytes - m->embed_bytes;
}
