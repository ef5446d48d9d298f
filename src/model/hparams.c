#include "hparams.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Integer field: required when dflt < 0. Range-checked so later size arithmetic cannot overflow. */
static kvq_status get_int(const cJSON *root, const char *key, int dflt, int lo, int hi, int *out, const char *path) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        if (dflt < 0) return kvq_fail(KVQ_ERR_FORMAT, "%s: missing field '%s'", path, key);
        *out = dflt;
        return KVQ_OK;
    }
    /* range first: converting an out-of-range double to int is undefined */
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo && j->valuedouble <= hi) || j->valuedouble != (double)(int)j->valuedouble)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: field '%s' must be an integer in %d..%d", path, key, lo, hi);
    *out = (int)j->valuedouble;
    return KVQ_OK;
}

static kvq_status get_float(const cJSON *root, const char *key, double dflt, double lo, double hi, float *out, const char *path) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        *out = (float)dflt;
        return KVQ_OK;
    }
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo && j->valuedouble <= hi))
        return kvq_fail(KVQ_ERR_FORMAT, "%s: field '%s' must be a number in %g..%g", path, key, lo, hi);
    *out = (float)j->valuedouble;
    return KVQ_OK;
}

static kvq_status parse_aqlm(const cJSON *q, const char *path, kvq_hparams *hp) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsString(m)) return kvq_fail(KVQ_ERR_FORMAT, "%s: quantization_config.quant_method missing", path);
    if (strcmp(m->valuestring, "aqlm") != 0)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported quantization_config.quant_method '%.40s' (kvq runs 'aqlm' and unquantized fp16/bf16/fp32)",
                        path, m->valuestring);
    int og = 1;
    kvq_status s;
    if ((s = get_int(q, "num_codebooks", -1, 0, 1 << 20, &hp->aqlm_codebooks, path)) ||
        (s = get_int(q, "nbits_per_codebook", -1, 0, 1 << 20, &hp->aqlm_nbits, path)) ||
        (s = get_int(q, "in_group_size", -1, 0, 1 << 20, &hp->aqlm_in_group, path)) ||
        (s = get_int(q, "out_group_size", 1, 0, 1 << 20, &og, path)))
        return s;
    if (hp->aqlm_codebooks < 1 || hp->aqlm_codebooks > 8)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported quantization_config.num_codebooks %d (1..8)", path, hp->aqlm_codebooks);
    if (hp->aqlm_nbits < 8 || hp->aqlm_nbits > 16)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported quantization_config.nbits_per_codebook %d (8..16)", path, hp->aqlm_nbits);
    if (hp->aqlm_in_group != 8 && hp->aqlm_in_group != 16)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported quantization_config.in_group_size %d (8 or 16)", path, hp->aqlm_in_group);
    if (og != 1) return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported quantization_config.out_group_size %d (1)", path, og);
    const cJSON *nq = cJSON_GetObjectItemCaseSensitive(q, "linear_weights_not_to_quantize");
    if (nq && !cJSON_IsNull(nq)) {
        if (!cJSON_IsArray(nq)) return kvq_fail(KVQ_ERR_FORMAT, "%s: linear_weights_not_to_quantize must be a list", path);
        int n = cJSON_GetArraySize(nq);
        hp->not_quantized = calloc((size_t)n + 1, sizeof(char *));
        if (!hp->not_quantized) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
        for (const cJSON *e = nq->child; e; e = e->next) {
            if (!cJSON_IsString(e)) return kvq_fail(KVQ_ERR_FORMAT, "%s: linear_weights_not_to_quantize holds a non-string", path);
            hp->not_quantized[hp->n_not_quantized] = strdup(e->valuestring);
            if (!hp->not_quantized[hp->n_not_quantized++]) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    hp->aqlm = 1;
    return KVQ_OK;
}

/* A list of head_dim/2 positive numbers (longrope's short_factor / long_factor). */
static kvq_status get_factors(const cJSON *rs, const char *key, const char *path, const kvq_hparams *hp, float **out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(rs, key);
    int half = hp->head_dim / 2;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != half)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: rope_scaling.%s must be a list of %d numbers (head_dim / 2)", path, key, half);
    *out = malloc(sizeof(float) * (size_t)half);
    if (!*out) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0 && e->valuedouble < 1e9))
            return kvq_fail(KVQ_ERR_FORMAT, "%s: rope_scaling.%s[%d] must be a positive number", path, key, i);
        (*out)[i] = (float)e->valuedouble;
    }
    return KVQ_OK;
}

/* Phi-3's su / longrope: frequencies divided per dimension by short or long factors, and
 * cos/sin scaled by sqrt(1 + ln(s)/ln(orig)) where s = max_position_embeddings / orig. */
static kvq_status parse_longrope(const cJSON *root, const cJSON *rs, const char *path, kvq_hparams *hp) {
    kvq_status s;
    hp->rope_scaling = KVQ_ROPE_LONGROPE;
    if ((s = get_int(root, "original_max_position_embeddings", -1, 1, 1 << 30, &hp->rope_orig_ctx, path)) ||
        (s = get_factors(rs, "short_factor", path, hp, &hp->rope_short)) || (s = get_factors(rs, "long_factor", path, hp, &hp->rope_long)))
        return s;
    double scale = (double)hp->n_ctx_train / hp->rope_orig_ctx;
    hp->rope_attn_factor = scale <= 1 || hp->rope_orig_ctx < 2 ? 1.0f : (float)sqrt(1 + log(scale) / log((double)hp->rope_orig_ctx));
    return get_float(rs, "attention_factor", hp->rope_attn_factor, 1e-6, 1e6, &hp->rope_attn_factor, path);
}

static kvq_status parse_rope_scaling(const cJSON *root, const char *path, kvq_hparams *hp) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return KVQ_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) return kvq_fail(KVQ_ERR_FORMAT, "%s: rope_scaling has no rope_type", path);
    kvq_status s;
    if ((s = get_float(rs, "factor", 1.0, 1e-6, 1e6, &hp->rope_factor, path))) return s;
    if (strcmp(t->valuestring, "default") == 0) return KVQ_OK;
    if (hp->family == KVQ_FAM_PHI3 && (strcmp(t->valuestring, "longrope") == 0 || strcmp(t->valuestring, "su") == 0))
        return parse_longrope(root, rs, path, hp);
    if (strcmp(t->valuestring, "linear") == 0) {
        hp->rope_scaling = KVQ_ROPE_LINEAR;
        return KVQ_OK;
    }
    if (strcmp(t->valuestring, "llama3") == 0) {
        hp->rope_scaling = KVQ_ROPE_LLAMA3;
        if ((s = get_float(rs, "low_freq_factor", 1.0, 1e-6, 1e6, &hp->rope_low_freq, path)) ||
            (s = get_float(rs, "high_freq_factor", 4.0, 1e-6, 1e6, &hp->rope_high_freq, path)) ||
            (s = get_int(rs, "original_max_position_embeddings", 8192, 1, 1 << 30, &hp->rope_orig_ctx, path)))
            return s;
        if (hp->rope_high_freq <= hp->rope_low_freq)
            return kvq_fail(KVQ_ERR_FORMAT, "%s: rope_scaling high_freq_factor must exceed low_freq_factor", path);
        return KVQ_OK;
    }
    return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported rope_scaling.rope_type '%.40s' (default, linear, llama3; longrope/su for Phi-3)", path, t->valuestring);
}

static int get_bool(const cJSON *root, const char *key, int dflt) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

/* What each family changes in the forward, from its config fields and HF's defaults for them. */
static kvq_status parse_family(const cJSON *root, const char *path, kvq_hparams *hp) {
    kvq_status s;
    int tie_default = 0;
    const char *act_key = "hidden_act";
    hp->logit_scale = 1.0f;
    switch (hp->family) {
    case KVQ_FAM_LLAMA: break;
    case KVQ_FAM_MIXTRAL:
        if ((s = get_int(root, "num_local_experts", -1, 1, 256, &hp->n_expert, path)) ||
            (s = get_int(root, "num_experts_per_tok", -1, 1, hp->n_expert, &hp->n_expert_used, path)))
            return s;
        break;
    case KVQ_FAM_COHERE:
        tie_default = 1;
        hp->layer_norm = hp->rope_pairs = hp->parallel_block = 1;
        hp->qk_norm = get_bool(root, "use_qk_norm", 0);
        if ((s = get_float(root, "layer_norm_eps", 1e-5, 0, 1, &hp->rms_eps, path)) ||
            (s = get_float(root, "logit_scale", 0.0625, -1e6, 1e6, &hp->logit_scale, path)))
            return s;
        break;
    case KVQ_FAM_GEMMA:
        tie_default = 1;
        hp->norm_plus_one = hp->gelu = hp->embed_scale = 1;
        /* HF's Gemma takes hidden_activation, and the tanh GELU when it is unset */
        act_key = "hidden_activation";
        break;
    case KVQ_FAM_PHI3: {
        hp->fused_qkv = 1;
        float prf;
        if ((s = get_float(root, "partial_rotary_factor", 1.0, 0, 1, &prf, path))) return s;
        if (prf != 1.0f) return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported partial_rotary_factor %g (1)", path, prf);
        break;
    }
    case KVQ_FAM_QWEN2:
        /* Qwen2's window applies only with use_sliding_window (off in the published models) */
        if (get_bool(root, "use_sliding_window", 0))
            return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported use_sliding_window true (Qwen2's per-layer windows)", path);
        hp->sliding_window = 0;
        break;
    }
    hp->tie_embeddings = get_bool(root, "tie_word_embeddings", tie_default);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, act_key);
    if (hp->gelu) {
        if (cJSON_IsString(act) && strcmp(act->valuestring, "gelu_pytorch_tanh") != 0 && strcmp(act->valuestring, "gelu_tanh") != 0)
            return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported %s '%.40s' (gelu_pytorch_tanh)", path, act_key, act->valuestring);
    } else if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported %s '%.40s' (silu)", path, act_key, act->valuestring);
    }
    return KVQ_OK;
}

kvq_status kvq_hparams_parse(const char *text, const char *path, kvq_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    cJSON *root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvq_fail(KVQ_ERR_FORMAT, "%s: not a valid JSON object", path);
    }
    kvq_status s = KVQ_OK;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(a0)) snprintf(hp->arch, sizeof hp->arch, "%s", a0->valuestring);
    else if (cJSON_IsString(mt) && strcmp(mt->valuestring, "llama") == 0) snprintf(hp->arch, sizeof hp->arch, "LlamaForCausalLM");
    else if (cJSON_IsString(mt) && strcmp(mt->valuestring, "mistral") == 0) snprintf(hp->arch, sizeof hp->arch, "MistralForCausalLM");
    static const struct { const char *arch; kvq_family fam; } archs_known[] = {
        {"LlamaForCausalLM", KVQ_FAM_LLAMA},  {"MistralForCausalLM", KVQ_FAM_LLAMA}, {"MixtralForCausalLM", KVQ_FAM_MIXTRAL},
        {"CohereForCausalLM", KVQ_FAM_COHERE}, {"GemmaForCausalLM", KVQ_FAM_GEMMA},   {"Phi3ForCausalLM", KVQ_FAM_PHI3},
        {"Qwen2ForCausalLM", KVQ_FAM_QWEN2},
    };
    int known = 0;
    for (size_t i = 0; i < sizeof archs_known / sizeof archs_known[0]; i++)
        if (strcmp(hp->arch, archs_known[i].arch) == 0) hp->family = archs_known[i].fam, known = 1;
    if (!known) {
        s = kvq_fail(KVQ_ERR_UNSUPPORTED,
                     "%s: unsupported architecture '%s' (LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, CohereForCausalLM, "
                     "GemmaForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM)",
                     path, hp->arch[0] ? hp->arch : "(none)");
        goto done;
    }
    const int BIG = 1 << 20;
    if ((s = get_int(root, "hidden_size", -1, 1, BIG, &hp->n_embd, path)) ||
        (s = get_int(root, "intermediate_size", -1, 1, 1 << 22, &hp->n_ff, path)) ||
        (s = get_int(root, "num_hidden_layers", -1, 1, 4096, &hp->n_layer, path)) ||
        (s = get_int(root, "num_attention_heads", -1, 1, 4096, &hp->n_head, path)) ||
        (s = get_int(root, "num_key_value_heads", hp->n_head, 1, 4096, &hp->n_head_kv, path)) ||
        (s = get_int(root, "vocab_size", -1, 1, 1 << 24, &hp->n_vocab, path)) ||
        (s = get_int(root, "max_position_embeddings", 2048, 1, 1 << 30, &hp->n_ctx_train, path)) ||
        (s = get_int(root, "sliding_window", 0, 0, 1 << 30, &hp->sliding_window, path)) ||
        (s = get_float(root, "rms_norm_eps", 1e-6, 0, 1, &hp->rms_eps, path)) ||
        (s = get_float(root, "rope_theta", 10000.0, 1e-3, 1e12, &hp->rope_theta, path)))
        goto done;
    if (hp->n_head % hp->n_head_kv) {
        s = kvq_fail(KVQ_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path, hp->n_head, hp->n_head_kv);
        goto done;
    }
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if ((!hd || cJSON_IsNull(hd)) && hp->n_embd % hp->n_head) {
        s = kvq_fail(KVQ_ERR_FORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d (and no head_dim is given)", path,
                     hp->n_embd, hp->n_head);
        goto done;
    }
    int hd_default = hp->n_embd % hp->n_head ? -1 : hp->n_embd / hp->n_head;
    if ((s = get_int(root, "head_dim", hd_default, 2, 4096, &hp->head_dim, path))) goto done;
    if (hp->head_dim % 2) {
        s = kvq_fail(KVQ_ERR_FORMAT, "%s: head_dim %d must be even for RoPE", path, hp->head_dim);
        goto done;
    }
    if ((s = parse_family(root, path, hp))) goto done;
    if ((s = parse_rope_scaling(root, path, hp))) goto done;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (q && !cJSON_IsNull(q)) s = parse_aqlm(q, path, hp);
done:
    cJSON_Delete(root);
    return s;
}

kvq_status kvq_hparams_load(const char *dir, kvq_hparams *hp) {
    char path[4096];
    kvq_path_join(path, sizeof path, dir, "config.json");
    char *text;
    memset(hp, 0, sizeof *hp);
    kvq_status s = kvq_read_file(path, &text, NULL);
    if (s != KVQ_OK) return s;
    s = kvq_hparams_parse(text, path, hp);
    free(text);
    return s;
}

void kvq_hparams_free(kvq_hparams *hp) {
    free(hp->rope_short);
    free(hp->rope_long);
    hp->rope_short = hp->rope_long = NULL;
    for (int i = 0; i < hp->n_not_quantized; i++) free(hp->not_quantized[i]);
    free(hp->not_quantized);
    hp->not_quantized = NULL;
    hp->n_not_quantized = 0;
}

void kvq_hparams_rope_freqs(const kvq_hparams *hp, float *inv_freq, int long_ctx) {
    int half = hp->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = pow((double)hp->rope_theta, -(double)(2 * i) / hp->head_dim);
        if (hp->rope_scaling == KVQ_ROPE_LONGROPE) {
            f /= long_ctx ? hp->rope_long[i] : hp->rope_short[i];
        } else if (hp->rope_scaling == KVQ_ROPE_LINEAR) {
            f /= hp->rope_factor;
        } else if (hp->rope_scaling == KVQ_ROPE_LLAMA3) {
            /* Llama 3.1: long wavelengths slowed by `factor`, short ones kept, smooth blend between. */
            double wavelen = 2 * M_PI / f;
            double low_wl = hp->rope_orig_ctx / hp->rope_low_freq, high_wl = hp->rope_orig_ctx / hp->rope_high_freq;
            if (wavelen > low_wl) {
                f /= hp->rope_factor;
            } else if (wavelen >= high_wl) {
                double smooth = (hp->rope_orig_ctx / wavelen - hp->rope_low_freq) / (hp->rope_high_freq - hp->rope_low_freq);
                f = (1 - smooth) * f / hp->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}
