/* Checkpoint -> backend weights. Each tensor is looked up by its HF name,
 * checked against config.json (shape, dtype, AQLM layout), described as a
 * kvq_weight_desc and uploaded. Nothing is read before it has been checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static const char *const g_lin_names[KVQ_LIN_COUNT] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};

typedef struct {
    const kvq_st *st;
    const kvq_hparams *hp;
} loader;

static kvq_status shape_error(const loader *L, const kvq_st_tensor *t, const char *want) {
    char got[128];
    return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' has shape %s %s, config.json implies %s", kvq_st_path(L->st, t), t->name,
                    kvq_shape_str(t, got, sizeof got), t->dtype_name, want);
}

static int shape_is(const kvq_st_tensor *t, int nd, const int64_t *dims) {
    if (t->n_dims != nd) return 0;
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != dims[i]) return 0;
    return 1;
}

static kvq_status find(const loader *L, const char *name, const kvq_st_tensor **out) {
    *out = kvq_st_find(L->st, name);
    if (!*out) return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' is missing", L->st->paths[0], name);
    return KVQ_OK;
}

static kvq_status dense_fmt(const loader *L, const kvq_st_tensor *t, kvq_wformat *fmt) {
    switch (t->dtype) {
    case KVQ_DT_F32: *fmt = KVQ_W_F32; return KVQ_OK;
    case KVQ_DT_F16: *fmt = KVQ_W_F16; return KVQ_OK;
    case KVQ_DT_BF16: *fmt = KVQ_W_BF16; return KVQ_OK;
    default:
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s (F32, F16, BF16)", kvq_st_path(L->st, t),
                        t->name, t->dtype_name);
    }
}

/* A dense [rows, cols] matrix, or a [cols] vector when rows == 0. */
static kvq_status dense_desc(const loader *L, const char *name, int rows, int cols, kvq_weight_desc *d) {
    const kvq_st_tensor *t;
    kvq_status s = find(L, name, &t);
    if (s) return s;
    memset(d, 0, sizeof *d);
    d->name = t->name;
    if ((s = dense_fmt(L, t, &d->fmt))) return s;
    char want[96];
    if (rows == 0) {
        int64_t dims[1] = {cols};
        snprintf(want, sizeof want, "[%d]", cols);
        if (!shape_is(t, 1, dims)) return shape_error(L, t, want);
        d->rows = 1;
    } else {
        int64_t dims[2] = {rows, cols};
        snprintf(want, sizeof want, "[%d, %d]", rows, cols);
        if (!shape_is(t, 2, dims)) return shape_error(L, t, want);
        d->rows = rows;
    }
    d->cols = cols;
    d->data = t->data;
    d->in_mapping = 1;
    return KVQ_OK;
}

/* fp16 values must be finite: a NaN/Inf codebook entry or scale poisons every output it touches. */
static kvq_status check_f16_finite(const loader *L, const kvq_st_tensor *t) {
    size_t n = t->nbytes / 2;
    for (size_t i = 0; i < n; i++)
        if ((kvq_rd_u16(t->data, i) & 0x7C00) == 0x7C00)
            return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' holds NaN or Inf (value %zu)", kvq_st_path(L->st, t), t->name, i);
    return KVQ_OK;
}

/* Codes narrower than their storage (9..15 bits in int16) must not use the spare bits. */
static kvq_status check_codes(const loader *L, const kvq_st_tensor *t, int nbits) {
    if (t->dtype != KVQ_DT_I16 || nbits >= 16) return KVQ_OK;
    size_t n = t->nbytes / 2;
    for (size_t i = 0; i < n; i++) {
        uint16_t c = kvq_rd_u16(t->data, i);
        if (c >> nbits)
            return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' has code %d at index %zu, out of range for nbits_per_codebook %d",
                            kvq_st_path(L->st, t), t->name, (int16_t)c, i, nbits);
    }
    return KVQ_OK;
}

static int not_quantized(const kvq_hparams *hp, const char *name) {
    for (int i = 0; i < hp->n_not_quantized; i++)
        if (strcmp(hp->not_quantized[i], name) == 0) return 1;
    return 0;
}

/* A linear layer "<prefix>": AQLM (<prefix>.codes/.codebooks/.scales) or dense (<prefix>.weight), optional bias. */
static kvq_status linear_desc(const loader *L, const char *prefix, int rows, int cols, kvq_weight_desc *d) {
    const kvq_hparams *hp = L->hp;
    char name[512], wname[512];
    snprintf(name, sizeof name, "%s.codes", prefix);
    snprintf(wname, sizeof wname, "%s.weight", prefix);
    const kvq_st_tensor *codes = kvq_st_find(L->st, name);
    kvq_status s;
    if (!codes) {
        if (hp->aqlm && !not_quantized(hp, wname) && !kvq_st_find(L->st, wname))
            return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' is missing", L->st->paths[0], name);
        if ((s = dense_desc(L, wname, rows, cols, d))) return s;
    } else {
        if (!hp->aqlm)
            return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' is AQLM but config.json has no aqlm quantization_config",
                            kvq_st_path(L->st, codes), codes->name);
        int M = hp->aqlm_codebooks, ig = hp->aqlm_in_group, nb = hp->aqlm_nbits;
        if (cols % ig) return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: %d input features are not a multiple of in_group_size %d", prefix, cols, ig);
        char want[128];
        int64_t cd[3] = {rows, cols / ig, M};
        snprintf(want, sizeof want, "[%d, %d, %d] %s", rows, cols / ig, M, nb <= 8 ? "I8" : "I16");
        kvq_dtype cdt = nb <= 8 ? KVQ_DT_I8 : KVQ_DT_I16;
        if (!shape_is(codes, 3, cd) || codes->dtype != cdt) return shape_error(L, codes, want);
        const kvq_st_tensor *cb, *sc;
        snprintf(name, sizeof name, "%s.codebooks", prefix);
        if ((s = find(L, name, &cb))) return s;
        int64_t bd[4] = {M, (int64_t)1 << nb, 1, ig};
        snprintf(want, sizeof want, "[%d, %d, 1, %d] F16", M, 1 << nb, ig);
        if (!shape_is(cb, 4, bd) || cb->dtype != KVQ_DT_F16) return shape_error(L, cb, want);
        snprintf(name, sizeof name, "%s.scales", prefix);
        if ((s = find(L, name, &sc))) return s;
        int64_t sd[4] = {rows, 1, 1, 1};
        snprintf(want, sizeof want, "[%d, 1, 1, 1] F16", rows);
        if (!shape_is(sc, 4, sd) || sc->dtype != KVQ_DT_F16) return shape_error(L, sc, want);
        if ((s = check_codes(L, codes, nb)) || (s = check_f16_finite(L, cb)) || (s = check_f16_finite(L, sc))) return s;
        memset(d, 0, sizeof *d);
        d->fmt = KVQ_W_AQLM;
        d->rows = rows;
        d->cols = cols;
        d->n_codebooks = M;
        d->nbits = nb;
        d->in_group = ig;
        d->code_bytes = nb <= 8 ? 1 : 2;
        d->codes = codes->data;
        d->codebooks = cb->data;
        d->scales = sc->data;
        d->name = codes->name;
        d->in_mapping = 1;
    }
    snprintf(name, sizeof name, "%s.bias", prefix);
    const kvq_st_tensor *b = kvq_st_find(L->st, name);
    if (b) {
        int64_t bd[1] = {rows};
        char want[64];
        snprintf(want, sizeof want, "[%d]", rows);
        if (!shape_is(b, 1, bd)) return shape_error(L, b, want);
        if ((s = dense_fmt(L, b, &d->bias_fmt))) return s;
        d->bias = b->data;
    }
    return KVQ_OK;
}

static kvq_status upload(kvq_model *m, const kvq_weight_desc *d, kvq_wt **out) {
    if (m->be->weight_supported && !m->be->weight_supported(m->bctx, d))
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: backend %s cannot run this weight format", d->name, m->be->name);
    *out = m->be->weight_upload(m->bctx, d);
    if (!*out) return KVQ_ERR_BACKEND; /* message set by the backend */
    m->weight_bytes += m->be->weight_bytes(m->bctx, *out);
    return KVQ_OK;
}

static kvq_status load_dense(kvq_model *m, const loader *L, const char *name, int rows, int cols, kvq_wt **out) {
    kvq_weight_desc d;
    kvq_status s = dense_desc(L, name, rows, cols, &d);
    return s ? s : upload(m, &d, out);
}

kvq_status kvq_model_load_weights(kvq_model *m, const char *dir, const kvq_st *st) {
    const kvq_hparams *hp = &m->hp;
    /* ids the tokenizer can produce must have embedding rows (config may pad past the tokenizer) */
    if (m->tok && kvq_vocab_size(m->tok) > hp->n_vocab)
        return kvq_fail(KVQ_ERR_FORMAT, "%s/tokenizer.json: %d token ids, but config.json vocab_size is %d", dir,
                        kvq_vocab_size(m->tok), hp->n_vocab);
    loader L = {st, hp};
    int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    kvq_status s;
    int tied = hp->tie_embeddings && !kvq_st_find(st, "lm_head.weight");
    kvq_weight_desc ed;
    if ((s = dense_desc(&L, "model.embed_tokens.weight", hp->n_vocab, hp->n_embd, &ed))) return s;
    ed.rows_only = !tied; /* untied, the graph reads a few rows per token (get_rows) */
    if ((s = upload(m, &ed, &m->embed))) return s;
    m->embed_bytes = m->weight_bytes;
    if ((s = load_dense(m, &L, "model.norm.weight", 0, hp->n_embd, &m->out_norm))) return s;
    if (tied) {
        m->lm_head = m->embed;
    } else {
        kvq_weight_desc d;
        if ((s = linear_desc(&L, "lm_head", hp->n_vocab, hp->n_embd, &d)) || (s = upload(m, &d, &m->lm_head))) return s;
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    const int rows[KVQ_LIN_COUNT] = {q_dim, kv_dim, kv_dim, hp->n_embd, hp->n_ff, hp->n_ff, hp->n_embd};
    const int cols[KVQ_LIN_COUNT] = {hp->n_embd, hp->n_embd, hp->n_embd, q_dim, hp->n_embd, hp->n_embd, hp->n_ff};
    char name[256];
    for (int l = 0; l < hp->n_layer; l++) {
        kvq_layer *ly = &m->layers[l];
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        if ((s = load_dense(m, &L, name, 0, hp->n_embd, &ly->attn_norm))) return s;
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        if ((s = load_dense(m, &L, name, 0, hp->n_embd, &ly->ffn_norm))) return s;
        for (int k = 0; k < KVQ_LIN_COUNT; k++) {
            kvq_weight_desc d;
            snprintf(name, sizeof name, "model.layers.%d.%s", l, g_lin_names[k]);
            if ((s = linear_desc(&L, name, rows[k], cols[k], &d)) || (s = upload(m, &d, &ly->lin[k]))) return s;
        }
    }
    return KVQ_OK;
}
