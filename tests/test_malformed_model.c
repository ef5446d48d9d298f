/* The malformed-model corpus: one synthetic checkpoint per broken thing (tests/
 * malformed_model.c writes them; nothing binary is committed). For every case the
 * library must fail with one line naming the file and the problem and free what it
 * had (ASan/LSan builds check that), and kvq-chat and kvq-ppl must exit 1 with that one line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvq.h"
#include "malformed_model.h"
#include "model/safetensors.h"
#include "testutil.h"

typedef struct {
    const char *name;
    int aqlm, sharded;
    void (*change)(mm_model *m);        /* before writing */
    void (*surgery)(const char *dir);   /* after writing */
    const char *file, *problem;         /* both must appear in the message */
} mcase;

/* Loads dir and expects failure naming file and problem. */
static void expect_lib_error(const char *dir, const char *file, const char *problem) {
    kvq_model *m = (kvq_model *)1;
    kvq_status s = kvq_model_load(dir, NULL, &m);
    const char *msg = kvq_last_error();
    if (s == KVQ_OK) fail_msg("%s: loaded, expected an error naming '%s' and '%s'", dir, file, problem);
    assert_null(m);
    if (!strstr(msg, file) || !strstr(msg, problem) || strchr(msg, '\n'))
        fail_msg("%s: message '%s' should be one line naming '%s' and '%s'", dir, msg, file, problem);
}

/* Runs kvq-chat and kvq-ppl on dir and expects exit 1 with one stderr line naming file and problem. */
static void expect_tool_error(const char *dir, const char *file, const char *problem) {
    char text[1024];
    snprintf(text, sizeof text, "%s/text.txt", tu_tmpdir());
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    fputs("ab ab ab ab ab ab ab ab ab ab ab ab\n", f);
    fclose(f);
    static const char *const tools[2][2] = {{"kvq-chat", "-p ab -n 1"}, {"kvq-ppl", "-c 4 -f "}};
    for (int k = 0; k < 2; k++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s/%s -m '%s' %s%s 2>&1 >/dev/null", KVQ_TOOLS_DIR, tools[k][0], dir, tools[k][1],
                 k ? text : "");
        int st;
        char *err = tu_run(cmd, &st);
        size_t len = strlen(err), pl = strlen(tools[k][0]);
        int one_line = len > 0 && err[len - 1] == '\n' && !memchr(err, '\n', len - 1);
        if (st != 1 || !one_line || strncmp(err, tools[k][0], pl) || strncmp(err + pl, ": ", 2) || !strstr(err, file) ||
            !strstr(err, problem))
            fail_msg("%s on %s: exit %d, stderr '%s'; want exit 1 and one line naming '%s' and '%s'", tools[k][0], dir, st, err,
                     file, problem);
        free(err);
    }
}

static const char *CODEBOOKS = "model.layers.0.self_attn.k_proj.codebooks";
static const char *SCALES = "model.layers.0.mlp.up_proj.scales";
static const char *NORM = "model.norm.weight";

static void trunc_half(const char *d) { mm_truncate(d, "model.safetensors", mm_file_size(d, "model.safetensors") / 2); }
static void trunc_tiny(const char *d) { mm_truncate(d, "model.safetensors", 5); }
static void hlen_past_eof(const char *d) { mm_set_header_len(d, "model.safetensors", (uint64_t)mm_file_size(d, "model.safetensors")); }
static void hlen_huge(const char *d) { mm_set_header_len(d, "model.safetensors", (uint64_t)1 << 62); }
static void del_shard2(const char *d) { mm_truncate(d, "model-00002-of-00002.safetensors", 0); }
static void rm_shard2(const char *d) {
    char p[1200];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
    assert_int_equal(remove(p), 0);
}
static void overlap(mm_model *m) {
    mm_tensor *t = mm_find(m, NORM);
    t->has_offs = 1, t->offs[0] = 64, t->offs[1] = 64 + (int64_t)t->nbytes; /* inside the embedding's bytes */
}
static void reversed(mm_model *m) {
    mm_tensor *t = mm_find(m, NORM);
    t->has_offs = 1, t->offs[0] = 128, t->offs[1] = 0;
}
static void bytes_vs_shape(mm_model *m) { mm_set_data(mm_find(m, NORM), 130, 0x3C); }
static void missing_tensor(mm_model *m) { mm_remove(m, CODEBOOKS); }
static void missing_dense(mm_model *m) { mm_remove(m, NORM); }
static void norm_i8(mm_model *m) {
    mm_tensor *t = mm_find(m, NORM);
    snprintf(t->dtype, sizeof t->dtype, "I8");
    mm_set_data(t, 64, 1);
}
static void codes_i16(mm_model *m) {
    mm_tensor *t = mm_find(m, "model.layers.0.self_attn.q_proj.codes");
    snprintf(t->dtype, sizeof t->dtype, "I16");
    mm_set_data(t, t->nbytes * 2, 0);
}
static void codes_shape(mm_model *m) {
    mm_tensor *t = mm_find(m, "model.layers.0.self_attn.k_proj.codes");
    t->shape[0] = 16;
    mm_set_data(t, t->nbytes / 2, 0);
}
static void embed_shape(mm_model *m) {
    mm_tensor *t = mm_find(m, "model.embed_tokens.weight");
    t->shape[1] = 32;
    mm_set_data(t, t->nbytes / 2, 0);
}
static void codes_range(mm_model *m) {
    m->nbits = 12;
    mm_build(m);
    mm_tensor *t = mm_find(m, "model.layers.0.mlp.down_proj.codes");
    uint16_t bad = 4096;
    memcpy(t->data + 2 * 37, &bad, 2);
}
static void codebook_entries(mm_model *m) {
    mm_tensor *t = mm_find(m, CODEBOOKS);
    t->shape[1] = 128;
    mm_set_data(t, t->nbytes / 2, 0);
}
static void nan_scale(mm_model *m) { memcpy(mm_find(m, SCALES)->data + 6, "\x00\x7e", 2); }
static void inf_codebook(mm_model *m) { memcpy(mm_find(m, CODEBOOKS)->data + 1000, "\x00\xfc", 2); }
static void neg_layers(mm_model *m) { m->layers = -1; }
static void huge_vocab(mm_model *m) { m->vocab = 1000000000000LL; }
static void huge_heads(mm_model *m) { m->heads = 100000; }
static void zero_heads(mm_model *m) { m->heads = 0; }
static void neg_ctx(mm_model *m) { m->ctx = -5; }
static void huge_ctx(mm_model *m) { m->ctx = 1LL << 40; }
static void huge_hidden(mm_model *m) { m->hidden = 1LL << 40; }
static void heads_3(mm_model *m) { m->heads = 3; }
static void kv_3(mm_model *m) { m->kv_heads = 3; }
static void small_vocab(mm_model *m) {
    m->vocab = 200;
    mm_build(m);
}
static void bad_merge(mm_model *m) { m->extra_merge = "a zz"; }
static void huge_token_id(mm_model *m) { m->extra_vocab = "\"zz\": 4.4e73"; } /* found by fuzzing: UB converting it */
static void bad_config_json(mm_model *m) { m->extra_config = "\"broken\": [1, 2"; }
static void bad_nbits(mm_model *m) { m->nbits = 40; }
static void odd_head_dim(mm_model *m) { m->extra_config = "\"head_dim\": 33"; }
static void bad_rope(mm_model *m) {
    m->extra_config = "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1}";
}

static const mcase CASES[] = {
    {"truncated", 1, 0, NULL, trunc_half, "model.safetensors", "past the end"},
    {"truncated_to_5_bytes", 1, 0, NULL, trunc_tiny, "model.safetensors", "too short"},
    {"header_past_eof", 1, 0, NULL, hlen_past_eof, "model.safetensors", "header length"},
    {"header_huge", 1, 0, NULL, hlen_huge, "model.safetensors", "does not fit in the file"},
    {"overlapping_offsets", 1, 0, overlap, NULL, "model.safetensors", "overlaps"},
    {"reversed_offsets", 1, 0, reversed, NULL, "model.safetensors", "bad data_offsets"},
    {"bytes_vs_shape", 1, 0, bytes_vs_shape, NULL, "model.safetensors", "130 bytes of data for 64 F16 values"},
    {"missing_tensor", 1, 0, missing_tensor, NULL, "model.safetensors", "k_proj.codebooks' is missing"},
    {"missing_dense_tensor", 0, 0, missing_dense, NULL, "model.safetensors", "model.norm.weight' is missing"},
    {"wrong_dtype_norm", 1, 0, norm_i8, NULL, "model.safetensors", "unsupported dtype I8"},
    {"wrong_dtype_codes", 1, 0, codes_i16, NULL, "model.safetensors", "I16, config.json implies [64, 8, 2] I8"},
    {"shape_vs_config_codes", 1, 0, codes_shape, NULL, "model.safetensors", "config.json implies [32, 8, 2] I8"},
    {"shape_vs_config_embed", 0, 0, embed_shape, NULL, "model.safetensors", "config.json implies [272, 64]"},
    {"codes_out_of_range", 1, 0, codes_range, NULL, "model.safetensors", "out of range for nbits_per_codebook 12"},
    {"codebook_entries", 1, 0, codebook_entries, NULL, "model.safetensors", "config.json implies [2, 256, 1, 8]"},
    {"nan_scale", 1, 0, nan_scale, NULL, "model.safetensors", "up_proj.scales' holds NaN or Inf"},
    {"inf_codebook", 1, 0, inf_codebook, NULL, "model.safetensors", "k_proj.codebooks' holds NaN or Inf"},
    {"negative_layers", 1, 0, neg_layers, NULL, "config.json", "'num_hidden_layers' must be an integer"},
    {"absurd_vocab", 1, 0, huge_vocab, NULL, "config.json", "'vocab_size' must be an integer"},
    {"absurd_heads", 1, 0, huge_heads, NULL, "config.json", "'num_attention_heads' must be an integer"},
    {"zero_heads", 1, 0, zero_heads, NULL, "config.json", "'num_attention_heads' must be an integer"},
    {"negative_ctx", 1, 0, neg_ctx, NULL, "config.json", "'max_position_embeddings' must be an integer"},
    {"absurd_ctx", 1, 0, huge_ctx, NULL, "config.json", "'max_position_embeddings' must be an integer"},
    {"absurd_hidden", 1, 0, huge_hidden, NULL, "config.json", "'hidden_size' must be an integer"},
    {"head_dim_not_dividing", 1, 0, heads_3, NULL, "config.json", "hidden_size 64 is not a multiple of num_attention_heads 3"},
    {"kv_heads_not_dividing", 1, 0, kv_3, NULL, "config.json", "not a multiple of num_key_value_heads 3"},
    {"nbits_unsupported", 1, 0, bad_nbits, NULL, "config.json", "nbits_per_codebook 40"},
    {"head_dim_odd", 1, 0, odd_head_dim, NULL, "config.json", "head_dim 33 must be even"},
    {"rope_scaling_inverted", 1, 0, bad_rope, NULL, "config.json", "high_freq_factor must exceed low_freq_factor"},
    {"config_not_json", 1, 0, bad_config_json, NULL, "config.json", "not a valid JSON object"},
    {"vocab_vs_tokenizer", 1, 0, small_vocab, NULL, "tokenizer.json", "265 token ids, but config.json vocab_size is 200"},
    {"missing_shard", 1, 1, NULL, rm_shard2, "model-00002-of-00002.safetensors", "named in model.safetensors.index.json is missing"},
    {"empty_shard", 1, 1, NULL, del_shard2, "model-00002-of-00002.safetensors", "empty"},
    {"merge_unknown_token", 1, 0, bad_merge, NULL, "tokenizer.json", "uses a piece not in the vocab"},
    {"token_id_absurd", 1, 0, huge_token_id, NULL, "tokenizer.json", "model.vocab entry \"zz\" has no valid id"},
};

static void run_case(const mcase *c) {
    mm_model m;
    mm_init(&m, c->aqlm);
    m.sharded = c->sharded;
    if (c->change) c->change(&m);
    const char *dir = mm_write(&m, c->name);
    mm_free(&m);
    if (c->surgery) c->surgery(dir);
    expect_lib_error(dir, c->file, c->problem);
    expect_tool_error(dir, c->file, c->problem);
}

static void test_corpus(void **state) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        print_message("case %s\n", CASES[i].name);
        run_case(&CASES[i]);
    }
}

/* The unbroken models load and run: the corpus cases fail for their one defect. */
static void check_good(int aqlm, int sharded, int nbits) {
    mm_model mm;
    mm_init(&mm, aqlm);
    mm.sharded = sharded;
    if (nbits != mm.nbits) {
        mm.nbits = nbits;
        mm_build(&mm);
    }
    char name[64];
    snprintf(name, sizeof name, "good_%d_%d_%d", aqlm, sharded, nbits);
    const char *dir = mm_write(&mm, name);
    mm_free(&mm);
    kvq_model *m;
    if (kvq_model_load(dir, NULL, &m) != KVQ_OK) fail_msg("%s: %s", dir, kvq_last_error());
    kvq_context *c;
    assert_int_equal(kvq_context_new(m, NULL, &c), KVQ_OK);
    int32_t ids[4];
    int n = kvq_tokenize(kvq_model_tokenizer(m), "ab ab", 5, 1, ids, 4);
    assert_int_equal(n, 3); /* <s> ▁ab ▁ab */
    assert_int_equal(kvq_eval(c, ids, n), KVQ_OK);
    const float *l = kvq_logits(c);
    for (int i = 0; i < 272; i++) assert_true(isfinite(l[i]));
    kvq_context_free(c);
    kvq_model_free(m);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/kvq-chat -m '%s' -p ab -n 2 --temp 0 2>/dev/null >/dev/null", KVQ_TOOLS_DIR, dir);
    int st;
    free(tu_run(cmd, &st));
    assert_int_equal(st, 0);
}

static void test_good_models(void **state) {
    check_good(1, 0, 8);
    check_good(0, 0, 8);
    check_good(1, 1, 8);
    check_good(1, 0, 12);
}

/* A header with 200,000 tensors (and one duplicate at the end) is handled in linear time:
 * name lookups are hashed, so a crafted file cannot stall the loader. */
static void test_many_tensors(void **state) {
    const int n = 200000;
    size_t cap = (size_t)n * 64 + 64, len = 1;
    char *h = malloc(cap);
    assert_non_null(h);
    h[0] = '{';
    for (int i = 0; i <= n; i++)
        len += (size_t)snprintf(h + len, cap - len, "%s\"t%d\":{\"dtype\":\"I8\",\"shape\":[0],\"data_offsets\":[0,0]}",
                                i ? "," : "", i < n ? i : 4242);
    h[len++] = '}';
    uint8_t *img = malloc(8 + len);
    assert_non_null(img);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(img + 8, h, len);
    free(h);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvq_st st = {0};
    assert_int_equal(kvq_st_parse(&st, img, 8 + len, "many.safetensors", 0), KVQ_ERR_FORMAT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_non_null(strstr(kvq_last_error(), "'t4242' appears twice"));
    assert_int_equal(st.n_tensors, n);
    assert_non_null(kvq_st_find(&st, "t199999"));
    assert_null(kvq_st_find(&st, "t200000"));
    kvq_st_close(&st);
    free(img);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (dt > 60) fail_msg("parsing 200000 tensors took %.1f s", dt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_models),
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_many_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
