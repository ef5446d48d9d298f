/* Synthetic real-shape AQLM checkpoints for `kvq-bench model --synthetic`.
 *
 * Writes a checkpoint directory in the layout of the published AQLM exports
 * (sharded safetensors + index, config.json with quantization_config, fp16
 * embedding / lm_head / norms, int8 or int16 codes) with random codes and
 * codebooks, so that loading, resident memory and the kernels are measured
 * at the real shapes without downloading anything. The numbers it produces
 * are not a language model: only speed and memory are meaningful.
 *
 * The directory is written once (a stamp file marks it complete) and reused;
 * the tokenizer is the demo model's (ids are fed directly, never text). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_common.h"
#include "common.h"
#include "util.h"

typedef struct {
    const char *name, *arch, *model_type;
    int n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx;
    double rope_theta;
    int sliding_window;
    int head_dim;            /* 0: n_embd / n_head */
    int n_expert, n_expert_used;
    int tied;                /* no lm_head tensor */
    int cohere, gemma, phi3, qwen2; /* the family's own layout and config fields */
} synth_shape;

/* Shapes of the published checkpoints (config.json of each). */
static const synth_shape SHAPES[] = {
    {"llama2-7b", "LlamaForCausalLM", "llama", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0, 0, .tied = 0},
    {"llama2-13b", "LlamaForCausalLM", "llama", 5120, 13824, 40, 40, 40, 32000, 4096, 10000.0, 0, .tied = 0},
    {"llama3-8b", "LlamaForCausalLM", "llama", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0, 0, .tied = 0},
    {"llama3-70b", "LlamaForCausalLM", "llama", 8192, 28672, 80, 64, 8, 128256, 8192, 500000.0, 0, .tied = 0},
    {"mistral-7b", "MistralForCausalLM", "mistral", 4096, 14336, 32, 32, 8, 32000, 32768, 10000.0, 4096, .tied = 0},
    {"mixtral-8x7b", "MixtralForCausalLM", "mixtral", 4096, 14336, 32, 32, 8, 32000, 32768, 1e6, 0, .n_expert = 8, .n_expert_used = 2},
    {"command-r", "CohereForCausalLM", "cohere", 8192, 22528, 40, 64, 64, 256000, 131072, 8e6, 0, .tied = 1, .cohere = 1},
    {"gemma-2b", "GemmaForCausalLM", "gemma", 2048, 16384, 18, 8, 1, 256000, 8192, 10000.0, 0, .head_dim = 256, .tied = 1, .gemma = 1},
    {"phi3-mini", "Phi3ForCausalLM", "phi3", 3072, 8192, 32, 32, 32, 32064, 4096, 10000.0, 2047, .phi3 = 1},
    {"qwen2-7b", "Qwen2ForCausalLM", "qwen2", 3584, 18944, 28, 28, 4, 152064, 32768, 1e6, 0, .qwen2 = 1},
};
#define SHAPE_NAMES "llama2-7b, llama2-13b, llama3-8b, llama3-70b, mistral-7b, mixtral-8x7b, command-r, gemma-2b, phi3-mini, qwen2-7b"

/* Bumped whenever the written layout changes, so stale directories are rewritten. */
#define SYNTH_VERSION "kvq-synth 2"
/* Shards of about this many bytes, like the HF exports. */
#define SHARD_BYTES ((size_t)1 << 30)

typedef struct {
    char name[200];
    const char *dtype;
    int nd;
    int64_t shape[4];
    size_t bytes;
    int kind; /* 0 fp16 noise, 1 fp16 ones, 2 codes, 3 codebook, 4 scales */
    double amp;
} tensor_spec;

typedef struct {
    tensor_spec *t;
    int n, cap;
} spec_list;

static int add(spec_list *L, const char *name, const char *dtype, int nd, const int64_t *shape, int kind, double amp) {
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 256;
        tensor_spec *t = realloc(L->t, sizeof *t * (size_t)cap);
        if (!t) return -1;
        L->t = t, L->cap = cap;
    }
    tensor_spec *s = &L->t[L->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->dtype = dtype;
    s->nd = nd;
    size_t n = 1;
    for (int i = 0; i < nd; i++) s->shape[i] = shape[i], n *= (size_t)shape[i];
    s->bytes = n * (strcmp(dtype, "I8") == 0 ? 1 : 2);
    s->kind = kind;
    s->amp = amp;
    return 0;
}

static int add_linear(spec_list *L, const char prefix[static 1], int rows, int cols, int M, int nbits) {
    char nm[180];
    const int ig = 8;
    int64_t cs[3] = {rows, cols / ig, M}, bs[4] = {M, (int64_t)1 << nbits, 1, ig}, ss[4] = {rows, 1, 1, 1};
    snprintf(nm, sizeof nm, "%s.codes", prefix);
    if (add(L, nm, nbits <= 8 ? "I8" : "I16", 3, cs, 2, 0)) return -1;
    snprintf(nm, sizeof nm, "%s.codebooks", prefix);
    if (add(L, nm, "F16", 4, bs, 3, 1.0 / M)) return -1;
    snprintf(nm, sizeof nm, "%s.scales", prefix);
    /* rows of W then have about unit norm: activations stay finite through 32 layers */
    return add(L, nm, "F16", 4, ss, 4, 1.7 / __builtin_sqrt((double)cols));
}

static int build_specs(const synth_shape *s, int M, int nbits, spec_list *L) {
    const int hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    int64_t emb[2] = {s->n_vocab, s->n_embd}, vec[1] = {s->n_embd};
    const int q = s->n_head * hd, kv = s->n_head_kv * hd, d = s->n_embd, ff = s->n_ff;
    if (add(L, "model.embed_tokens.weight", "F16", 2, emb, 0, 1.0)) return -1;
    char p[32], nm[180];
    for (int l = 0; l < s->n_layer; l++) {
        snprintf(p, sizeof p, "model.layers.%d", l);
        snprintf(nm, sizeof nm, "%s.input_layernorm.weight", p);
        if (add(L, nm, "F16", 1, vec, 1, 1.0)) return -1;
        snprintf(nm, sizeof nm, "%s.post_attention_layernorm.weight", p);
        if (!s->cohere && add(L, nm, "F16", 1, vec, s->gemma ? 0 : 1, 0.1)) return -1;
        /* attention */
        if (s->phi3) {
            snprintf(nm, sizeof nm, "%s.self_attn.qkv_proj", p);
            if (add_linear(L, nm, q + 2 * kv, d, M, nbits)) return -1;
        } else {
            const char *qkv[3] = {"q_proj", "k_proj", "v_proj"};
            const int rows[3] = {q, kv, kv};
            for (int k = 0; k < 3; k++) {
                snprintf(nm, sizeof nm, "%s.self_attn.%s", p, qkv[k]);
                if (add_linear(L, nm, rows[k], d, M, nbits)) return -1;
                int64_t bs[1] = {rows[k]};
                snprintf(nm, sizeof nm, "%s.self_attn.%s.bias", p, qkv[k]);
                if (s->qwen2 && add(L, nm, "F16", 1, bs, 0, 0.1)) return -1;
            }
        }
        snprintf(nm, sizeof nm, "%s.self_attn.o_proj", p);
        if (add_linear(L, nm, d, q, M, nbits)) return -1;
        /* FFN */
        if (s->n_expert) {
            int64_t rs[2] = {s->n_expert, d};
            snprintf(nm, sizeof nm, "%s.block_sparse_moe.gate.weight", p);
            if (add(L, nm, "F16", 2, rs, 0, 1.0 / __builtin_sqrt((double)d))) return -1;
            for (int e = 0; e < s->n_expert; e++) {
                const char *w[3] = {"w1", "w3", "w2"};
                const int rows[3] = {ff, ff, d}, cols[3] = {d, d, ff};
                for (int k = 0; k < 3; k++) {
                    snprintf(nm, sizeof nm, "%s.block_sparse_moe.experts.%d.%s", p, e, w[k]);
                    if (add_linear(L, nm, rows[k], cols[k], M, nbits)) return -1;
                }
            }
        } else if (s->phi3) {
            snprintf(nm, sizeof nm, "%s.mlp.gate_up_proj", p);
            if (add_linear(L, nm, 2 * ff, d, M, nbits)) return -1;
            snprintf(nm, sizeof nm, "%s.mlp.down_proj", p);
            if (add_linear(L, nm, d, ff, M, nbits)) return -1;
        } else {
            const char *mlp[3] = {"gate_proj", "up_proj", "down_proj"};
            const int rows[3] = {ff, ff, d}, cols[3] = {d, d, ff};
            for (int k = 0; k < 3; k++) {
                snprintf(nm, sizeof nm, "%s.mlp.%s", p, mlp[k]);
                if (add_linear(L, nm, rows[k], cols[k], M, nbits)) return -1;
            }
        }
    }
    if (add(L, "model.norm.weight", "F16", 1, vec, s->gemma ? 0 : 1, 0.1)) return -1;
    return s->tied ? 0 : add(L, "lm_head.weight", "F16", 2, emb, 0, 1.0 / __builtin_sqrt((double)s->n_embd));
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t rnd64(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Fills buf with the next n bytes of tensor t (random content of its kind). */
static void fill(const tensor_spec *t, uint8_t *buf, size_t n) {
    if (t->kind == 2) { /* codes: uniform over the whole int8/int16 range */
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t r = rnd64();
            memcpy(buf + i, &r, 8);
        }
        for (; i < n; i++) buf[i] = (uint8_t)rnd64();
        return;
    }
    uint16_t *h = (uint16_t *)buf; /* n is even for fp16 tensors */
    for (size_t i = 0; i < n / 2; i++) {
        float u = (float)(rnd64() >> 40) * (2.0f / 16777216.0f) - 1.0f;
        float v = t->kind == 1 ? 1.0f : t->kind == 4 ? (float)t->amp * (0.75f + 0.25f * u) : (float)t->amp * u;
        h[i] = kvq_f32_to_f16(v);
    }
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

/* One shard: tensors [a, b) of L; sparse: the header, then a hole of the data's size (a plan
 * reads only the headers). */
static int write_shard(const char *path, const spec_list *L, int a, int b, uint8_t *chunk, size_t chunk_bytes, int sparse) {
    size_t cap = 256 + (size_t)(b - a) * 256, len = 0, off = 0;
    char *hdr = malloc(cap);
    if (!hdr) return -1;
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = a; i < b; i++) {
        const tensor_spec *t = &L->t[i];
        len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int d = 0; d < t->nd; d++) len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + t->bytes);
        off += t->bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    /* Pad the header with spaces so the data starts 64-byte aligned in the file
     * (and so in the mapping), as the kernels would like the tensors to be. */
    while ((8 + len) % 64) hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return -1;
    }
    uint64_t hl = len;
    int bad = write_all(f, &hl, 8) || write_all(f, hdr, len);
    free(hdr);
    if (sparse && !bad) {
        bad = fflush(f) != 0 || ftruncate(fileno(f), (off_t)(8 + len + off)) != 0;
        return fclose(f) != 0 || bad ? -1 : 0;
    }
    for (int i = a; i < b && !bad; i++) {
        const tensor_spec *t = &L->t[i];
        for (size_t done = 0; done < t->bytes && !bad; done += chunk_bytes) {
            size_t n = t->bytes - done < chunk_bytes ? t->bytes - done : chunk_bytes;
            fill(t, chunk, n);
            bad = write_all(f, chunk, n);
        }
    }
    if (fclose(f) != 0) bad = 1;
    return bad ? -1 : 0;
}

static int copy_file(const char *src, const char *dst) {
    char *text;
    size_t n;
    if (kvq_read_file(src, &text, &n) != KVQ_OK) return -1;
    FILE *f = fopen(dst, "wb");
    int bad = !f || write_all(f, text, n);
    if (f && fclose(f) != 0) bad = 1;
    free(text);
    return bad ? -1 : 0;
}

static int write_config(const char *path, const synth_shape *s, int M, int nbits) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "{\"architectures\":[\"%s\"],\"model_type\":\"%s\",\"hidden_size\":%d,\"intermediate_size\":%d,"
            "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"vocab_size\":%d,"
            "\"max_position_embeddings\":%d,\"rms_norm_eps\":1e-05,\"rope_theta\":%.1f,\"hidden_act\":\"silu\","
            "\"tie_word_embeddings\":%s,\"torch_dtype\":\"float16\",\"bos_token_id\":1,\"eos_token_id\":2,",
            s->arch, s->model_type, s->n_embd, s->n_ff, s->n_layer, s->n_head, s->n_head_kv, s->n_vocab, s->n_ctx,
            s->rope_theta, s->tied ? "true" : "false");
    if (s->sliding_window) fprintf(f, "\"sliding_window\":%d,", s->sliding_window);
    if (s->head_dim) fprintf(f, "\"head_dim\":%d,", s->head_dim);
    if (s->n_expert) fprintf(f, "\"num_local_experts\":%d,\"num_experts_per_tok\":%d,", s->n_expert, s->n_expert_used);
    if (s->cohere) fprintf(f, "\"layer_norm_eps\":1e-05,\"logit_scale\":0.0625,\"use_qk_norm\":false,");
    if (s->gemma) fprintf(f, "\"hidden_activation\":\"gelu_pytorch_tanh\",");
    if (s->qwen2) fprintf(f, "\"use_sliding_window\":false,");
    fprintf(f, "\"quantization_config\":{\"quant_method\":\"aqlm\",\"in_group_size\":8,\"out_group_size\":1,"
               "\"num_codebooks\":%d,\"nbits_per_codebook\":%d,\"linear_weights_not_to_quantize\":[\"model.embed_tokens.weight\"",
            M, nbits);
    if (!s->tied) fprintf(f, ",\"lm_head.weight\"");
    for (int l = 0; s->n_expert && l < s->n_layer; l++) fprintf(f, ",\"model.layers.%d.block_sparse_moe.gate.weight\"", l);
    fprintf(f, "]}}\n");
    return fclose(f) == 0 ? 0 : -1;
}

static int mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static const char *P = "kvq-bench model";

static int synth_dir(const char *name, const char *scheme, const char *root, char *dir, size_t dir_size,
                     double *file_bytes, int sparse) {
    const synth_shape *s = NULL;
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (!strcmp(name, SHAPES[i].name)) s = &SHAPES[i];
    if (!s) return kvq_tool_die(P, "unknown --synthetic model '%s' (" SHAPE_NAMES ")", name);
    int M, nbits;
    if (!strcmp(scheme, "2x8")) M = 2, nbits = 8;
    else if (!strcmp(scheme, "1x16")) M = 1, nbits = 16;
    else return kvq_tool_die(P, "unknown --scheme '%s' (2x8, 1x16)", scheme);
    const char *demo = kvq_tool_demo_model();
    if (!demo) return kvq_tool_die(P, "the demo model (for its tokenizer) was not found");
    if (!root) {
        const char *tmp = getenv("TMPDIR");
        static char def[1024];
        snprintf(def, sizeof def, "%s/kvq-synth", tmp && *tmp ? tmp : "/tmp");
        root = def;
    }
    if ((size_t)snprintf(dir, dir_size, "%s/%s-%s%s", root, name, scheme, sparse ? "-headers" : "") >= dir_size)
        return kvq_tool_die(P, "%s: path too long", root);

    spec_list L = {0};
    if (build_specs(s, M, nbits, &L)) return kvq_tool_die(P, "out of memory");
    *file_bytes = 0;
    for (int i = 0; i < L.n; i++) *file_bytes += (double)L.t[i].bytes;

    char path[4200], stamp[4200];
    snprintf(stamp, sizeof stamp, "%s/.kvq-synth-complete", dir);
    char *text = NULL;
    size_t tl;
    if (kvq_read_file(stamp, &text, &tl) == KVQ_OK && strncmp(text, SYNTH_VERSION, strlen(SYNTH_VERSION)) == 0) {
        free(text);
        free(L.t);
        return 0;
    }
    free(text);
    if (mkdir_p(dir)) {
        free(L.t);
        return kvq_tool_die(P, "%s: cannot create directory: %s", dir, strerror(errno));
    }
    fprintf(stderr, "%s: writing synthetic %s %s checkpoint (%.2f GB%s) to %s\n", P, name, scheme, *file_bytes / 1e9,
            sparse ? ", headers only" : "", dir);
    const size_t chunk_bytes = (size_t)4 << 20;
    uint8_t *chunk = malloc(chunk_bytes);
    int n_shards = 0, first[64], ok = chunk != NULL;
    for (int i = 0; i < L.n && n_shards < 63;) { /* shards of >= SHARD_BYTES, tensors never split */
        first[n_shards++] = i;
        size_t sz = 0;
        while (i < L.n && (sz == 0 || sz + L.t[i].bytes <= SHARD_BYTES)) sz += L.t[i++].bytes;
    }
    first[n_shards] = L.n;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *idx = ok ? fopen(path, "w") : NULL;
    ok = idx != NULL;
    if (ok) fprintf(idx, "{\"metadata\":{\"total_size\":%.0f},\"weight_map\":{", *file_bytes);
    for (int sh = 0; sh < n_shards && ok; sh++) {
        char fn[64];
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        ok = write_shard(path, &L, first[sh], first[sh + 1], chunk, chunk_bytes, sparse) == 0;
        for (int i = first[sh]; i < first[sh + 1] && ok; i++) fprintf(idx, "%s\"%s\":\"%s\"", i ? "," : "", L.t[i].name, fn);
    }
    if (idx) {
        fprintf(idx, "}}\n");
        if (fclose(idx) != 0) ok = 0;
    }
    free(chunk);
    char src[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ok = ok && write_config(path, s, M, nbits) == 0;
    const char *tok_files[2] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2 && ok; i++) {
        snprintf(src, sizeof src, "%s/%s", demo, tok_files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, tok_files[i]);
        ok = copy_file(src, path) == 0;
    }
    free(L.t);
    if (ok) {
        FILE *f = fopen(stamp, "w");
        ok = f && fprintf(f, "%s\n", SYNTH_VERSION) > 0;
        if (f && fclose(f) != 0) ok = 0;
    }
    if (!ok) return kvq_tool_die(P, "%s: cannot write the synthetic checkpoint: %s", dir, strerror(errno));
    return 0;
}

int kvq_bench_synth_dir(const char *name, const char *scheme, const char *root, char *dir, size_t dir_size,
                        double *file_bytes) {
    return synth_dir(name, scheme, root, dir, dir_size, file_bytes, 0);
}

int kvq_bench_synth_plan_dir(const char *name, const char *scheme, const char *root, char *dir, size_t dir_size,
                             double *file_bytes) {
    return synth_dir(name, scheme, root, dir, dir_size, file_bytes, 1);
}
