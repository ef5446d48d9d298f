/* In-memory model: hyper-parameters, tokenizer, and weights uploaded to one backend. */
#ifndef KVQ_MODEL_H
#define KVQ_MODEL_H

#include "backend.h"
#include "hparams.h"
#include "safetensors.h"

enum { KVQ_LIN_Q, KVQ_LIN_K, KVQ_LIN_V, KVQ_LIN_O, KVQ_LIN_GATE, KVQ_LIN_UP, KVQ_LIN_DOWN, KVQ_LIN_COUNT };

typedef struct {
    kvq_wt *attn_norm, *ffn_norm;
    kvq_wt *lin[KVQ_LIN_COUNT];
} kvq_layer;

struct kvq_model {
    kvq_hparams hp;
    kvq_tokenizer *tok;
    const kvq_backend *be;
    kvq_bctx *bctx;
    kvq_wt *embed, *out_norm, *lm_head; /* lm_head == embed when tied */
    kvq_layer *layers;
    float *rope_freqs; /* head_dim/2 inverse frequencies (host) */
    size_t weight_bytes; /* all uploaded weights */
    size_t embed_bytes;  /* of which the embedding table */
    kvq_st st;           /* the checkpoint, mapped for the model's lifetime: weights may be used in place */
    char desc[256];
    char backend_note[512]; /* why auto selection passed over a backend ("" if it did not) */
};

/* model_load.c: reads dir into desc structs checked against config.json, uploads them. */
kvq_status kvq_model_load_weights(kvq_model *m, const char *dir, const kvq_st *st);

#endif
