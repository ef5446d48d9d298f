/* Checkpoint -> backend weights. Each tensor is looked up by its HF name,
 * checked against config.json (shape, dtype, AQLM layout), described as a
 * kvq_weight_desc and uploaded. Nothing is read before it has been checked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "ref/ref.h"

static const char *const g_lin_names[KVQ_LIN_COUNT] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};

/* What one run of uploads reads and where it puts them. A layer's uploads run
 * on a loader of their own (layers load in parallel on the CPU), so the byte
 * counts and the slice of m->owned are per loader and summed afterwards. */
typedef struct {
    const kvq_st *st;
    const kvq_hparams *hp;
    int dev;              /* index into kvq_model.dev the uploads go to */
    size_t bytes[2];      /* weight bytes uploaded, per device */
    size_t expert_bytes;  /* of which experts */
    float *owned;         /* slice of m->owned for Gemma's (1 + gain) norms */
    size_t owned_used, owned_cap; /* floats */
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
    /* blocks without an early exit (they vectorize: a 7B 1x16's codebooks are 224 MB),
     * then the first bad value of the block that has one */
    for (size_t b = 0; b < n; b += 4096) {
        size_t e = n - b < 4096 ? n : b + 4096;
        unsigned bad = 0;
        for (size_t i = b; i < e; i++) bad |= (kvq_rd_u16(t->data, i) & 0x7C00) == 0x7C00;
        if (!bad) continue;
        for (size_t i = b; i < e; i++)
            if ((kvq_rd_u16(t->data, i) & 0x7C00) == 0x7C00)
                return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' holds NaN or Inf (value %zu)", kvq_st_path(L->st, t), t->name, i);
    }
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

static kvq_status upload(kvq_model *m, loader *L, const kvq_weight_desc *d, kvq_wt **out) {
    const kvq_dev *D = &m->dev[L->dev];
    if (D->be->weight_supported && !D->be->weight_supported(D->b, d))
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: backend %s cannot run this weight format", d->name, D->be->name);
    *out = D->be->weight_upload(D->b, d);
    if (!*out) return KVQ_ERR_BACKEND; /* message set by the backend */
    L->bytes[L->dev] += D->be->weight_bytes(D->b, *out);
    return KVQ_OK;
}

/* Adds what L uploaded to the model's counts. */
static void account(kvq_model *m, const loader *L) {
    for (int d = 0; d < 2; d++) m->dev_bytes[d] += L->bytes[d], m->weight_bytes += L->bytes[d];
    m->expert_bytes += L->expert_bytes;
}

static kvq_status load_dense(kvq_model *m, loader *L, const char *name, int rows, int cols, kvq_wt **out) {
    kvq_weight_desc d;
    kvq_status s = dense_desc(L, name, rows, cols, &d);
    return s ? s : upload(m, L, &d, out);
}

static kvq_status load_linear(kvq_model *m, loader *L, const char *name, int rows, int cols, kvq_wt **out) {
    kvq_weight_desc d;
    kvq_status s = linear_desc(L, name, rows, cols, &d);
    return s ? s : upload(m, L, &d, out);
}

/* A norm's gain vector; Gemma stores (gain - 1), so the loader adds the 1 back in f32. */
static kvq_status load_norm(kvq_model *m, loader *L, const char *name, kvq_wt **out) {
    const int dim = m->hp.n_embd;
    kvq_weight_desc d;
    kvq_status s = dense_desc(L, name, 0, dim, &d);
    if (s || !m->hp.norm_plus_one) return s ? s : upload(m, L, &d, out);
    if (!L->owned || L->owned_used + (size_t)dim > L->owned_cap)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: more norms than the model has layers", name);
    float *g = L->owned + L->owned_used;
    L->owned_used += (size_t)dim;
    kvq_ref_weight_row(&d, 0, g); /* as f32 */
    for (int i = 0; i < dim; i++) g[i] += 1.0f;
    kvq_weight_desc one = d;
    one.fmt = KVQ_W_F32, one.data = g, one.in_mapping = 0;
    return upload(m, L, &one, out);
}

/* sqrt(n_embd) rounded to the embedding table's dtype, as HF's Gemma forms its normalizer. */
static float embed_normalizer(const kvq_hparams *hp, kvq_wformat fmt) {
    float v = sqrtf((float)hp->n_embd);
    if (fmt == KVQ_W_F16) return kvq_f16_to_f32(kvq_f32_to_f16(v));
    if (fmt == KVQ_W_BF16) {
        uint32_t u;
        memcpy(&u, &v, 4);
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u; /* round to nearest even */
        memcpy(&v, &u, 4);
    }
    return v;
}

static kvq_status load_experts(kvq_model *m, loader *L, int l, kvq_layer *ly) {
    const kvq_hparams *hp = &m->hp;
    char name[256];
    kvq_status s;
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.gate.weight", l);
    if ((s = load_dense(m, L, name, hp->n_expert, hp->n_embd, &ly->router))) return s;
    /* Mixtral's w1 is the gate, w3 the up and w2 the down projection */
    static const char *const wname[KVQ_MOE_COUNT] = {"w1", "w3", "w2"};
    size_t before = L->bytes[L->dev];
    const int rows[KVQ_MOE_COUNT] = {hp->n_ff, hp->n_ff, hp->n_embd}, cols[KVQ_MOE_COUNT] = {hp->n_embd, hp->n_embd, hp->n_ff};
    for (int k = 0; k < KVQ_MOE_COUNT; k++) {
        ly->moe[k] = calloc((size_t)hp->n_expert, sizeof(kvq_wt *));
        if (!ly->moe[k]) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d experts", hp->n_expert);
        for (int e = 0; e < hp->n_expert; e++) {
            snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s", l, e, wname[k]);
            if ((s = load_linear(m, L, name, rows[k], cols[k], &ly->moe[k][e]))) return s;
        }
    }
    L->expert_bytes += L->bytes[L->dev] - before;
    return KVQ_OK;
}

/* Layer l through its own loader L (set up by the caller: its slice of m->owned). */
static kvq_status load_layer(kvq_model *m, loader *L, int l) {
    const kvq_hparams *hp = &m->hp;
    kvq_layer *ly = &m->layers[l];
    ly->dev = L->dev = m->n_dev > 1 && l >= m->gpu_from ? 1 : 0;
    const int d = hp->n_embd, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    char name[256];
    kvq_status s;
    snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
    if ((s = load_norm(m, L, name, &ly->attn_norm))) return s;
    if (!hp->parallel_block) {
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        if ((s = load_norm(m, L, name, &ly->ffn_norm))) return s;
    }
    if (hp->qk_norm) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", l);
        if ((s = load_dense(m, L, name, hp->n_head, hp->head_dim, &ly->q_norm))) return s;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_norm.weight", l);
        if ((s = load_dense(m, L, name, hp->n_head_kv, hp->head_dim, &ly->k_norm))) return s;
    }
    const int rows[KVQ_LIN_COUNT] = {q_dim, kv_dim, kv_dim, d, hp->n_ff, hp->n_ff, d};
    const int cols[KVQ_LIN_COUNT] = {d, d, d, q_dim, d, d, hp->n_ff};
    for (int k = 0; k < KVQ_LIN_COUNT; k++) {
        int r = rows[k];
        const char *lname = g_lin_names[k];
        if (hp->fused_qkv) { /* Phi-3: one matrix for q|k|v and one for gate|up, split by output rows */
            if (k == KVQ_LIN_K || k == KVQ_LIN_V || k == KVQ_LIN_UP) continue;
            if (k == KVQ_LIN_Q) lname = "self_attn.qkv_proj", r = q_dim + 2 * kv_dim;
            if (k == KVQ_LIN_GATE) lname = "mlp.gate_up_proj", r = 2 * hp->n_ff;
        }
        if (hp->n_expert && k >= KVQ_LIN_GATE) continue;
        snprintf(name, sizeof name, "model.layers.%d.%s", l, lname);
        if ((s = load_linear(m, L, name, r, cols[k], &ly->lin[k]))) return s;
    }
    return hp->n_expert ? load_experts(m, L, l, ly) : KVQ_OK;
}

/* Layers upload in parallel, one layer per task, when every device's backend
 * allows it (the CPU): the AQLM repacking inside an upload then runs on one
 * thread (nested regions are inactive), so the threads never wait for each
 * other within a layer's 7 small tensors, and each first-touches the memory
 * it writes. On a 2-core VM a 7B 2x8 load spent about a fifth of its CPU
 * time spinning in the barriers of 224 per-tensor parallel loops. Errors: the
 * first failing layer's (later layers are skipped once one failed), as a
 * sequential load reports. */
static kvq_status load_layers(kvq_model *m, const kvq_st *st) {
    const kvq_hparams *hp = &m->hp;
    const int n = hp->n_layer;
    loader *Ls = calloc((size_t)n, sizeof *Ls);
    if (!Ls) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d layers", n);
    for (int l = 0; l < n; l++) {
        Ls[l] = (loader){.st = st, .hp = hp};
        if (m->owned) /* two norms per layer after the final norm's */
            Ls[l].owned = m->owned + (size_t)(1 + 2 * l) * hp->n_embd, Ls[l].owned_cap = (size_t)2 * hp->n_embd;
    }
    int par = n > 1 && m->load_threads > 1;
    for (int d = 0; d < m->n_dev; d++) par = par && m->dev[d].be->parallel_upload;
    kvq_status s = KVQ_OK;
    if (!par) {
        for (int l = 0; l < n && !s; l++) s = load_layer(m, &Ls[l], l);
    } else {
        int bad = n; /* the first failed layer */
        char msg[1024] = "";
#pragma omp parallel for schedule(dynamic, 1) num_threads(m->load_threads)
        for (int l = 0; l < n; l++) {
            int first;
#pragma omp atomic read
            first = bad;
            if (l > first) continue;
            kvq_status ls = load_layer(m, &Ls[l], l);
            if (ls) {
#pragma omp critical /* unnamed: a named one exports a .gomp_critical_user_ symbol */
                if (l < bad) {
                    s = ls;
                    snprintf(msg, sizeof msg, "%s", kvq_last_error()); /* the message is per thread */
#pragma omp atomic write
                    bad = l;
                }
            }
        }
        if (s) kvq_fail(s, "%s", msg);
    }
    for (int l = 0; l < n; l++) account(m, &Ls[l]);
    free(Ls);
    return s;
}

kvq_status kvq_model_load_weights(kvq_model *m, const char *dir, const kvq_st *st) {
    const kvq_hparams *hp = &m->hp;
    /* ids the tokenizer can produce must have embedding rows (config may pad past the tokenizer) */
    if (m->tok && kvq_vocab_size(m->tok) > hp->n_vocab)
        return kvq_fail(KVQ_ERR_FORMAT, "%s/tokenizer.json: %d token ids, but config.json vocab_size is %d", dir,
                        kvq_vocab_size(m->tok), hp->n_vocab);
    loader L = {.st = st, .hp = hp};
    kvq_status s;
    if (hp->norm_plus_one) {
        m->owned_cap = (size_t)(2 * hp->n_layer + 1) * hp->n_embd;
        m->owned = malloc(sizeof(float) * m->owned_cap);
        if (!m->owned) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d layers' norms", hp->n_layer);
        L.owned = m->owned, L.owned_cap = (size_t)hp->n_embd; /* the final norm's; load_layers gives out the rest */
    }
    int tied = hp->tie_embeddings && !kvq_st_find(st, "lm_head.weight");
    int last = m->n_dev - 1;
    kvq_weight_desc ed;
    if ((s = dense_desc(&L, "model.embed_tokens.weight", hp->n_vocab, hp->n_embd, &ed))) return s;
    ed.rows_only = !tied || last > 0; /* only lookups read this copy: a few rows per token */
    m->embed_scale = hp->embed_scale ? embed_normalizer(hp, ed.fmt) : 1.0f;
    L.dev = 0;
    s = upload(m, &L, &ed, &m->embed);
    account(m, &L);
    if (s) return s;
    m->embed_bytes = m->weight_bytes;
    L = (loader){.st = st, .hp = hp, .dev = last, .owned = L.owned, .owned_cap = L.owned_cap};
    s = load_norm(m, &L, "model.norm.weight", &m->out_norm);
    if (!s && tied && last == 0) {
        m->lm_head = m->embed;
    } else if (!s && tied) { /* the embedding again, as the LM head on the offload device */
        ed.rows_only = 0;
        s = upload(m, &L, &ed, &m->lm_head);
    } else if (!s) {
        s = load_linear(m, &L, "lm_head", hp->n_vocab, hp->n_embd, &m->lm_head);
    }
    account(m, &L);
    if (s) return s;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    return load_layers(m, st);
}
