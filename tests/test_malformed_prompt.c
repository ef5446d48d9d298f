/* Hostile prompts and oversized contexts on the demo model: invalid UTF-8, NUL
 * bytes, 1 MB of text, a prompt longer than the context, a context larger than
 * memory. Each gets a clear result or message, and the library stays usable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "resources.h"
#include "testutil.h"

static kvq_model *g_model;

static int setup(void **state) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/demo", KVQ_SOURCE_DIR);
    if (kvq_model_load(dir, NULL, &g_model) != KVQ_OK) fail_msg("%s", kvq_last_error());
    return 0;
}

static int teardown(void **state) {
    kvq_model_free(g_model);
    return 0;
}

/* Tokenizes len bytes (with BOS) into a malloc'd array; checks every id is in range. */
static int32_t *tokenize(const char *text, size_t len, int *n) {
    const kvq_tokenizer *tok = kvq_model_tokenizer(g_model);
    *n = kvq_tokenize(tok, text, len, 1, NULL, 0);
    if (*n < 0) fail_msg("tokenize failed: %s", kvq_last_error());
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n + 1));
    assert_non_null(ids);
    assert_int_equal(kvq_tokenize(tok, text, len, 1, ids, *n), *n);
    for (int i = 0; i < *n; i++) assert_true(ids[i] >= 0 && ids[i] < kvq_model_n_vocab(g_model));
    return ids;
}

static void eval_ok(kvq_context *c, const int32_t *ids, int n) {
    if (kvq_eval(c, ids, n) != KVQ_OK) fail_msg("eval failed: %s", kvq_last_error());
    const float *l = kvq_logits(c);
    assert_non_null(l);
    for (int i = 0; i < kvq_model_n_vocab(g_model); i++) assert_true(isfinite(l[i]));
}

static void test_odd_bytes(void **state) {
    static const struct {
        const char *s;
        size_t len;
    } cases[] = {
        {"\xff\xfe\xc3(\xe2\x82", 6},          /* invalid and truncated UTF-8 */
        {"a\0b\0\0c", 6},                       /* NUL bytes inside the text */
        {"\xed\xa0\x80 surrogate", 13},         /* encoded surrogate */
        {"\xf4\x90\x80\x80 past U+10FFFF", 17},
        {"", 0},
    };
    kvq_context *c;
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = 64;
    assert_int_equal(kvq_context_new(g_model, &p, &c), KVQ_OK);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n;
        int32_t *ids = tokenize(cases[i].s, cases[i].len, &n);
        assert_true(n >= 1);
        if (cases[i].len) assert_true(n >= 2); /* bytes never vanish: byte fallback */
        assert_int_equal(kvq_kv_truncate(c, 0), KVQ_OK);
        eval_ok(c, ids, n);
        char out[256];
        assert_true(kvq_detokenize(kvq_model_tokenizer(g_model), ids, n, 1, out, sizeof out) >= 0);
        free(ids);
    }
    kvq_context_free(c);
}

/* 1 MB of text with NULs and stray bytes: tokenizes; the prompt is far longer than
 * the context, which refuses it with a message and keeps working. */
static void test_megabyte_prompt(void **state) {
    size_t len = 1 << 20;
    char *text = malloc(len);
    assert_non_null(text);
    static const char words[] = "The jury said Friday an investigation of Atlanta's recent primary election produced no evidence ";
    uint64_t rng = 42;
    for (size_t i = 0; i < len; i++) {
        text[i] = words[i % (sizeof words - 1)];
        if (i % 4099 == 0) text[i] = (char)(tu_randf(&rng) * 127 + 128); /* NUL and high bytes too */
    }
    int n;
    int32_t *ids = tokenize(text, len, &n);
    free(text);
    assert_true(n > 100000);
    kvq_context *c;
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = 256;
    assert_int_equal(kvq_context_new(g_model, &p, &c), KVQ_OK);
    assert_int_equal(kvq_eval(c, ids, n), KVQ_ERR_ARG);
    const char *msg = kvq_last_error();
    if (!strstr(msg, "n_ctx") || !strstr(msg, "256") || strchr(msg, '\n')) fail_msg("message: %s", msg);
    assert_int_equal(kvq_n_past(c), 0);
    eval_ok(c, ids, 200); /* still usable */
    assert_int_equal(kvq_eval(c, ids, 57), KVQ_ERR_ARG); /* 200 + 57 > 256 */
    assert_int_equal(kvq_n_past(c), 200);
    eval_ok(c, ids, 56);
    free(ids);
    kvq_context_free(c);
}

/* A context larger than the memory there is: refused before allocating, naming a -c that fits. */
static void test_context_vs_memory(void **state) {
    setenv("KVQ_MEM_LIMIT", "64M", 1);
    kvq_context *c = (kvq_context *)1;
    kvq_context_params p = kvq_context_default_params();
    p.n_ctx = 1 << 24;
    assert_int_equal(kvq_context_new(g_model, &p, &c), KVQ_ERR_NOMEM);
    assert_null(c);
    const char *msg = kvq_last_error(), *fit = strstr(msg, "-c ");
    fit = fit ? strstr(fit + 3, "-c ") : NULL; /* the second "-c N": the one that fits */
    if (!fit || !strstr(msg, "would fit")) fail_msg("message: %s", msg);
    int n_fit = atoi(fit + 3);
    assert_true(n_fit > 1000 && n_fit < (1 << 24));
    p.n_ctx = n_fit;
    if (kvq_context_new(g_model, &p, &c) != KVQ_OK) fail_msg("-c %d: %s", n_fit, kvq_last_error());
    kvq_context_free(c);
    p.n_ctx = n_fit + 64;
    assert_int_equal(kvq_context_new(g_model, &p, &c), KVQ_ERR_NOMEM);
    unsetenv("KVQ_MEM_LIMIT");
}

/* Sizes that overflow size_t are reported, not wrapped. */
static void test_size_overflow(void **state) {
    kvq_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = 4096, hp.n_head = 4096, hp.n_head_kv = 4096, hp.head_dim = 4096;
    hp.n_embd = 1 << 20, hp.n_ff = 1 << 22, hp.n_vocab = 1 << 24;
    kvq_mem_need need;
    assert_int_equal(kvq_mem_estimate(&hp, 1 << 30, 1 << 20, 1, KVQ_CACHE_F32, KVQ_CACHE_F32, &need), KVQ_ERR_ARG);
    assert_non_null(strstr(kvq_last_error(), "too large"));
    assert_int_equal(kvq_mem_check(&hp, 1 << 30, 512, 0, KVQ_CACHE_F32, KVQ_CACHE_F32), KVQ_ERR_NOMEM);
    hp.n_layer = 2, hp.n_head = 2, hp.n_head_kv = 1, hp.head_dim = 64, hp.n_embd = 128, hp.n_ff = 256, hp.n_vocab = 100;
    assert_int_equal(kvq_mem_estimate(&hp, 1000, 10, 0, KVQ_CACHE_F16, KVQ_CACHE_Q8, &need), KVQ_OK);
    assert_int_equal(need.kv, (size_t)2 * 1 * 1000 * (64 * 2 + 2 * 34));
}

/* The last line of s (which ends in a newline). */
static const char *last_line(const char *s) {
    size_t n = strlen(s);
    if (n && s[n - 1] == '\n') n--;
    while (n && s[n - 1] != '\n') n--;
    return s + n;
}

/* The tools end with the same message in one line (after their "loaded" line) and exit 1. */
static void test_tools(void **state) {
    char cmd[4096];
    int st;
    /* prompt longer than -c */
    snprintf(cmd, sizeof cmd,
             "%s/kvq-chat -c 16 -n 1 -p 'The jury said Friday an investigation of the recent primary election produced no evidence "
             "that any irregularities took place' 2>&1 >/dev/null",
             KVQ_TOOLS_DIR);
    char *err = tu_run(cmd, &st);
    if (st != 1 || !strstr(last_line(err), "kvq-chat: prompt is 22 tokens, the context holds 16") ||
        !strstr(last_line(err), "would fit"))
        fail_msg("exit %d: %s", st, err);
    free(err);
    /* invalid UTF-8 in the prompt is fine */
    snprintf(cmd, sizeof cmd, "%s/kvq-chat -n 2 --temp 0 -p \"$(printf 'caf\\303 \\377\\376')\" 2>/dev/null >/dev/null", KVQ_TOOLS_DIR);
    free(tu_run(cmd, &st));
    assert_int_equal(st, 0);
    /* context larger than memory */
    snprintf(cmd, sizeof cmd, "KVQ_MEM_LIMIT=32M %s/kvq-chat -c 1000000 -n 1 -p hi 2>&1 >/dev/null", KVQ_TOOLS_DIR);
    err = tu_run(cmd, &st);
    if (st != 1 || !strstr(last_line(err), "kvq-chat: context of 1000000") || !strstr(last_line(err), "would fit"))
        fail_msg("exit %d: %s", st, err);
    free(err);
    /* kvq-tokenize on a file with NUL bytes */
    char path[1024];
    snprintf(path, sizeof path, "%s/nul.txt", tu_tmpdir());
    FILE *f = fopen(path, "wb");
    fwrite("a\0b\xff", 1, 4, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/kvq-tokenize -f '%s'", KVQ_TOOLS_DIR, path);
    char *out = tu_run(cmd, &st);
    assert_int_equal(st, 0);
    assert_true(strlen(out) > 4);
    free(out);
}

/* Same shape of message from every tool: "<tool>: <file>: <problem>", with the system's reason. */
static void test_tool_messages(void **state) {
    char cmd[4096], path[1024];
    int st;
    snprintf(cmd, sizeof cmd, "%s/kvq-ppl -f /nonexistent/text.txt 2>&1 >/dev/null", KVQ_TOOLS_DIR);
    char *err = tu_run(cmd, &st);
    if (st != 1 || !strstr(err, "kvq-ppl: /nonexistent/text.txt: cannot open: No such file")) fail_msg("kvq-ppl: %s", err);
    free(err);
    snprintf(path, sizeof path, "%s/empty.txt", tu_tmpdir());
    fclose(fopen(path, "wb"));
    snprintf(cmd, sizeof cmd, "%s/kvq-ppl -f '%s' 2>&1 >/dev/null", KVQ_TOOLS_DIR, path);
    err = tu_run(cmd, &st);
    if (st != 1 || !strstr(err, "empty.txt: file is empty")) fail_msg("kvq-ppl: %s", err);
    free(err);
    snprintf(cmd, sizeof cmd, "%s/kvq-tokenize -f /nonexistent/text.txt 2>&1 >/dev/null", KVQ_TOOLS_DIR);
    err = tu_run(cmd, &st);
    if (st != 1 || !strstr(err, "kvq-tokenize: /nonexistent/text.txt: cannot read: No such file")) fail_msg("kvq-tokenize: %s", err);
    free(err);
    static const char *const tools[] = {"kvq-chat", "kvq-ppl", "kvq-tokenize", "kvq-bench"};
    for (size_t i = 0; i < sizeof tools / sizeof *tools; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s --version", KVQ_TOOLS_DIR, tools[i]);
        char *out = tu_run(cmd, &st), want[128];
        snprintf(want, sizeof want, "%s %s\n", tools[i], kvq_version());
        if (st != 0 || strcmp(out, want)) fail_msg("%s --version: exit %d, '%s'", tools[i], st, out);
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_odd_bytes),
        cmocka_unit_test(test_megabyte_prompt),
        cmocka_unit_test(test_context_vs_memory),
        cmocka_unit_test(test_size_overflow),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_tool_messages),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
