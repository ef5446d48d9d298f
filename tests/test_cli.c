/* The command-line tools as users run them: reference outputs, --help, and bad
 * model directories (one line on stderr naming file and problem, exit 1, no crash). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static char g_stderr[4096];

/* Runs a tool from the build tree; returns stdout, fills g_stderr, sets *status. */
static char *run_tool(const char *args, int *status) {
    char errpath[512], cmd[8192];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "%s/%s 2>%s", KVQ_TOOLS_DIR, args, errpath);
    char *out = tu_run(cmd, status);
    FILE *f = fopen(errpath, "rb");
    size_t n = f ? fread(g_stderr, 1, sizeof g_stderr - 1, f) : 0;
    g_stderr[n] = 0;
    if (f) fclose(f);
    return out;
}

static cJSON *reference(const char *model) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/reference.json", model);
    const char *p = tu_fixture(rel);
    if (!p) return NULL;
    char *text = tu_read_file(p, NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

static void ids_str(const cJSON *arr, int skip, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = 0;
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++)
        if (i >= skip) o += (size_t)snprintf(buf + o, size - o, "%s%d", o ? " " : "", (int)e->valuedouble);
}

/* Single-quotes s for the shell. */
static const char *shq(const char *s, char *buf, size_t size) {
    size_t o = 0;
    buf[o++] = '\'';
    for (; *s && o + 5 < size; s++) {
        if (*s == '\'') { memcpy(buf + o, "'\\''", 4); o += 4; }
        else buf[o++] = *s;
    }
    buf[o++] = '\'';
    buf[o] = 0;
    return buf;
}

static void check_chat_model(const char *model, int check_text) {
    cJSON *ref = reference(model);
    if (!ref) { print_message("shared fixtures not found, skipping\n"); skip(); }
    const char *dir = tu_fixture("models");
    char cmd[8192], q[2048], want[4096];
    const char *prompt = cJSON_GetObjectItem(ref, "prompt")->valuestring;
    int st;
    /* text output */
    if (check_text) {
        snprintf(cmd, sizeof cmd, "kvq-chat -m %s/%s -p %s -n 24 --temp 0 -ctk f32 -ctv f32 --verbose-prompt", dir, model, shq(prompt, q, sizeof q));
        char *out = run_tool(cmd, &st);
        assert_int_equal(st, 0);
        /* the prompt, then the continuation with its leading space intact */
        snprintf(want, sizeof want, "%s %s\n", prompt, cJSON_GetObjectItem(ref, "greedy_text")->valuestring);
        if (strcmp(out, want) != 0) fail_msg("%s: printed '%s', want '%s'", model, out, want);
        free(out);
        char ids[2048];
        ids_str(cJSON_GetObjectItem(ref, "prompt_ids"), 0, ids, sizeof ids);
        if (!strstr(g_stderr, ids)) fail_msg("%s: prompt ids '%s' not in stderr '%s'", model, ids, g_stderr);
        if (!strstr(g_stderr, "KV cache")) fail_msg("%s: no KV cache stats on stderr", model);
        /* --no-display-prompt: the continuation alone, as HF decodes the generated ids */
        snprintf(cmd, sizeof cmd, "kvq-chat -m %s/%s -p %s -n 24 --temp 0 -ctk f32 -ctv f32 --no-display-prompt", dir, model, shq(prompt, q, sizeof q));
        char *out2 = run_tool(cmd, &st);
        assert_int_equal(st, 0);
        snprintf(want, sizeof want, "%s\n", cJSON_GetObjectItem(ref, "greedy_text")->valuestring);
        if (strcmp(out2, want) != 0) fail_msg("%s --no-display-prompt: printed '%s', want '%s'", model, out2, want);
        free(out2);
    }
    /* ids output; the random-weight fixtures (no text check) on the fp16 codebooks: their greedy
     * margins are below what 1x16's default int8 codewords move (test_model's test_i8) */
    snprintf(cmd, sizeof cmd, "kvq-chat -m %s/%s -p %s -n 24 --temp 0 -ctk f32 -ctv f32 --ids%s", dir, model,
             shq(prompt, q, sizeof q), check_text ? "" : " --no-aqlm-i8");
    char *out = run_tool(cmd, &st);
    assert_int_equal(st, 0);
    ids_str(cJSON_GetObjectItem(ref, "greedy_ids"), 0, want, sizeof want);
    strcat(want, "\n");
    if (strcmp(out, want) != 0) fail_msg("%s: --ids printed '%s', want '%s'", model, out, want);
    free(out);
    /* the tokenizer tool gives the prompt ids (without BOS) */
    snprintf(cmd, sizeof cmd, "kvq-tokenize -m %s/%s -p %s", dir, model, shq(prompt, q, sizeof q));
    out = run_tool(cmd, &st);
    assert_int_equal(st, 0);
    ids_str(cJSON_GetObjectItem(ref, "prompt_ids"), 1, want, sizeof want);
    strcat(want, "\n");
    if (strcmp(out, want) != 0) fail_msg("%s: kvq-tokenize printed '%s', want '%s'", model, out, want);
    free(out);
    cJSON_Delete(ref);
}

static void test_chat_brown_2x8(void **s) { check_chat_model("brown-llama-aqlm-2x8", 1); }
static void test_chat_brown_1x16(void **s) { check_chat_model("brown-llama-aqlm-1x16", 1); }
static void test_chat_brown_fp16(void **s) { check_chat_model("brown-llama-fp16", 1); }
static void test_chat_llama3(void **s) { check_chat_model("llama3-tiny-aqlm-1x16g16", 0); }
static void test_chat_mistral(void **s) { check_chat_model("mistral-tiny-aqlm-2x8", 0); }

/* kvq-chat on each family's fixture: the prompt it feeds is the family's published chat
 * template around the user's text (the ids kvq-tokenize --chat gives), and the greedy reply
 * is the same on the CPU and on Vulkan (when a Vulkan device starts); the CPU on the fp16
 * codebooks the shaders read (--no-aqlm-i8; Vulkan ignores it). */
static void test_chat_families(void **state) {
    static const char *fams[] = {"mixtral-tiny-aqlm-1x16", "command-r-tiny-aqlm-1x16", "gemma-tiny-aqlm-2x8",
                                 "phi3-tiny-aqlm-1x16g8", "qwen2-tiny-aqlm-2x8"};
    char conv[512], cmd[8192];
    snprintf(conv, sizeof conv, "%s/conv.json", tu_tmpdir());
    FILE *f = fopen(conv, "w");
    assert_non_null(f);
    fputs("[{\"role\": \"user\", \"content\": \"Where is the jury?\"}]", f);
    fclose(f);
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        char dir[4096], cpu[4096];
        snprintf(dir, sizeof dir, "%s/tests/data/models/%s", KVQ_SOURCE_DIR, fams[i]);
        int st;
        snprintf(cmd, sizeof cmd, "kvq-tokenize -m %s --chat %s", dir, conv);
        char *ids = run_tool(cmd, &st);
        assert_int_equal(st, 0);
        ids[strcspn(ids, "\n")] = 0;
        const char *backends[2] = {"cpu", "vulkan"};
        for (int b = 0; b < 2; b++) {
            snprintf(cmd, sizeof cmd, "kvq-chat -m %s -p 'Where is the jury?' --chat --verbose-prompt --ids -n 6 --temp 0 --ignore-eos --no-aqlm-i8 --backend %s",
                     dir, backends[b]);
            char *out = run_tool(cmd, &st);
            if (b == 1 && st != 0 && strstr(g_stderr, "vulkan")) {
                print_message("%s: no Vulkan device here (%s)\n", fams[i], g_stderr);
                free(out);
                break;
            }
            if (st != 0) fail_msg("%s on %s: exit %d: %s", fams[i], backends[b], st, g_stderr);
            if (!strstr(g_stderr, ids)) fail_msg("%s on %s: prompt ids are not the template's '%s': %s", fams[i], backends[b], ids, g_stderr);
            if (b == 0) snprintf(cpu, sizeof cpu, "%s", out);
            else if (strcmp(out, cpu) != 0) fail_msg("%s: vulkan replied '%s', cpu '%s'", fams[i], out, cpu);
            free(out);
        }
        print_message("%s: chat prompt ids %s\n", fams[i], ids);
        free(ids);
    }
}

static void test_logits_out(void **state) {
    const char *dir = tu_fixture("models/brown-llama-aqlm-2x8");
    TU_NEED_FIXTURE(dir);
    char cmd[4096], path[512], refp[4096];
    snprintf(path, sizeof path, "%s/logits.f32", tu_tmpdir());
    snprintf(refp, sizeof refp, "%s/reference-logits.f32", dir);
    snprintf(cmd, sizeof cmd, "kvq-chat -m %s -p 'The jury said that the city' -n 1 --temp 0 -ctk f32 -ctv f32 --logits-out %s", dir, path);
    int st;
    free(run_tool(cmd, &st));
    assert_int_equal(st, 0);
    size_t n1, n2;
    float *a = (float *)tu_read_file(path, &n1), *b = (float *)tu_read_file(refp, &n2);
    assert_int_equal(n1, n2);
    assert_true(tu_rel_l2(a, b, n1 / 4) < 1e-3);
    free(a);
    free(b);
}

static void test_demo_default(void **state) {
    int st;
    char *out = run_tool("kvq-chat -p 'The jury said' -n 8 --temp 0", &st);
    if (st != 0) fail_msg("demo run failed: %s", g_stderr);
    assert_true(strlen(out) > 8 + strlen("The jury said"));
    assert_true(!strncmp(out, "The jury said", 13));
    free(out);
}

static void test_help(void **state) {
    const char *tools[] = {"kvq-chat", "kvq-ppl", "kvq-bench", "kvq-tokenize"};
    for (int i = 0; i < 4; i++) {
        char cmd[256];
        int st;
        snprintf(cmd, sizeof cmd, "%s --help", tools[i]);
        char *out = run_tool(cmd, &st);
        if (st != 0 || !strstr(out, "usage")) fail_msg("%s --help: status %d, output '%s'", tools[i], st, out);
        free(out);
        snprintf(cmd, sizeof cmd, "%s --no-such-flag", tools[i]);
        free(run_tool(cmd, &st));
        assert_int_equal(st, 1);
    }
}

/* ---- bad model directories ---- */

static void copy_file(const char *src, const char *dst, long max_bytes) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[1 << 16];
    size_t n;
    long total = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (max_bytes >= 0 && total + (long)n > max_bytes) n = (size_t)(max_bytes - total);
        fwrite(buf, 1, n, out);
        total += (long)n;
        if (max_bytes >= 0 && total >= max_bytes) break;
    }
    fclose(in);
    fclose(out);
}

/* Makes tmp/<name> from the mistral fixture: tokenizer files copied, weights truncated
 * to `weights_bytes` (-1 all, -2 absent), config edited by `edit`. */
static const char *bad_dir(const char *name, long weights_bytes, void (*edit)(cJSON *)) {
    static char dir[1024];
    const char *src = tu_fixture("models/mistral-tiny-aqlm-2x8");
    if (!src) return NULL;
    char s[2048], d[2048], srcc[1024];
    snprintf(srcc, sizeof srcc, "%s", src);
    snprintf(dir, sizeof dir, "%s/%s", tu_tmpdir(), name);
    mkdir(dir, 0755);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(s, sizeof s, "%s/%s", srcc, files[i]);
        snprintf(d, sizeof d, "%s/%s", dir, files[i]);
        copy_file(s, d, -1);
    }
    if (weights_bytes != -2) {
        snprintf(s, sizeof s, "%s/model.safetensors", srcc);
        snprintf(d, sizeof d, "%s/model.safetensors", dir);
        copy_file(s, d, weights_bytes);
    }
    snprintf(s, sizeof s, "%s/config.json", srcc);
    char *text = tu_read_file(s, NULL);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    if (edit) edit(cfg);
    char *out = cJSON_Print(cfg);
    snprintf(d, sizeof d, "%s/config.json", dir);
    FILE *f = fopen(d, "wb");
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(cfg);
    return dir;
}

static void expect_clean_error(const char *dir, const char *file, const char *needle) {
    char cmd[4096];
    int st;
    snprintf(cmd, sizeof cmd, "kvq-chat -m %s -p hello -n 2", dir);
    char *out = run_tool(cmd, &st);
    free(out);
    int lines = 0;
    for (const char *p = g_stderr; *p; p++) lines += *p == '\n';
    if (st != 1 || lines != 1 || !strstr(g_stderr, file) || !strstr(g_stderr, needle))
        fail_msg("dir %s: exit %d, stderr '%s' (want one line naming '%s' and '%s')", dir, st, g_stderr, file, needle);
}

static void edit_quant(cJSON *c) {
    cJSON *q = cJSON_GetObjectItem(c, "quantization_config");
    cJSON_ReplaceItemInObject(q, "quant_method", cJSON_CreateString("hqq"));
}
static void edit_shape(cJSON *c) { cJSON_ReplaceItemInObject(c, "intermediate_size", cJSON_CreateNumber(320)); }
static void edit_arch(cJSON *c) { cJSON_DeleteItemFromObject(c, "hidden_size"); }

static void test_bad_models(void **state) {
    const char *d = bad_dir("missing", -2, NULL);
    TU_NEED_FIXTURE(d);
    expect_clean_error(d, "model.safetensors", "missing");
    expect_clean_error(bad_dir("truncated", 8 << 20, NULL), "model.safetensors", "past the end");
    expect_clean_error(bad_dir("tiny", 100, NULL), "model.safetensors", "header length");
    expect_clean_error(bad_dir("past-eof", 16608672 - 10, NULL), "model.safetensors", "past the end");
    expect_clean_error(bad_dir("shape", -1, edit_shape), "model.safetensors", "config.json implies");
    expect_clean_error(bad_dir("quant", -1, edit_quant), "config.json", "quant_method 'hqq'");
    expect_clean_error(bad_dir("nohidden", -1, edit_arch), "config.json", "hidden_size");
    char cmd[2048];
    int st;
    snprintf(cmd, sizeof cmd, "kvq-chat -m %s/does-not-exist -p hi", tu_tmpdir());
    free(run_tool(cmd, &st));
    assert_int_equal(st, 1);
    assert_non_null(strstr(g_stderr, "does-not-exist"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),           cmocka_unit_test(test_demo_default),   cmocka_unit_test(test_chat_brown_2x8), cmocka_unit_test(test_chat_families),
        cmocka_unit_test(test_chat_brown_1x16), cmocka_unit_test(test_chat_brown_fp16), cmocka_unit_test(test_chat_llama3),
        cmocka_unit_test(test_chat_mistral),   cmocka_unit_test(test_logits_out),     cmocka_unit_test(test_bad_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
