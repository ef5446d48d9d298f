/* Model hyper-parameters from config.json: the architecture families kvq runs, what each
 * one changes in the forward pass, and the AQLM quantization_config. */
#ifndef KVQ_HPARAMS_H
#define KVQ_HPARAMS_H

#include "util.h"

typedef enum { KVQ_ROPE_NONE = 0, KVQ_ROPE_LINEAR, KVQ_ROPE_LLAMA3, KVQ_ROPE_LONGROPE } kvq_rope_scaling;

/* Families by checkpoint layout (tensor names). Mistral is a Llama. */
typedef enum { KVQ_FAM_LLAMA = 0, KVQ_FAM_MIXTRAL, KVQ_FAM_COHERE, KVQ_FAM_GEMMA, KVQ_FAM_PHI3, KVQ_FAM_QWEN2 } kvq_family;

typedef struct {
    char arch[64];
    kvq_family family;
    int n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    float rms_eps; /* the norms' epsilon (rms_norm_eps, or layer_norm_eps for LayerNorm families) */
    float rope_theta;
    int sliding_window; /* 0: none */
    int tie_embeddings;

    /* where the families differ (zero for Llama) */
    int layer_norm;      /* LayerNorm (mean-centred, no bias) instead of RMSNorm: Cohere */
    int norm_plus_one;   /* RMSNorm gains stored as (weight - 1): Gemma */
    int gelu;            /* GeGLU with tanh GELU instead of SwiGLU: Gemma */
    int rope_pairs;      /* RoPE on interleaved pairs: Cohere */
    int parallel_block;  /* attention and FFN from the same normed input: Cohere */
    int qk_norm;         /* per-head LayerNorm on q and k before RoPE: Cohere use_qk_norm */
    float logit_scale;   /* logits multiplied by this (Cohere), else 1 */
    int embed_scale;     /* embeddings multiplied by sqrt(n_embd) in the checkpoint's dtype: Gemma */
    int fused_qkv;       /* one qkv_proj, one gate_up_proj: Phi-3 */
    int n_expert, n_expert_used; /* mixture of experts (Mixtral); 0 for dense FFNs */

    kvq_rope_scaling rope_scaling;
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
    /* longrope / su (Phi-3): per-frequency divisors below and above rope_orig_ctx, and the
     * factor on cos/sin (applied as its square to the attention scale) */
    float *rope_short, *rope_long;
    float rope_attn_factor;

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
/* Fills head_dim/2 inverse frequencies, applying rope_scaling; long picks longrope's long
 * factors (a sequence longer than rope_orig_ctx), ignored by other scalings. */
void kvq_hparams_rope_freqs(const kvq_hparams *hp, float *inv_freq, int long_ctx);

#endif
