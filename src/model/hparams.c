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

static kvq_status parse_rope_scaling(const cJSON *rs, const char *path, kvq_hparams *hp) {
    if (!rs || cJSON_IsNull(rs)) return KVQ_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) return kvq_fail(KVQ_ERR_FORMAT, "%s: rope_scaling has no rope_type", path);
    kvq_status s;
    if ((s = get_float(rs, "factor", 1.0, 1e-6, 1e6, &hp->rope_factor, path))) return s;
    if (strcmp(t->valuestring, "default") == 0) return KVQ_OK;
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
    return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported rope_scaling.rope_type '%.40s' (default, linear, llama3)", path, t->valuestring);
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
    if (strcmp(hp->arch, "LlamaForCausalLM") != 0 && strcmp(hp->arch, "MistralForCausalLM") != 0) {
        s = kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported architecture '%s' (LlamaForCausalLM, MistralForCausalLM)", path,
                     hp->arch[0] ? hp->arch : "(none)");
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
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        s = kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unsupported hidden_act '%.40s' (silu)", path, act->valuestring);
        goto done;
    }
    hp->tie_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings"));
    if ((s = parse_rope_scaling(cJSON_GetObjectItemCaseSensitive(root, "rope_scaling"), path, hp))) goto done;
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
    for (int i = 0; i < hp->n_not_quantized; i++) free(hp->not_quantized[i]);
    free(hp->not_quantized);
    hp->not_quantized = NULL;
    hp->n_not_quantized = 0;
}

void kvq_hparams_rope_freqs(const kvq_hparams *hp, float *inv_freq) {
    int half = hp->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = pow((double)hp->rope_theta, -(double)(2 * i) / hp->head_dim);
        if (hp->rope_scaling == KVQ_ROPE_LINEAR) {
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
