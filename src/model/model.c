/* kvq_model_*: config + tokenizer + checkpoint -> weights on a backend. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "resources.h"
#include "util.h"

kvq_model_params kvq_model_default_params(void) {
    kvq_model_params p = {.backend = NULL, .n_threads = 0, .device = NULL, .n_gpu_layers = -1, .aqlm_i8 = 1,
                          .plan_type_k = KVQ_CACHE_F16, .plan_type_v = KVQ_CACHE_F16};
    return p;
}

/* Picks the backend: a named one must start; "auto" (or NULL) takes the first in
 * registry order that starts, a GPU backend only on a real device unless one is named.
 * Why a better backend was passed over is kept for the tools to print. */
static kvq_status pick_backend(kvq_model *m, const kvq_model_params *p) {
    const char *want = p->backend && *p->backend && strcmp(p->backend, "auto") ? p->backend : NULL;
    int named_dev = p->device && *p->device;
    kvq_backend_opts o = {.n_threads = p->n_threads, .device = p->device, .allow_software = want != NULL || named_dev,
                          .aqlm_cb8 = p->aqlm_cb8, .aqlm_lut8 = p->aqlm_lut8, .aqlm_i8 = p->aqlm_i8, .exact = p->exact};
    if (want) {
        m->be = kvq_backend_find(want);
        if (!m->be) return kvq_fail(KVQ_ERR_UNSUPPORTED, "backend '%s' is not built into this kvq (built: %s)", want, kvq_backend_names());
        return m->be->init(&o, &m->bctx);
    }
    kvq_status s = KVQ_ERR_UNSUPPORTED;
    m->backend_note[0] = 0;
    for (int i = 0; i < kvq_backend_count() && s != KVQ_OK; i++) {
        m->be = kvq_backend_get(i);
        s = m->be->init(&o, &m->bctx);
        if (s && i + 1 < kvq_backend_count())
            snprintf(m->backend_note, sizeof m->backend_note, "%s", kvq_last_error());
    }
    if (s == KVQ_OK) kvq_clear_error();
    return s;
}

/* Offload (-ngl): with a GPU backend and 0 < n < n_layer, the first layers run on a CPU
 * instance (dev[0]) and the last n, with the LM head, on the GPU (dev[1]); n = 0 swaps the GPU
 * for the CPU alone. */
/* Layer index of a checkpoint tensor "model.layers.<l>.", -1 for the others. */
static int tensor_layer(const char *name) {
    const char *pre = "model.layers.";
    if (strncmp(name, pre, strlen(pre))) return -1;
    char *end;
    long l = strtol(name + strlen(pre), &end, 10);
    return *end == '.' && l >= 0 && l < (1 << 20) ? (int)l : -1;
}

static int plan_ctx_of(const kvq_hparams *hp, const kvq_model_params *p) {
    return p->plan_ctx > 0 ? p->plan_ctx : hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
}

static kvq_cache_type plan_type(int t) { return t >= KVQ_CACHE_F32 && t <= KVQ_CACHE_Q4 ? (kvq_cache_type)t : KVQ_CACHE_F16; }

/* Bytes of the KV cache of plan_ctx positions for n_layers layers on device d. */
static size_t plan_kv(const kvq_model *m, const kvq_model_params *p, int d, int n_layers) {
    if (n_layers <= 0) return 0;
    const kvq_hparams *hp = &m->hp;
    int ctx = plan_ctx_of(hp, p);
    kvq_kv_desc kd = {.n_layer = n_layers, .n_ctx = ctx, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                      .type_k = plan_type(p->plan_type_k), .type_v = plan_type(p->plan_type_v)};
    return m->dev[d].be->kv_bytes(m->dev[d].b, &kd, ctx);
}

/* -ngl auto: the most last layers that fit the device's free memory together with the LM head,
 * the final norm, their share of the KV cache of plan_ctx positions (plan_type_k/v), the activations and a
 * headroom of 1/16 of the budget (drivers, the pipelines, fragmentation). Sizes are the
 * checkpoint's, which the GPU layouts match within a few percent. */
static int auto_gpu_layers(kvq_model *m, const kvq_model_params *p, int *embed_fits) {
    const kvq_hparams *hp = &m->hp;
    *embed_fits = 1;
    if (!m->be->mem_budget) return hp->n_layer;
    size_t budget = m->be->mem_budget(m->bctx), head = 0, embed = 0, *layer = calloc((size_t)hp->n_layer, sizeof *layer);
    if (!layer) return 0;
    int tied = !kvq_st_find(&m->st, "lm_head.weight");
    for (int i = 0; i < m->st.n_tensors; i++) {
        const kvq_st_tensor *t = &m->st.tensors[i];
        int l = tensor_layer(t->name);
        if (l >= 0 && l < hp->n_layer) layer[l] += t->nbytes;
        else if (!strncmp(t->name, "lm_head.", 8) || !strcmp(t->name, "model.norm.weight") ||
                 (tied && !strcmp(t->name, "model.embed_tokens.weight")))
            head += t->nbytes;
        else if (!strcmp(t->name, "model.embed_tokens.weight"))
            embed = t->nbytes; /* untied: on the GPU only when every layer is */
    }
    size_t kv = plan_kv(m, p, m->n_dev - 1, 1); /* one layer's K and V */
    kvq_act_widths w;
    kvq_act_widths_of(hp, &w);
    size_t act = 512 * sizeof(float) * (w.x + w.xb + w.xo + w.q + w.att + w.k + w.v + w.hb + w.hb2 + w.fused + w.moe_out) +
                 sizeof(float) * (size_t)hp->n_vocab;
    size_t need = head + act + budget / 16;
    size_t all = 0;
    for (int l = 0; l < hp->n_layer; l++) all += layer[l];
    m->layer_bytes = hp->n_layer ? all / (size_t)hp->n_layer : 0;
    int n = 0;
    for (int l = hp->n_layer - 1; l >= 0 && need + layer[l] + kv <= budget; l--) need += layer[l] + kv, n++;
    free(layer);
    *embed_fits = need + embed <= budget;
    return n;
}

/* A GPU that shares the host's memory (integrated) has no memory of its own to win: it is worth
 * layers only when it streams that memory faster than the cores do. Both measured now; 1 when the
 * CPU alone should run the model (the plan note says why either way). */
static int shared_memory_gate(kvq_model *m, const kvq_model_params *p) {
    if (!m->be->shares_host_memory || !m->be->shares_host_memory(m->bctx) || !m->be->bandwidth_gbs) return 0;
    const kvq_backend *cpu = kvq_backend_find("cpu");
    kvq_bctx *cb = NULL;
    kvq_backend_opts o = {.n_threads = p->n_threads};
    if (!cpu || !cpu->bandwidth_gbs || cpu->init(&o, &cb)) return 0;
    double g = m->be->bandwidth_gbs(m->bctx), c = cpu->bandwidth_gbs(cb);
    cpu->release(cb);
    kvq_clear_error();
    int cpu_wins = g <= 0 || (c > 0 && g < c);
    snprintf(m->plan_note, sizeof m->plan_note, " (auto: shared-memory GPU streams %.1f GB/s, the CPU %.1f GB/s: %s)", g,
             c, cpu_wins ? "the CPU alone" : "the GPU");
    return cpu_wins;
}

static kvq_status plan_devices(kvq_model *m, const kvq_model_params *p) {
    int n = p->n_gpu_layers, L = m->hp.n_layer;
    m->n_dev = 1;
    m->dev[0] = (kvq_dev){m->be, m->bctx};
    int embed_fits = 1;
    if (n == KVQ_GPU_LAYERS_AUTO && strcmp(m->be->name, "cpu")) {
        n = auto_gpu_layers(m, p, &embed_fits);
        if (m->be->mem_budget)
            snprintf(m->plan_note, sizeof m->plan_note, " (auto: %.1f MiB free on the device)",
                     (double)m->be->mem_budget(m->bctx) / (1 << 20));
        if (n > 0 && shared_memory_gate(m, p)) n = 0;
    }
    /* every layer on the GPU, and the embedding table too unless it alone does not fit there */
    if (!strcmp(m->be->name, "cpu") || n < 0 || (n >= L && embed_fits)) return KVQ_OK;
    if (n > L) n = L;
    const kvq_backend *cpu = kvq_backend_find("cpu");
    kvq_bctx *cb = NULL;
    kvq_backend_opts o = {.n_threads = p->n_threads, .aqlm_cb8 = p->aqlm_cb8, .aqlm_lut8 = p->aqlm_lut8, .aqlm_i8 = p->aqlm_i8, .exact = p->exact};
    kvq_status s = cpu->init(&o, &cb);
    if (s) return s;
    if (n == 0) { /* the CPU alone */
        m->be->release(m->bctx);
        m->be = cpu, m->bctx = cb;
        m->dev[0] = (kvq_dev){cpu, cb};
        return KVQ_OK;
    }
    m->n_dev = 2;
    m->gpu_from = L - n;
    m->dev[0] = (kvq_dev){cpu, cb};
    m->dev[1] = (kvq_dev){m->be, m->bctx};
    return kvq_graph_check_backend(&m->hp, cpu);
}

/* The plan line from the weight bytes per device (dev_bytes[d] for m->dev[d]). */
static void format_plan(kvq_model *m, const kvq_model_params *p, const size_t *wbytes, int allocs, size_t fallback) {
    int L = m->hp.n_layer, cpu_alone = !strcmp(m->be->name, "cpu");
    size_t gpu_w = 0, cpu_w = 0, kv_gpu = 0, kv_cpu = 0;
    if (m->n_dev > 1) {
        gpu_w = wbytes[1], cpu_w = wbytes[0];
        kv_gpu = plan_kv(m, p, 1, L - m->gpu_from), kv_cpu = plan_kv(m, p, 0, m->gpu_from);
    } else if (cpu_alone) {
        cpu_w = wbytes[0], kv_cpu = plan_kv(m, p, 0, L);
    } else {
        gpu_w = wbytes[0], kv_gpu = plan_kv(m, p, 0, L);
    }
    const double mib = 1 << 20;
    int n = snprintf(m->plan, sizeof m->plan, "plan: gpu_layers=%d/%d gpu_mib=%.1f cpu_mib=%.1f kv_gpu_mib=%.1f kv_cpu_mib=%.1f allocs=%d",
                     kvq_model_gpu_layers(m), L, (double)gpu_w / mib, (double)cpu_w / mib, (double)kv_gpu / mib,
                     (double)kv_cpu / mib, allocs);
    if (fallback && n > 0 && (size_t)n < sizeof m->plan)
        n += snprintf(m->plan + n, sizeof m->plan - (size_t)n, " host_fallback_mib=%.1f", (double)fallback / mib);
    if (n > 0 && (size_t)n < sizeof m->plan) snprintf(m->plan + n, sizeof m->plan - (size_t)n, "%s", m->plan_note);
}

void kvq_model_backend_stats(const kvq_model *m, kvq_backend_stats *out) {
    memset(out, 0, sizeof *out);
    for (int d = 0; d < m->n_dev; d++) {
        kvq_backend_stats s = {0};
        if (!m->dev[d].be->stats) continue;
        m->dev[d].be->stats(m->dev[d].b, &s);
        out->dispatches += s.dispatches, out->barriers += s.barriers, out->submits += s.submits;
        out->allocs += s.allocs, out->host_fallback_bytes += s.host_fallback_bytes;
        out->pipelines += s.pipelines, out->dsets += s.dsets, out->waits += s.waits;
    }
}

void kvq_model_profile(const kvq_model *m, char *out, size_t size) {
    if (out && size) out[0] = 0;
    for (int d = 0; d < m->n_dev; d++)
        if (m->dev[d].be->profile) {
            size_t len = out ? strlen(out) : 0;
            m->dev[d].be->profile(m->dev[d].b, out ? out + len : NULL, out ? size - len : 0);
        }
}

kvq_status kvq_model_plan_only(const char *dir, const kvq_model_params *params, char *line, size_t size) {
    kvq_model_params dp = kvq_model_default_params();
    const kvq_model_params *p = params ? params : &dp;
    kvq_model *m = calloc(1, sizeof *m);
    if (!m) return kvq_fail(KVQ_ERR_NOMEM, "out of memory");
    kvq_status s;
    size_t *gpu_sizes = NULL;
    if ((s = kvq_hparams_load(dir, &m->hp)) || (s = kvq_st_open_dir(&m->st, dir)) || (s = pick_backend(m, p)) ||
        (s = plan_devices(m, p)))
        goto out;
    /* where kvq_model_load would put each tensor: layers by the split, the LM head and final
     * norm on the last device, an untied embedding table on the first */
    int gpu = m->n_dev > 1 ? 1 : strcmp(m->be->name, "cpu") ? 0 : -1, n_gpu = 0;
    int tied = !kvq_st_find(&m->st, "lm_head.weight");
    size_t wb[2] = {0, 0};
    if (!(gpu_sizes = malloc(sizeof *gpu_sizes * ((size_t)m->st.n_tensors + 2)))) {
        s = kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < m->st.n_tensors; i++) {
        const kvq_st_tensor *t = &m->st.tensors[i];
        int l = tensor_layer(t->name), d;
        if (l >= 0) d = m->n_dev > 1 && l >= m->gpu_from ? 1 : 0;
        else if (!strcmp(t->name, "model.embed_tokens.weight") && !tied) d = 0;
        else d = m->n_dev - 1;
        wb[d] += t->nbytes;
        if (d == gpu) gpu_sizes[n_gpu++] = t->nbytes;
    }
    int allocs = 0;
    if (gpu >= 0) {
        int L = m->hp.n_layer;
        size_t kv = plan_kv(m, p, gpu, m->n_dev > 1 ? L - m->gpu_from : L);
        gpu_sizes[n_gpu++] = kv / 2, gpu_sizes[n_gpu++] = kv - kv / 2; /* K and V */
        if (m->be->plan_allocs) allocs = m->be->plan_allocs(m->bctx, gpu_sizes, n_gpu);
    }
    format_plan(m, p, wb, allocs, 0);
    snprintf(line, size, "%s", m->plan);
out:
    free(gpu_sizes);
    kvq_model_free(m);
    return s;
}

/* What tells one checkpoint from another for a saved session (session.c): config.json, and
 * each file's size with 64 evenly spread 64-byte samples, so two fine-tunes of one
 * architecture (same names, shapes and offsets) differ without reading gigabytes. */
static kvq_status identity(kvq_model *m, const char *dir) {
    char path[4096], *cfg;
    size_t len;
    kvq_status s = kvq_read_file(kvq_path_join(path, sizeof path, dir, "config.json"), &cfg, &len);
    if (s) return s;
    uint64_t h = kvq_fnv1a(KVQ_FNV_SEED, cfg, len);
    free(cfg);
    for (int f = 0; f < m->st.n_files; f++) {
        const kvq_mmap *mp = &m->st.maps[f];
        uint64_t size = mp->size;
        h = kvq_fnv1a(h, &size, sizeof size);
        for (size_t i = 0; i < 64 && mp->size >= 64; i++) h = kvq_fnv1a(h, mp->data + (mp->size - 64) / 63 * i, 64);
    }
    m->identity = h;
    return KVQ_OK;
}

static kvq_status load_once(const char *dir, const kvq_model_params *p, kvq_model **out) {
    *out = NULL;
    kvq_model *m = calloc(1, sizeof *m);
    if (!m) return kvq_fail(KVQ_ERR_NOMEM, "out of memory");
    kvq_status s;
    m->load_threads = p->n_threads > 0 ? p->n_threads : omp_get_num_procs(); /* as the CPU backend's */
    if ((s = kvq_hparams_load(dir, &m->hp)) || (s = kvq_tokenizer_load(dir, &m->tok)) ||
        (s = kvq_st_open_dir(&m->st, dir)) || (s = identity(m, dir)) || (s = pick_backend(m, p)) || (s = plan_devices(m, p)) || (s = kvq_graph_check_backend(&m->hp, m->be)) || (s = kvq_model_load_weights(m, dir, &m->st)))
        goto fail;
    int half = m->hp.head_dim / 2;
    m->rope_freqs = malloc(sizeof(float) * (size_t)half);
    if (!m->rope_freqs) {
        s = kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kvq_hparams_rope_freqs(&m->hp, m->rope_freqs, 0);
    if (m->hp.rope_scaling == KVQ_ROPE_LONGROPE) {
        m->rope_freqs_long = malloc(sizeof(float) * (size_t)half);
        if (!m->rope_freqs_long) {
            s = kvq_fail(KVQ_ERR_NOMEM, "out of memory");
            goto fail;
        }
        kvq_hparams_rope_freqs(&m->hp, m->rope_freqs_long, 1);
    }
    if (!m->dev[0].be->weights_in_place && !m->dev[m->n_dev - 1].be->weights_in_place)
        kvq_st_close(&m->st); /* the backends hold their own copies */
    kvq_backend_stats st;
    kvq_model_backend_stats(m, &st);
    format_plan(m, p, m->dev_bytes, st.allocs, st.host_fallback_bytes);
    const kvq_hparams *hp = &m->hp;
    snprintf(m->desc, sizeof m->desc, "%s, %d layers, hidden %d, heads %d/%d x %d, vocab %d, %s, %.1f MiB of weights",
             hp->arch, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_vocab,
             hp->aqlm ? (hp->aqlm_codebooks == 1 && hp->aqlm_nbits == 16 ? "AQLM 1x16" : hp->aqlm_codebooks == 2 && hp->aqlm_nbits == 8 ? "AQLM 2x8" : "AQLM")
                      : "dense",
             (double)m->weight_bytes / (1 << 20));
    if (hp->n_expert) {
        size_t len = strlen(m->desc);
        snprintf(m->desc + len, sizeof m->desc - len, ", %d experts (%d per token: %.1f MiB per step)", hp->n_expert,
                 hp->n_expert_used, (double)kvq_model_step_bytes(m) / (1 << 20));
    }
    *out = m;
    return KVQ_OK;
fail:
    kvq_model_free(m);
    return s;
}

/* -ngl auto plans from checkpoint sizes; when the weights it put on the GPU did not all fit there
 * (a driver's reserve, layouts larger than the checkpoint's), some landed in host memory, where the
 * GPU reads them over the bus: slower than the CPU running those layers. Then load again with
 * fewer GPU layers (the spill over a layer's average size, and one more) until nothing spills. */
kvq_status kvq_model_load(const char *dir, const kvq_model_params *params, kvq_model **out) {
    kvq_model_params dp = kvq_model_default_params(), q = params ? *params : dp;
    kvq_status s = load_once(dir, &q, out);
    if (s || q.n_gpu_layers != KVQ_GPU_LAYERS_AUTO) return s;
    char note[sizeof(*out)->plan_note] = "";
    for (int tries = 0; tries < 16; tries++) {
        kvq_model *m = *out;
        kvq_backend_stats st;
        kvq_model_backend_stats(m, &st);
        int n = kvq_model_gpu_layers(m);
        if (!st.host_fallback_bytes || n <= 0) break;
        size_t per_layer = m->layer_bytes ? m->layer_bytes : m->dev_bytes[m->n_dev - 1] / (size_t)n + 1;
        int drop = (int)(st.host_fallback_bytes / per_layer) + 1;
        snprintf(note, sizeof note, " (auto: %d GPU layers spilled %.1f MiB of weights to host memory; %d now)", n,
                 (double)st.host_fallback_bytes / (1 << 20), n > drop ? n - drop : 0);
        kvq_model_free(m);
        q.n_gpu_layers = n > drop ? n - drop : 0;
        if ((s = load_once(dir, &q, out))) return s;
    }
    if (*note) { /* the plan line says why it has fewer layers than the free memory suggested */
        kvq_model *m = *out;
        snprintf(m->plan_note, sizeof m->plan_note, "%s", note);
        kvq_backend_stats st;
        kvq_model_backend_stats(m, &st);
        q.n_gpu_layers = KVQ_GPU_LAYERS_AUTO;
        format_plan(m, &q, m->dev_bytes, st.allocs, st.host_fallback_bytes);
    }
    return KVQ_OK;
}

void kvq_model_free(kvq_model *m) {
    if (!m) return;
    if (m->bctx) {
        for (int l = 0; m->layers && l < m->hp.n_layer; l++) {
            kvq_layer *ly = &m->layers[l];
            const kvq_dev *D = &m->dev[ly->dev];
            kvq_wt *ws[] = {ly->attn_norm, ly->ffn_norm, ly->q_norm, ly->k_norm, ly->router};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) D->be->weight_free(D->b, ws[i]);
            for (int k = 0; k < KVQ_LIN_COUNT; k++) D->be->weight_free(D->b, ly->lin[k]);
            for (int k = 0; k < KVQ_MOE_COUNT; k++)
                for (int e = 0; ly->moe[k] && e < m->hp.n_expert; e++) D->be->weight_free(D->b, ly->moe[k][e]);
        }
        const kvq_dev *first = &m->dev[0], *last = &m->dev[m->n_dev ? m->n_dev - 1 : 0];
        if (m->n_dev) {
            if (m->lm_head != m->embed) last->be->weight_free(last->b, m->lm_head);
            first->be->weight_free(first->b, m->embed);
            last->be->weight_free(last->b, m->out_norm);
        }
        if (m->n_dev > 1) m->dev[0].be->release(m->dev[0].b);
        m->be->release(m->bctx);
    }
    kvq_st_close(&m->st); /* after the backend: its weights may point into the mapping */
    for (int l = 0; m->layers && l < m->hp.n_layer; l++)
        for (int k = 0; k < KVQ_MOE_COUNT; k++) free(m->layers[l].moe[k]);
    free(m->layers);
    free(m->rope_freqs);
    free(m->rope_freqs_long);
    free(m->owned);
    kvq_tokenizer_free(m->tok);
    kvq_hparams_free(&m->hp);
    free(m);
}

const kvq_tokenizer *kvq_model_tokenizer(const kvq_model *m) { return m->tok; }
int kvq_model_n_vocab(const kvq_model *m) { return m->hp.n_vocab; }
int kvq_model_n_ctx_train(const kvq_model *m) { return m->hp.n_ctx_train; }
const char *kvq_model_backend_name(const kvq_model *m) { return m->be->describe(m->bctx); }
const char *kvq_model_backend_note(const kvq_model *m) { return m->backend_note; }
const char *kvq_model_desc(const kvq_model *m) { return m->desc; }
const char *kvq_model_plan(const kvq_model *m) { return m->plan; }
int kvq_model_gpu_layers(const kvq_model *m) {
    if (m->n_dev > 1) return m->hp.n_layer - m->gpu_from;
    return strcmp(m->be->name, "cpu") ? m->hp.n_layer : 0;
}
int kvq_model_exact_rows(const kvq_model *m) {
    int r = m->dev[0].be->exact_rows;
    for (int i = 1; i < m->n_dev; i++)
        if (m->dev[i].be->exact_rows < r) r = m->dev[i].be->exact_rows;
    return r > 1 ? r : 1; /* a backend that promises none still runs a decode (one row) as itself */
}
size_t kvq_model_step_bytes(const kvq_model *m) {
    size_t all = kvq_model_weight_bytes(m);
    if (!m->hp.n_expert) return all;
    return all - m->expert_bytes + m->expert_bytes / (size_t)m->hp.n_expert * (size_t)m->hp.n_expert_used;
}

size_t kvq_model_weight_bytes(const kvq_model *m) {
    return m->lm_head == m->embed ? m->weight_bytes : m->weight_bytes - m->embed_bytes;
}
