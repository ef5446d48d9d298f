/* In-memory model: hyper-parameters, tokenizer, and weights uploaded to one backend. */
#ifndef KVQ_MODEL_H
#define KVQ_MODEL_H

#include "backend.h"
#include "hparams.h"
#include "safetensors.h"

enum { KVQ_LIN_Q, KVQ_LIN_K, KVQ_LIN_V, KVQ_LIN_O, KVQ_LIN_GATE, KVQ_LIN_UP, KVQ_LIN_DOWN, KVQ_LIN_COUNT };

/* Experts' projections of a mixture-of-experts FFN, one array of n_expert weights each. */
enum { KVQ_MOE_GATE, KVQ_MOE_UP, KVQ_MOE_DOWN, KVQ_MOE_COUNT };

/* A backend instance the model runs on: the whole model, or with offload (-ngl) its first
 * layers on the CPU and the rest on the GPU. */
typedef struct {
    const kvq_backend *be;
    kvq_bctx *b;
} kvq_dev;

typedef struct {
    int dev;                  /* index into kvq_model.dev */
    kvq_wt *attn_norm;
    kvq_wt *ffn_norm;         /* NULL where attention and FFN share attn_norm (parallel blocks) */
    kvq_wt *q_norm, *k_norm;  /* per-head gains [heads][head_dim] (qk_norm), else NULL */
    /* Fused checkpoints (Phi-3): lin[Q] is qkv_proj, lin[GATE] gate_up_proj, and K, V, UP are NULL.
     * Mixtures of experts: GATE, UP, DOWN are NULL and the experts are in moe. */
    kvq_wt *lin[KVQ_LIN_COUNT];
    kvq_wt *router;                 /* [n_expert][n_embd], dense */
    kvq_wt **moe[KVQ_MOE_COUNT];    /* [n_expert] each */
} kvq_layer;

struct kvq_model {
    kvq_hparams hp;
    kvq_tokenizer *tok;
    const kvq_backend *be; /* the chosen backend: all layers, or the offloaded last ones, and the LM head */
    kvq_bctx *bctx;
    kvq_dev dev[2];        /* dev[n_dev-1] is (be, bctx); with offload dev[0] is the CPU */
    int n_dev;
    int gpu_from;          /* with offload: the first layer on dev[1] */
    int load_threads;      /* threads that upload layers in parallel (kvq_model_params.n_threads) */
    size_t dev_bytes[2];   /* weight bytes on each device */
    kvq_wt *embed;         /* on dev[0] (embedding lookups) */
    kvq_wt *out_norm, *lm_head; /* on dev[n_dev-1]; lm_head == embed when tied on one device */
    kvq_layer *layers;
    float *rope_freqs;      /* head_dim/2 inverse frequencies (host) */
    float *rope_freqs_long; /* longrope's for sequences past rope_orig_ctx, else NULL */
    float embed_scale;      /* embeddings are multiplied by this (1, or Gemma's sqrt(n_embd)) */
    float *owned;           /* tensors the loader had to make (Gemma's 1 + norm gains) */
    size_t owned_used, owned_cap; /* floats */
    size_t weight_bytes; /* all uploaded weights */
    size_t embed_bytes;  /* of which the embedding table */
    size_t expert_bytes; /* of which the experts of mixture-of-experts layers */
    kvq_st st;           /* the checkpoint, mapped for the model's lifetime: weights may be used in place */
    uint64_t identity;   /* config.json and samples of the checkpoint's bytes, hashed: a saved session's model */
    char desc[256];
    char plan[320];
    char plan_note[128]; /* how -ngl auto chose, "" otherwise */
    size_t layer_bytes;  /* -ngl auto: a layer's checkpoint bytes on average (0 otherwise) */
    char backend_note[512]; /* why auto selection passed over a backend ("" if it did not) */
};

/* model_load.c: reads dir into desc structs checked against config.json, uploads them. */
kvq_status kvq_model_load_weights(kvq_model *m, const char *dir, const kvq_st *st);

/* graph.c: fails naming the op when the backend lacks one this family's forward uses. */
kvq_status kvq_graph_check_backend(const kvq_hparams *hp, const kvq_backend *be);

#endif
