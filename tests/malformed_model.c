#include "malformed_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "util.h"

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */

void mm_init(mm_model *m, int aqlm) {
    memset(m, 0, sizeof *m);
    m->hidden = 64;
    m->ff = 128;
    m->layers = 1;
    m->heads = 2;
    m->kv_heads = 1;
    m->vocab = 272;
    m->ctx = 128;
    m->aqlm = aqlm;
    m->n_codebooks = 2;
    m->nbits = 8;
    m->in_group = 8;
    mm_build(m);
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

static mm_tensor *add(mm_model *m, const char *name, const char *dtype, int nd, int64_t d0, int64_t d1, int64_t d2,
                      int64_t d3) {
    assert_true(m->n < (int)(sizeof m->t / sizeof m->t[0]));
    mm_tensor *t = &m->t[m->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->nd = nd;
    int64_t d[4] = {d0, d1, d2, d3};
    size_t count = 1;
    for (int i = 0; i < nd; i++) count *= (size_t)(t->shape[i] = d[i]);
    size_t es = !strcmp(dtype, "F32") ? 4 : !strcmp(dtype, "I8") ? 1 : 2;
    t->nbytes = count * es;
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    assert_non_null(t->data);
    for (size_t i = 0; i < count; i++) {
        if (!strcmp(dtype, "F16")) {
            uint16_t h = kvq_f32_to_f16(((float)(rnd() % 2001) - 1000.0f) / 4000.0f);
            memcpy(t->data + 2 * i, &h, 2);
        } else if (!strcmp(dtype, "I8")) {
            t->data[i] = (uint8_t)rnd();
        } else if (!strcmp(dtype, "I16")) {
            uint16_t c = (uint16_t)(rnd() & ((1u << m->nbits) - 1));
            memcpy(t->data + 2 * i, &c, 2);
        } else {
            float f = 1.0f;
            memcpy(t->data + 4 * i, &f, 4);
        }
    }
    return t;
}

static void fill_f16(mm_tensor *t, float v) {
    uint16_t h = kvq_f32_to_f16(v);
    for (size_t i = 0; i < t->nbytes / 2; i++) memcpy(t->data + 2 * i, &h, 2);
}

static void linear(mm_model *m, const char *prefix, int64_t rows, int64_t cols) {
    char n[160];
    if (!m->aqlm) {
        snprintf(n, sizeof n, "%s.weight", prefix);
        add(m, n, "F16", 2, rows, cols, 0, 0);
        return;
    }
    snprintf(n, sizeof n, "%s.codes", prefix);
    add(m, n, m->nbits <= 8 ? "I8" : "I16", 3, rows, cols / m->in_group, m->n_codebooks, 0);
    snprintf(n, sizeof n, "%s.codebooks", prefix);
    add(m, n, "F16", 4, m->n_codebooks, (int64_t)1 << m->nbits, 1, m->in_group);
    snprintf(n, sizeof n, "%s.scales", prefix);
    fill_f16(add(m, n, "F16", 4, rows, 1, 1, 1), 0.5f);
}

void mm_build(mm_model *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
    m->n = 0;
    int64_t h = m->hidden, hd = m->hidden / m->heads, q = m->heads * hd, kv = m->kv_heads * hd;
    add(m, "model.embed_tokens.weight", "F16", 2, m->vocab, h, 0, 0);
    fill_f16(add(m, "model.norm.weight", "F16", 1, h, 0, 0, 0), 1.0f);
    add(m, "lm_head.weight", "F16", 2, m->vocab, h, 0, 0);
    char n[120];
    for (int l = 0; l < m->layers; l++) {
        snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
        fill_f16(add(m, n, "F16", 1, h, 0, 0, 0), 1.0f);
        snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l);
        fill_f16(add(m, n, "F16", 1, h, 0, 0, 0), 1.0f);
        static const char *const lin[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        const int64_t rows[7] = {q, kv, kv, h, m->ff, m->ff, h}, cols[7] = {h, h, h, q, h, h, m->ff};
        for (int k = 0; k < 7; k++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", l, lin[k]);
            linear(m, n, rows[k], cols[k]);
        }
    }
}

mm_tensor *mm_find(mm_model *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    fail_msg("mm_find: no tensor %s", name);
    return NULL;
}

void mm_remove(mm_model *m, const char *name) {
    mm_tensor *t = mm_find(m, name);
    free(t->data);
    int i = (int)(t - m->t);
    memmove(&m->t[i], &m->t[i + 1], sizeof *t * (size_t)(m->n - i - 1));
    m->n--;
}

void mm_set_data(mm_tensor *t, size_t n, uint8_t fill) {
    free(t->data);
    t->data = malloc(n ? n : 1);
    assert_non_null(t->data);
    memset(t->data, fill, n);
    t->nbytes = n;
}

void mm_free(mm_model *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
    m->n = 0;
}

static void put_file(const char *dir, const char *name, const void *data, size_t n) {
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Tensors [from, to) as one safetensors file. */
static void write_st(const char *dir, const char *file, const mm_tensor *t, int from, int to) {
    size_t cap = 1 << 16, len = 0, off = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    len += (size_t)snprintf(h, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = from; i < to; i++) {
        long long b = t[i].has_offs ? t[i].offs[0] : (long long)off, e = t[i].has_offs ? t[i].offs[1] : (long long)(off + t[i].nbytes);
        if (!t[i].has_offs) off += t[i].nbytes;
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].nd; d++) len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%lld,%lld]}", b, e);
        assert_true(len < cap - 256);
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    size_t total = 8 + len + off;
    uint8_t *img = calloc(1, total);
    assert_non_null(img);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(img + 8, h, len);
    size_t p = 8 + len;
    for (int i = from; i < to; i++)
        if (!t[i].has_offs) {
            memcpy(img + p, t[i].data, t[i].nbytes);
            p += t[i].nbytes;
        }
    put_file(dir, file, img, total);
    free(img);
    free(h);
}

static void write_config(const mm_model *m, const char *dir) {
    char c[4096];
    int n = snprintf(c, sizeof c,
                     "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":%lld,"
                     "\"intermediate_size\":%lld,\"num_hidden_layers\":%lld,\"num_attention_heads\":%lld,"
                     "\"num_key_value_heads\":%lld,\"vocab_size\":%lld,\"max_position_embeddings\":%lld,"
                     "\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"hidden_act\":\"silu\",\"bos_token_id\":1,"
                     "\"eos_token_id\":2,\"tie_word_embeddings\":false",
                     m->hidden, m->ff, m->layers, m->heads, m->kv_heads, m->vocab, m->ctx);
    if (m->aqlm)
        n += snprintf(c + n, sizeof c - (size_t)n,
                      ",\"quantization_config\":{\"quant_method\":\"aqlm\",\"nbits_per_codebook\":%d,\"num_codebooks\":%d,"
                      "\"out_group_size\":1,\"in_group_size\":%d,\"linear_weights_not_to_quantize\":[\"lm_head.weight\"]}",
                      m->nbits, m->n_codebooks, m->in_group);
    if (m->extra_config) n += snprintf(c + n, sizeof c - (size_t)n, ",%s", m->extra_config);
    n += snprintf(c + n, sizeof c - (size_t)n, "}\n");
    put_file(dir, "config.json", c, (size_t)n);
}

/* SentencePiece-style BPE: <unk> <s> </s>, 256 byte pieces, then a few merged pieces. */
static void write_tokenizer(const mm_model *m, const char *dir) {
    size_t cap = 1 << 15, n = 0;
    char *j = malloc(cap);
    assert_non_null(j);
    n += (size_t)snprintf(j, cap,
        "{\"version\":\"1.0\",\"added_tokens\":["
        "{\"id\":0,\"content\":\"<unk>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
        "{\"id\":1,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"" SP "\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"" SP "\"}]},\"pre_tokenizer\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"" SP "\"},\"content\":\" \"},"
        "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,\"vocab\":{"
        "\"<unk>\":0,\"<s>\":1,\"</s>\":2");
    for (int b = 0; b < 256; b++) n += (size_t)snprintf(j + n, cap - n, ",\"<0x%02X>\":%d", b, 3 + b);
    n += (size_t)snprintf(j + n, cap - n,
                          ",\"" SP "\":259,\"a\":260,\"b\":261,\"" SP "a\":262,\"ab\":263,\"" SP "ab\":264%s%s},"
                          "\"merges\":[\"" SP " a\",\"a b\",\"" SP "a b\"%s%s%s]}}\n",
                          m->extra_vocab ? "," : "", m->extra_vocab ? m->extra_vocab : "", m->extra_merge ? ",\"" : "",
                          m->extra_merge ? m->extra_merge : "", m->extra_merge ? "\"" : "");
    put_file(dir, "tokenizer.json", j, n);
    free(j);
    static const char tc[] = "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_bos_token\":true}\n";
    put_file(dir, "tokenizer_config.json", tc, sizeof tc - 1);
}

const char *mm_write(mm_model *m, const char *name) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", tu_tmpdir(), name);
    mkdir(dir, 0755);
    static const char *const files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
                                        "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors"};
    char p[1400];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    write_config(m, dir);
    write_tokenizer(m, dir);
    if (!m->sharded) {
        write_st(dir, "model.safetensors", m->t, 0, m->n);
        return dir;
    }
    int half = m->n / 2;
    write_st(dir, "model-00001-of-00002.safetensors", m->t, 0, half);
    write_st(dir, "model-00002-of-00002.safetensors", m->t, half, m->n);
    size_t cap = 1 << 15, n = 0;
    char *ix = malloc(cap);
    assert_non_null(ix);
    n += (size_t)snprintf(ix, cap, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    for (int i = 0; i < m->n; i++)
        n += (size_t)snprintf(ix + n, cap - n, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", m->t[i].name,
                              i < half ? 1 : 2);
    n += (size_t)snprintf(ix + n, cap - n, "}}\n");
    put_file(dir, "model.safetensors.index.json", ix, n);
    free(ix);
    return dir;
}

void mm_truncate(const char *dir, const char *file, long size) {
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    assert_int_equal(truncate(p, size), 0);
}

void mm_set_header_len(const char *dir, const char *file, uint64_t hlen) {
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    assert_int_equal(fwrite(b, 1, 8, f), 8);
    fclose(f);
}

long mm_file_size(const char *dir, const char *file) {
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    return (long)st.st_size;
}
