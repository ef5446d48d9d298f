/* Model hyper-parameters from config.json (Llama / Mistral families, AQLM quantization_config). */
#ifndef KVQ_HPARAMS_H
#define KVQ_HPARAMS_H

#include "util.h"

typedef enum { KVQ_ROPE_NONE = 0, KVQ_ROPE_LINEAR, KVQ_ROPE_LLAMA3 } kvq_rope_scaling;

typedef struct {
    char arch[64];
    int n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    float rms_eps, rope_theta;
    int sliding_window; /* 0: none */
    int tie_embeddings;
    kvq_rope_scaling rope_scaling;
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;

    /* AQLM (quant_method "aqlm"), zero when the checkpoint is plain */
    int aqlm;
    int aqlm_codebooks, aqlm_nbits, aqlm_in_group;
    char **not_quantized; /* linear_weights_not_to_quantize */
    int n_not_quantized;
} kvq_hparams;

/* Parses and validates dir/config.json. */
kvq_status kvq_hparams_load(const char *dir, kvq_hparams *hp);
/* Parses config text (path for messages). */
kvq_status kvq_hparams_parse(const char *text, const char *path, kvq_hparams *hp);
void kvq_hparams_free(kvq_hparams *hp);
/* Fills head_dim/2 inverse frequencies, applying rope_scaling. */
void kvq_hparams_rope_freqs(const kvq_hparams *hp, float *inv_freq);

#endif
