/* kvq-bench longctx-model: a random model whose attention means something at long range,
 * and a token stream for it, to measure what quantized KV caches cost at 1k..32k positions
 * (kvq-ppl --ids DIR/stream.ids --kl-base f16 --kl-at ...). The fixtures were trained on
 * 1k contexts, so they say nothing past that.
 *
 * Head shape of Llama-3-8B (head dim 128, 4 query heads per KV head, RoPE theta 500000);
 * 8 query / 2 KV heads and hidden 1024 instead of 32 / 8 and 4096, and 2 layers, so that
 * a 32k stream runs in minutes on 2 cores. Random weights (not a language model), built so
 * that attention is peaked and depends on position the way RoPE makes it in real models:
 * - Q and K of a group share one projection (q = s·(B + noise)·x, k = B·x), so a query
 *   scores high on earlier occurrences of its own token; B puts most of its energy in the
 *   low-frequency rotary pairs, which stay coherent over long distances (as trained models
 *   do for semantic matches), and heads differ in sharpness s.
 * - Every embedding shares one direction, whose q·k is the same for all tokens and turns
 *   with distance: a recency bias made by RoPE itself.
 * - Outliers as in the brown-llama fixtures: per KV head two rotary pairs of K ×12 (the
 *   query rows ÷12, scores unchanged), one V channel ×4 (its o_proj columns ÷4), so plain
 *   4-bit K loses and a rotation wins it back.
 * The stream mixes fresh tokens with copies of spans from anywhere earlier, so matches
 * (and what attention retrieves) occur at every distance. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_common.h"
#include "common.h"
#include "util.h"

static const char *P = "kvq-bench longctx-model";

enum { D = 1024, NH = 8, NKV = 2, HD = 128, FF = 1024, VOCAB = 32000, STREAM_VOCAB = 4000 };
#define THETA 500000.0

typedef struct {
    char name[96];
    int rows, cols; /* cols 0: a vector */
    float *x;
} tensor;

static double gauss(uint64_t *s) {
    double u = ((double)(kvq_bench_rnd(s) >> 8) + 0.5) / 16777216.0, v = ((double)(kvq_bench_rnd(s) >> 8) + 0.5) / 16777216.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static tensor *add(tensor *t, int *n, const char *name, int rows, int cols) {
    tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->rows = rows, x->cols = cols;
    x->x = calloc((size_t)rows * (size_t)(cols ? cols : 1), sizeof(float));
    return x->x ? x : NULL;
}

/* Amplitude of head-vector row r: rotate-half pairs (p, p+64) turn by theta^(-p/64) per
 * position; the low-frequency half (p >= 32) carries most of the energy. */
static float row_amp(int r) { return (r % (HD / 2)) >= HD / 4 ? 1.0f : 0.25f; }

static int is_outlier_pair(int r) { return r % (HD / 2) == 5 || r % (HD / 2) == 45; }

/* The layer's weights (HF names, [out][in]). */
static int make_layer(tensor *t, int *n, int l, uint64_t *s) {
    char nm[96];
    tensor *q, *k, *v, *o, *g, *up, *dn;
#define T(var, suffix, r, c) \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix); \
    if (!(var = add(t, n, nm, r, c))) return -1;
    T(q, "self_attn.q_proj.weight", NH * HD, D);
    T(k, "self_attn.k_proj.weight", NKV * HD, D);
    T(v, "self_attn.v_proj.weight", NKV * HD, D);
    T(o, "self_attn.o_proj.weight", D, NH * HD);
    T(g, "mlp.gate_proj.weight", FF, D);
    T(up, "mlp.up_proj.weight", FF, D);
    T(dn, "mlp.down_proj.weight", D, FF);
    tensor *n1, *n2;
    T(n1, "input_layernorm.weight", D, 0);
    T(n2, "post_attention_layernorm.weight", D, 0);
#undef T
    for (int i = 0; i < D; i++) n1->x[i] = n2->x[i] = 1.0f;
    const float is = 1.0f / sqrtf((float)D);
    for (int r = 0; r < NKV * HD; r++) {
        float amp = row_amp(r % HD) * is;
        for (int c = 0; c < D; c++) k->x[(size_t)r * D + c] = amp * (float)gauss(s);
        for (int c = 0; c < D; c++) v->x[(size_t)r * D + c] = is * (float)gauss(s);
    }
    static const float sharp[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    for (int h = 0; h < NH; h++) {
        int grp = h / (NH / NKV);
        for (int r = 0; r < HD; r++) {
            const float *kr = k->x + ((size_t)grp * HD + r) * D;
            float *qr = q->x + ((size_t)h * HD + r) * D, amp = row_amp(r) * is;
            for (int c = 0; c < D; c++) qr[c] = sharp[h % 4] * (kr[c] + 0.3f * amp * (float)gauss(s));
            if (is_outlier_pair(r))
                for (int c = 0; c < D; c++) qr[c] /= 12.0f;
        }
    }
    for (int r = 0; r < NKV * HD; r++)
        if (is_outlier_pair(r % HD))
            for (int c = 0; c < D; c++) k->x[(size_t)r * D + c] *= 12.0f;
    for (int r = 0; r < D; r++)
        for (int c = 0; c < NH * HD; c++) {
            float w = 1.5f * (float)gauss(s) / sqrtf((float)(NH * HD));
            o->x[(size_t)r * NH * HD + c] = c % HD == 17 ? w / 4.0f : w;
        }
    for (int grp = 0; grp < NKV; grp++)
        for (int c = 0; c < D; c++) v->x[((size_t)grp * HD + 17) * D + c] *= 4.0f;
    for (size_t i = 0; i < (size_t)FF * D; i++) {
        g->x[i] = is * (float)gauss(s);
        up->x[i] = is * (float)gauss(s);
        dn->x[i] = 0.5f * (float)gauss(s) / sqrtf((float)FF);
    }
    return 0;
}

static int write_safetensors(const char *path, const tensor *t, int n) {
    size_t cap = 256 + (size_t)n * 200, len = 0, off = 0;
    char *hdr = malloc(cap);
    if (!hdr) return -1;
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1) * 2;
        if (t[i].cols)
            len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"F16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                                    t[i].name, t[i].rows, t[i].cols, off, off + bytes);
        else
            len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                                    t[i].name, t[i].rows, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while ((8 + len) % 64) hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    uint64_t hl = len;
    int bad = !f || fwrite(&hl, 8, 1, f) != 1 || fwrite(hdr, 1, len, f) != len;
    free(hdr);
    uint16_t buf[4096];
    for (int i = 0; i < n && !bad; i++) {
        size_t cnt = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
        for (size_t a = 0; a < cnt && !bad; a += 4096) {
            size_t m = cnt - a < 4096 ? cnt - a : 4096;
            for (size_t j = 0; j < m; j++) buf[j] = kvq_f32_to_f16(t[i].x[a + j]);
            bad = fwrite(buf, 2, m, f) != m;
        }
    }
    if (f && fclose(f) != 0) bad = 1;
    return bad ? -1 : 0;
}

static int write_config(const char *path, int n_layer, int n_ctx) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"hidden_size\": %d,\n"
            "  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n"
            "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": %.1f,\n  \"hidden_act\": \"silu\",\n"
            "  \"tie_word_embeddings\": false,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"torch_dtype\": \"float16\"\n}\n",
            D, FF, n_layer, NH, NKV, VOCAB, n_ctx, THETA);
    return fclose(f) != 0 ? -1 : 0;
}

/* Fresh tokens (skewed towards low ids, like word frequencies) and copies of spans of 8..64
 * tokens starting anywhere earlier: about half the stream repeats something. */
static int write_stream(const char *path, int n, uint64_t *s) {
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    FILE *f = ids ? fopen(path, "w") : NULL;
    if (!f) {
        free(ids);
        return -1;
    }
    for (int i = 0; i < n;) {
        if (i > 64 && kvq_bench_rnd(s) % 16 == 0) {
            int from = (int)(kvq_bench_rnd(s) % (uint32_t)(i - 64)), len = 8 + (int)(kvq_bench_rnd(s) % 57);
            for (int j = 0; j < len && i < n; j++) ids[i++] = ids[from + j];
        } else {
            double u = ((double)(kvq_bench_rnd(s) >> 8) + 0.5) / 16777216.0;
            ids[i++] = 3 + (int32_t)((double)STREAM_VOCAB * u * u);
        }
    }
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) bad = fprintf(f, "%d%c", ids[i], i % 16 == 15 ? '\n' : ' ') < 0;
    if (fclose(f) != 0) bad = 1;
    free(ids);
    return bad ? -1 : 0;
}

static int copy_file(const char *src, const char *dst) {
    char *text;
    size_t n;
    if (kvq_read_file(src, &text, &n) != KVQ_OK) return -1;
    FILE *f = fopen(dst, "wb");
    int bad = !f || fwrite(text, 1, n, f) != n;
    if (f && fclose(f) != 0) bad = 1;
    free(text);
    return bad ? -1 : 0;
}

int kvq_bench_longctx(int argc, char **argv) {
    const char *out = NULL;
    long n_tok = 32768, n_layer = 2, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kvq-bench longctx-model --out DIR [--tokens N] [--layers L] [--seed S]\n"
                   "  writes DIR/{config.json, model.safetensors, tokenizer files} (a random fp16 model with\n"
                   "  Llama-3-8B's head shape and RoPE whose attention is peaked and position-dependent; see\n"
                   "  tools/bench/bench_longctx.c) and DIR/stream.ids (N token ids, default 32768), for\n"
                   "  kvq-ppl -m DIR --ids DIR/stream.ids -c N --kl-base f16 -ctk q4 -ctv q4 --kl-at 1024,8192,32768\n");
            return 0;
        }
        if (!v) return kvq_tool_die(P, "unknown option or missing value: %s (see --help)", a);
        i++;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--tokens")) { if (kvq_tool_parse_int(v, 256, 1 << 22, &n_tok)) goto bad; }
        else if (!strcmp(a, "--layers")) { if (kvq_tool_parse_int(v, 1, 64, &n_layer)) goto bad; }
        else if (!strcmp(a, "--seed")) { if (kvq_tool_parse_int(v, 0, 1L << 30, &seed)) goto bad; }
        else return kvq_tool_die(P, "unknown option '%s' (see --help)", a);
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a);
    }
    if (!out) return kvq_tool_die(P, "no --out DIR given");
    const char *demo = kvq_tool_demo_model();
    if (!demo) return kvq_tool_die(P, "the demo model (for its tokenizer) was not found");
    if (mkdir(out, 0755) != 0 && errno != EEXIST) return kvq_tool_die(P, "%s: cannot create: %s", out, strerror(errno));
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
    int cap = 3 + 9 * (int)n_layer, n = 0, rc = 0;
    tensor *t = calloc((size_t)cap, sizeof *t);
    if (!t) return kvq_tool_die(P, "out of memory");
    tensor *emb = add(t, &n, "model.embed_tokens.weight", VOCAB, D), *head = add(t, &n, "lm_head.weight", VOCAB, D);
    tensor *fn = add(t, &n, "model.norm.weight", D, 0);
    float *u = malloc(sizeof *u * D);
    if (!emb || !head || !fn || !u) rc = kvq_tool_die(P, "out of memory");
    if (!rc) {
        for (int c = 0; c < D; c++) u[c] = (float)gauss(&s);
        /* the shared direction, half an embedding's norm */
        for (size_t i = 0; i < (size_t)VOCAB * D; i++) emb->x[i] = (float)gauss(&s) + 0.7f * u[i % D];
        for (size_t i = 0; i < (size_t)VOCAB * D; i++) head->x[i] = 3.0f * (float)gauss(&s) / sqrtf((float)D);
        for (int i = 0; i < D; i++) fn->x[i] = 1.0f;
    }
    for (int l = 0; l < n_layer && !rc; l++)
        if (make_layer(t, &n, l, &s)) rc = kvq_tool_die(P, "out of memory");
    char path[4096];
    if (!rc && ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", out) >= sizeof path || write_safetensors(path, t, n)))
        rc = kvq_tool_die(P, "%s: cannot write", path);
    if (!rc && ((size_t)snprintf(path, sizeof path, "%s/config.json", out) >= sizeof path ||
                write_config(path, (int)n_layer, (int)(n_tok > 8192 ? n_tok : 8192))))
        rc = kvq_tool_die(P, "%s: cannot write", path);
    static const char *const tok_files[2] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2 && !rc; i++) {
        char src[4096];
        snprintf(src, sizeof src, "%s/%s", demo, tok_files[i]);
        snprintf(path, sizeof path, "%s/%s", out, tok_files[i]);
        if (copy_file(src, path)) rc = kvq_tool_die(P, "%s: cannot copy to %s", src, path);
    }
    if (!rc && ((size_t)snprintf(path, sizeof path, "%s/stream.ids", out) >= sizeof path || write_stream(path, (int)n_tok, &s)))
        rc = kvq_tool_die(P, "%s: cannot write", path);
    if (!rc) printf("wrote %s: %ld layers, hidden %d, heads %d/%d x %d, rope theta %.0f, and stream.ids (%ld tokens)\n", out,
                    n_layer, D, NH, NKV, HD, THETA, n_tok);
    for (int i = 0; i < n; i++) free(t[i].x);
    free(t);
    free(u);
    return rc;
}
