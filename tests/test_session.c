/* KV sessions on disk (kvq_context_save / kvq_context_restore) on the demo model: for every
 * cache type a restored context continues exactly as the one that saved it, files shrink with
 * the cache type, and damaged or mismatched files are refused without touching the context.
 * KVQ_TEST_BACKEND / KVQ_TEST_NGL run the same on Vulkan and with offload (ctest variants). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

#define N_GEN 12

typedef struct {
    kvq_model *m;
    int32_t prompt[256];
    int n_prompt, n_vocab;
} fixture;

static const char *g_backend;

static int setup(void **state) {
    if (!tu_env_backend(&g_backend)) {
        *state = NULL;
        return 0;
    }
    fixture *f = calloc(1, sizeof *f);
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    mp.n_gpu_layers = tu_env_gpu_layers();
    mp.n_threads = 1; /* repeatable sums: restored and original decode must agree to the bit */
    if (kvq_model_load(KVQ_SOURCE_DIR "/models/demo", &mp, &f->m) != KVQ_OK) fail_msg("load: %s", kvq_last_error());
    f->n_vocab = kvq_model_n_vocab(f->m);
    const char *text = "The jury said that the city of Atlanta should take steps to improve its election laws, and";
    f->n_prompt = kvq_tokenize(kvq_model_tokenizer(f->m), text, strlen(text), 1, f->prompt, 256);
    assert_true(f->n_prompt > 8);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (f) kvq_model_free(f->m);
    free(f);
    return 0;
}

static kvq_context *new_ctx(fixture *f, kvq_cache_type tk, kvq_cache_type tv, int n_ctx) {
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.type_k = tk;
    cp.type_v = tv;
    kvq_context *c = NULL;
    if (kvq_context_new(f->m, &cp, &c) != KVQ_OK) fail_msg("context: %s", kvq_last_error());
    return c;
}

static long file_size(const char *path) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fclose(fp);
    return n;
}

static const char *session_path(const char *name) {
    static char buf[4][4096];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s.kvqs", tu_tmpdir(), name);
    return buf[i];
}

/* Saves after the prompt (its last token evaluated alone), restores into a fresh context,
 * re-evaluates the last token there as the saver did, and compares logits and N_GEN greedy
 * tokens. Returns the file's size. */
static long roundtrip(fixture *f, kvq_cache_type tk, kvq_cache_type tv) {
    char name[32];
    snprintf(name, sizeof name, "rt-%s-%s", kvq_cache_type_name(tk), kvq_cache_type_name(tv));
    const char *path = session_path(name);
    const int n = f->n_prompt;
    kvq_context *a = new_ctx(f, tk, tv, 128);
    assert_int_equal(kvq_eval(a, f->prompt, n - 1), KVQ_OK);
    assert_int_equal(kvq_eval(a, f->prompt + n - 1, 1), KVQ_OK);
    float *want = malloc(sizeof(float) * (size_t)f->n_vocab);
    memcpy(want, kvq_logits(a), sizeof(float) * (size_t)f->n_vocab);
    if (kvq_context_save(a, path, f->prompt, n) != KVQ_OK) fail_msg("save: %s", kvq_last_error());
    int32_t gen_a[N_GEN], gen_b[N_GEN], toks[256];
    tu_greedy(a, f->n_vocab, gen_a, N_GEN);

    kvq_context *b = new_ctx(f, tk, tv, 128);
    int got = -1;
    if (kvq_context_restore(b, path, toks, 256, &got) != KVQ_OK) fail_msg("restore: %s", kvq_last_error());
    assert_int_equal(got, n);
    assert_int_equal(kvq_n_past(b), n);
    assert_memory_equal(toks, f->prompt, sizeof(int32_t) * (size_t)n);
    assert_null(kvq_logits(b)); /* logits are not saved */
    assert_int_equal(kvq_kv_truncate(b, n - 1), KVQ_OK);
    assert_int_equal(kvq_eval(b, f->prompt + n - 1, 1), KVQ_OK);
    double d = tu_max_abs_diff(kvq_logits(b), want, (size_t)f->n_vocab);
    if (d > 0) fail_msg("%s: restored logits differ by %g", name, d);
    tu_greedy(b, f->n_vocab, gen_b, N_GEN);
    assert_memory_equal(gen_a, gen_b, sizeof gen_a);
    print_message("%s: %ld bytes, continuation identical\n", name, file_size(path));
    free(want);
    kvq_context_free(a);
    kvq_context_free(b);
    return file_size(path);
}

static void test_roundtrip_every_type(void **state) {
    fixture *f = *state;
    if (!f) skip();
    long f32 = roundtrip(f, KVQ_CACHE_F32, KVQ_CACHE_F32);
    long f16 = roundtrip(f, KVQ_CACHE_F16, KVQ_CACHE_F16);
    long q8 = roundtrip(f, KVQ_CACHE_Q8, KVQ_CACHE_Q8);
    long q4 = roundtrip(f, KVQ_CACHE_Q4, KVQ_CACHE_Q4);
    roundtrip(f, KVQ_CACHE_Q8, KVQ_CACHE_Q4);
    /* rows dominate: f16 is half of f32, q8 17/32 of f16, q4 9/32 (plus 72 bytes and the tokens) */
    assert_true(f16 < f32 * 0.51);
    assert_true(q8 < f16 * 0.55);
    assert_true(q4 < f16 * 0.30);
}

/* A file that fails to restore leaves the context's cache and n_past as they were. */
static void expect_refused(kvq_context *c, const char *path, kvq_status want, const char *msg_part) {
    int32_t toks[256];
    int got = -7, before = kvq_n_past(c);
    kvq_status s = kvq_context_restore(c, path, toks, 256, &got);
    if (s != want) fail_msg("%s: status %d (%s), wanted %d", path, s, kvq_last_error(), want);
    if (!strstr(kvq_last_error(), msg_part)) fail_msg("%s: message \"%s\" lacks \"%s\"", path, kvq_last_error(), msg_part);
    if (!strstr(kvq_last_error(), path)) fail_msg("message \"%s\" does not name the file", kvq_last_error());
    assert_int_equal(got, 0);
    assert_int_equal(kvq_n_past(c), before);
}

static void write_bytes(const char *path, const unsigned char *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

static void test_bad_files(void **state) {
    fixture *f = *state;
    if (!f) skip();
    const char *good = session_path("good");
    kvq_context *a = new_ctx(f, KVQ_CACHE_Q4, KVQ_CACHE_Q4, 128);
    assert_int_equal(kvq_eval(a, f->prompt, f->n_prompt), KVQ_OK);
    assert_int_equal(kvq_context_save(a, good, f->prompt, f->n_prompt), KVQ_OK);
    /* the token count must match the cache */
    assert_int_equal(kvq_context_save(a, session_path("bad-count"), f->prompt, f->n_prompt - 1), KVQ_ERR_ARG);
    size_t len;
    unsigned char *img = (unsigned char *)tu_read_file(good, &len);

    kvq_context *c = new_ctx(f, KVQ_CACHE_Q4, KVQ_CACHE_Q4, 128);
    assert_int_equal(kvq_eval(c, f->prompt, 3), KVQ_OK); /* something to keep */
    const char *p = session_path("damaged");
    img[len / 2] ^= 0x40;
    write_bytes(p, img, len);
    expect_refused(c, p, KVQ_ERR_FORMAT, "checksum");
    img[len / 2] ^= 0x40;
    write_bytes(p, img, len - 9);
    expect_refused(c, p, KVQ_ERR_FORMAT, "damaged");
    write_bytes(p, img, 40);
    expect_refused(c, p, KVQ_ERR_FORMAT, "not a kvq session");
    write_bytes(p, (const unsigned char *)"{\"not\": \"a session\"}", 20);
    expect_refused(c, p, KVQ_ERR_FORMAT, "not a kvq session");
    unsigned char v = img[4];
    img[4] = 9;
    write_bytes(p, img, len);
    expect_refused(c, p, KVQ_ERR_FORMAT, "version 9");
    img[4] = v;
    expect_refused(c, session_path("missing"), KVQ_ERR_IO, "");

    /* a context that differs from the saver */
    kvq_context *f16 = new_ctx(f, KVQ_CACHE_F16, KVQ_CACHE_F16, 128);
    expect_refused(f16, good, KVQ_ERR_ARG, "-ctk");
    kvq_context *small = new_ctx(f, KVQ_CACHE_Q4, KVQ_CACHE_Q4, 16);
    expect_refused(small, good, KVQ_ERR_ARG, "-c");
    int32_t toks[4];
    int got;
    assert_int_equal(kvq_context_restore(c, good, toks, 4, &got), KVQ_ERR_ARG);
    assert_int_equal(kvq_n_past(c), 3);

    /* another model: a family fixture of the repository */
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    kvq_model *other;
    if (kvq_model_load(KVQ_SOURCE_DIR "/tests/data/models/qwen2-tiny-aqlm-2x8", &mp, &other) != KVQ_OK)
        fail_msg("load qwen2: %s", kvq_last_error());
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = 128;
    cp.type_k = cp.type_v = KVQ_CACHE_Q4;
    kvq_context *oc;
    assert_int_equal(kvq_context_new(other, &cp, &oc), KVQ_OK);
    expect_refused(oc, good, KVQ_ERR_ARG, "different model");
    kvq_context_free(oc);
    kvq_model_free(other);

    /* and the good file still restores into c */
    assert_int_equal(kvq_context_restore(c, good, (int32_t[256]){0}, 256, &got), KVQ_OK);
    assert_int_equal(got, f->n_prompt);
    free(img);
    kvq_context_free(a);
    kvq_context_free(c);
    kvq_context_free(f16);
    kvq_context_free(small);
}

/* Phi-3's long RoPE: a file made past original_max_position_embeddings (the long table)
 * restores into a context that can cross it and continues as the saver; a context that cannot
 * (n_ctx within the original length) refuses it. */
static void test_longrope(void **state) {
    fixture *f = *state;
    if (!f) skip();
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = g_backend;
    mp.n_gpu_layers = tu_env_gpu_layers();
    mp.n_threads = 1;
    kvq_model *m;
    if (kvq_model_load(KVQ_SOURCE_DIR "/tests/data/models/phi3-tiny-aqlm-1x16g8", &mp, &m) != KVQ_OK)
        fail_msg("load phi3: %s", kvq_last_error());
    const int nv = kvq_model_n_vocab(m), n = 100; /* past the fixture's original 64 */
    int32_t ids[101], toks[512];
    for (int i = 0; i < 101; i++) ids[i] = (int32_t)((i * 7919 + 13) % nv);
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = 512;
    cp.type_k = cp.type_v = KVQ_CACHE_F16;
    kvq_context *a, *b, *small;
    assert_int_equal(kvq_context_new(m, &cp, &a), KVQ_OK);
    assert_int_equal(kvq_context_new(m, &cp, &b), KVQ_OK);
    assert_int_equal(kvq_eval(a, ids, n - 1), KVQ_OK);
    assert_int_equal(kvq_eval(a, ids + n - 1, 1), KVQ_OK);
    const char *path = session_path("phi3-long");
    assert_int_equal(kvq_context_save(a, path, ids, n), KVQ_OK);
    float *want = malloc(sizeof(float) * (size_t)nv);
    memcpy(want, kvq_logits(a), sizeof(float) * (size_t)nv);
    int got;
    if (kvq_context_restore(b, path, toks, 512, &got) != KVQ_OK) fail_msg("restore: %s", kvq_last_error());
    assert_int_equal(got, n);
    assert_int_equal(kvq_kv_truncate(b, n - 1), KVQ_OK);
    assert_int_equal(kvq_eval(b, ids + n - 1, 1), KVQ_OK);
    double d = tu_max_abs_diff(kvq_logits(b), want, (size_t)nv);
    if (d > 0) fail_msg("phi3 long: restored logits differ by %g", d);
    /* one more token each: still the same */
    assert_int_equal(kvq_eval(a, ids + n, 1), KVQ_OK);
    assert_int_equal(kvq_eval(b, ids + n, 1), KVQ_OK);
    assert_true(tu_max_abs_diff(kvq_logits(b), kvq_logits(a), (size_t)nv) == 0);
    cp.n_ctx = 64;
    assert_int_equal(kvq_context_new(m, &cp, &small), KVQ_OK);
    expect_refused(small, path, KVQ_ERR_ARG, "long RoPE");
    free(want);
    kvq_context_free(a);
    kvq_context_free(b);
    kvq_context_free(small);
    kvq_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_type),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_longrope),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
