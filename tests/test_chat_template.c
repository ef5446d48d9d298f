/* Chat templates: kvq's rendering of each published template kept in
 * tests/data/chat_templates/ equals, byte for byte, what Jinja renders with
 * transformers' settings (expected.json, written by tools/fixtures/render_templates.py);
 * where the template raises, kvq refuses the conversation. `kvq-tokenize --chat`
 * prints the same text (--show-text) and, for the tokenizers in the shared fixtures,
 * the ids of that text. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq.h"
#include "testutil.h"

#define DATA KVQ_SOURCE_DIR "/tests/data/chat_templates"

static cJSON *read_json(const char *path) {
    char *text = tu_read_file(path, NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) fail_msg("%s: not valid JSON", path);
    return j;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* JSON texts made for the current conversation (tool calls, tools), freed by the next call. */
static char *conv_json[17];
static int n_conv_json;

static char *json_text(const cJSON *j) {
    assert_true(n_conv_json < 17);
    return conv_json[n_conv_json++] = cJSON_PrintUnformatted(j);
}

/* The messages of the named conversation (pointers into convs). A tool conversation
 * (one with a "tools" key) sets *tools to the tools' JSON text, or NULL for null. */
static int conversation_tools(const cJSON *convs, const char *name, kvq_chat_msg *m, int cap, const cJSON **json,
                              const char **tools, int *is_tool_conv) {
    while (n_conv_json) free(conv_json[--n_conv_json]);
    const cJSON *c;
    cJSON_ArrayForEach(c, convs) {
        if (strcmp(str(c, "name"), name)) continue;
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages"), *e;
        int n = 0;
        cJSON_ArrayForEach(e, msgs) {
            assert_true(n < cap);
            const cJSON *calls = cJSON_GetObjectItemCaseSensitive(e, "tool_calls");
            m[n++] = (kvq_chat_msg){str(e, "role"), str(e, "content"), calls ? json_text(calls) : NULL, str(e, "tool_call_id")};
        }
        if (json) *json = msgs;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "tools");
        if (tools) *tools = cJSON_IsArray(t) ? json_text(t) : NULL;
        if (is_tool_conv) *is_tool_conv = t != NULL;
        return n;
    }
    fail_msg("no conversation '%s'", name);
    return -1;
}

static int conversation(const cJSON *convs, const char *name, kvq_chat_msg *m, int cap, const cJSON **json) {
    return conversation_tools(convs, name, m, cap, json, NULL, NULL);
}

/* C-escaped copy for failure messages (static buffer). */
static const char *esc(const char *s) {
    static char buf[2][4096];
    static int k;
    char *o = buf[k ^= 1], *end = o + sizeof buf[0] - 8;
    for (; s && *s && o < end; s++) {
        if (*s == '\n') *o++ = '\\', *o++ = 'n';
        else if (*s == '\t') *o++ = '\\', *o++ = 't';
        else *o++ = *s;
    }
    *o = 0;
    return buf[k];
}

static void test_render_matches_jinja(void **state) {
    (void)state;
    cJSON *convs = read_json(DATA "/conversations.json"), *cases = read_json(DATA "/expected.json");
    const cJSON *c;
    int checked = 0, bad = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *tname = str(c, "template"), *cname = str(c, "conversation"), *want = str(c, "text");
        int gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", DATA, tname);
        kvq_chat_template *t;
        if (kvq_chat_template_load(dir, NULL, &t) != KVQ_OK) fail_msg("%s: %s", tname, kvq_last_error());
        kvq_chat_msg m[16];
        const char *tools;
        int n = conversation_tools(convs, cname, m, 16, NULL, &tools, NULL);
        int len = kvq_chat_render_tools(t, m, n, tools, gen, NULL, 0);
        char *got = len >= 0 ? malloc((size_t)len + 1) : NULL;
        if (got) assert_int_equal(kvq_chat_render_tools(t, m, n, tools, gen, got, (size_t)len + 1), len);
        if (!want) { /* the template raises: kvq refuses */
            if (len >= 0) {
                print_error("%s / %s gen=%d: Jinja raises (%s), kvq renders '%s'\n", tname, cname, gen, str(c, "error"), esc(got));
                bad++;
            }
        } else if (len < 0) {
            print_error("%s / %s gen=%d: kvq refuses (%s), Jinja renders '%s'\n", tname, cname, gen, kvq_last_error(), esc(want));
            bad++;
        } else if ((size_t)len != strlen(want) || memcmp(got, want, (size_t)len)) {
            print_error("%s / %s gen=%d:\n  kvq   '%s'\n  jinja '%s'\n", tname, cname, gen, esc(got), esc(want));
            bad++;
        }
        if (got && len > 7) { /* a short buffer gets a NUL-terminated prefix and the full length */
            char small[8];
            assert_int_equal(kvq_chat_render_tools(t, m, n, tools, gen, small, sizeof small), len);
            assert_int_equal(strlen(small), 7);
        }
        free(got);
        kvq_chat_template_free(t);
        checked++;
    }
    print_message("%d renderings compared, %d differ\n", checked, bad);
    assert_true(checked >= 590);
    assert_int_equal(bad, 0);
    cJSON_Delete(convs);
    cJSON_Delete(cases);
}

/* Each published template is recognized as its family. */
static void test_published_families(void **state) {
    (void)state;
    static const char *const FAM[][2] = {
        {"llama-2-chat", "llama2"},
        {"llama-3-instruct", "llama3"},
        {"llama-3-instruct-2404", "llama3"},
        {"llama-3.1-instruct", "llama3"},
        {"mistral-7b-instruct-v0.1", "mistral"},
        {"mistral-7b-instruct-v0.1-2309", "mistral"},
        {"mixtral-8x7b-instruct-v0.1-2312", "mistral"},
        {"mistral-7b-instruct-v0.3", "mistral"},
        {"c4ai-command-r-v01", "command-r"},
        {"gemma-it", "gemma"},
        {"phi-3-mini-4k-instruct", "phi3"},
        {"phi-3-mini-128k-instruct-2404", "phi3"},
        {"phi-3.5-mini-instruct", "phi3"},
        {"phi-3-small-8k-instruct", "phi3"},
        {"qwen2-7b-instruct", "chatml"},
        {"qwen2.5-7b-instruct", "chatml"},
    };
    for (size_t i = 0; i < sizeof FAM / sizeof *FAM; i++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", DATA, FAM[i][0]);
        kvq_chat_template *t;
        if (kvq_chat_template_load(dir, NULL, &t) != KVQ_OK) fail_msg("%s: %s", FAM[i][0], kvq_last_error());
        if (strcmp(kvq_chat_template_name(t), FAM[i][1])) fail_msg("%s: recognized as %s", FAM[i][0], kvq_chat_template_name(t));
        kvq_chat_template_free(t);
    }
}

static void test_detect(void **state) {
    (void)state;
    assert_string_equal(kvq_chat_template_detect("{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}"), "llama2");
    assert_string_equal(kvq_chat_template_detect("{{ ' [INST] ' + message['content'] + ' [/INST]' }}"), "mistral");
    assert_string_equal(kvq_chat_template_detect("{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}"), "mistral");
    assert_string_equal(kvq_chat_template_detect("{{'<|im_start|>' + message['role'] + '\\n'}}"), "chatml");
    assert_string_equal(kvq_chat_template_detect("{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"), "phi3");
    assert_string_equal(kvq_chat_template_detect("{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n' }}"), "phi3");
    assert_string_equal(kvq_chat_template_detect("{{ '<start_of_turn>' + role + '\\n' }}"), "gemma");
    assert_string_equal(kvq_chat_template_detect("{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' }}"), "command-r");
    assert_string_equal(kvq_chat_template_detect("{{ '<|start_header_id|>' + message['role'] }}"), "llama3");
    assert_string_equal(kvq_chat_template_detect(NULL), "none");
    assert_null(kvq_chat_template_detect("{{ messages[0]['content'] }}"));
}

/* A directory whose tokenizer_config.json has only bos/eos (the name selects the template). */
static const char *bare_dir(const char *bos, const char *eos) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/bare", tu_tmpdir());
    mkdir(dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"bos_token\": \"%s\", \"eos_token\": {\"content\": \"%s\"}}\n", bos, eos);
    fclose(f);
    return dir;
}

static void test_roles_and_none(void **state) {
    (void)state;
    const char *dir = bare_dir("<bos>", "<eos>");
    kvq_chat_template *t;
    assert_int_equal(kvq_chat_template_load(dir, "llama2", &t), KVQ_OK);
    kvq_chat_msg two_users[2] = {{.role = "user", .content = "a"}, {.role = "user", .content = "b"}};
    assert_int_equal(kvq_chat_render(t, two_users, 2, 1, NULL, 0), -1);
    assert_non_null(strstr(kvq_last_error(), "alternate"));
    kvq_chat_template_free(t);
    /* gemma by name is the published gemma-it template: BOS, and no system role */
    assert_int_equal(kvq_chat_template_load(dir, "gemma", &t), KVQ_OK);
    kvq_chat_msg sys_user[2] = {{.role = "system", .content = "s"}, {.role = "user", .content = "u"}};
    assert_int_equal(kvq_chat_render(t, sys_user, 2, 1, NULL, 0), -1);
    assert_non_null(strstr(kvq_last_error(), "System role not supported"));
    char out[256];
    kvq_chat_render(t, sys_user + 1, 1, 1, out, sizeof out);
    assert_string_equal(out, "<bos><start_of_turn>user\nu<end_of_turn>\n<start_of_turn>model\n");
    kvq_chat_template_free(t);
    assert_int_not_equal(kvq_chat_template_load(dir, "no-such-family", &t), KVQ_OK);
    /* no template: the running text, user messages on new lines, BOS as text */
    assert_int_equal(kvq_chat_template_load(dir, NULL, &t), KVQ_OK);
    assert_string_equal(kvq_chat_template_name(t), "none");
    kvq_chat_msg run[4] = {{.role = "user", .content = "The jury said"},
                           {.role = "assistant", .content = " that the city"},
                           {.role = "user", .content = "It added"},
                           {.role = "assistant", .content = " more."}};
    kvq_chat_render(t, run, 4, 1, out, sizeof out);
    assert_string_equal(out, "<bos>The jury said that the city\nIt added more.");
    kvq_chat_template_free(t);
}

/* ---- kvq-tokenize --chat ---- */

static char *tool(const char *args, int *st) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/%s", KVQ_TOOLS_DIR, args);
    return tu_run(cmd, st);
}

/* The conversation's messages as the JSON file --chat reads; returns its path (static). */
static const char *write_conv(const cJSON *convs, const char *name) {
    static char path[1024];
    kvq_chat_msg m[16];
    const cJSON *msgs = NULL;
    conversation(convs, name, m, 16, &msgs);
    snprintf(path, sizeof path, "%s/%s.json", tu_tmpdir(), name);
    char *text = cJSON_PrintUnformatted(msgs);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    return path;
}

/* --show-text prints the Jinja rendering of every published template and conversation;
 * where the template raises, kvq-tokenize fails. */
static void test_tokenize_chat_text(void **state) {
    (void)state;
    cJSON *convs = read_json(DATA "/conversations.json"), *cases = read_json(DATA "/expected.json");
    const cJSON *c;
    int checked = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *tname = str(c, "template"), *cname = str(c, "conversation"), *want = str(c, "text");
        int gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
        kvq_chat_msg m[16];
        int tool_conv;
        conversation_tools(convs, cname, m, 16, NULL, NULL, &tool_conv);
        if (tool_conv) continue; /* --chat reads a list of messages: no tools (test_tools covers those) */
        char args[4096], conv_path[1024];
        snprintf(conv_path, sizeof conv_path, "%s", write_conv(convs, cname));
        snprintf(args, sizeof args, "kvq-tokenize -m %s/%s --chat %s --show-text%s 2>/dev/null", DATA, tname, conv_path,
                 gen ? "" : " --no-generation-prompt");
        int st;
        char *got = tool(args, &st);
        if (!want) {
            if (st == 0) fail_msg("%s / %s gen=%d: Jinja raises, kvq-tokenize printed '%s'", tname, cname, gen, esc(got));
        } else if (st != 0 || strcmp(got, want)) {
            fail_msg("%s / %s gen=%d (exit %d):\n  got  '%s'\n  want '%s'", tname, cname, gen, st, esc(got), esc(want));
        }
        free(got);
        checked++;
    }
    print_message("%d kvq-tokenize --chat --show-text runs\n", checked);
    cJSON_Delete(convs);
    cJSON_Delete(cases);
}

/* The Jinja rendering of a template for a conversation, or NULL when it raises. */
static const char *expected_text(const cJSON *cases, const char *tname, const char *cname, int gen) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        if (!strcmp(str(c, "template"), tname) && !strcmp(str(c, "conversation"), cname) &&
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")) == !!gen)
            return str(c, "text");
    }
    fail_msg("no rendering of %s / %s", tname, cname);
    return NULL;
}

/* The ids of --chat are the ids of the Jinja text (one BOS, the template's), for the
 * tokenizers in the shared fixtures: llama3's tokenizer_config.json carries the first
 * Meta-Llama-3-8B-Instruct template; the llama2 and mistral ones have none, so the
 * family name selects it (as published: Llama-2-chat's, Mistral v0.1's). */
static void test_tokenize_chat_ids(void **state) {
    (void)state;
    TU_NEED_FIXTURE(tu_fixture("tokenizers/llama3"));
    static const char *const FAM[][3] = { /* fixture tokenizer, stored template, kvq-tokenize option */
        {"tokenizers/llama2", "llama-2-chat", "--chat-template llama2"},
        {"tokenizers/llama3", "llama-3-instruct-2404", ""},
        {"tokenizers/mistral", "mistral-7b-instruct-v0.1", "--chat-template mistral"},
    };
    static const char *const CONVS[] = {"user", "multi_turn", "system_multi_turn", "spaces", "unicode", "multiline"};
    cJSON *convs = read_json(DATA "/conversations.json"), *cases = read_json(DATA "/expected.json");
    for (int fi = 0; fi < 3; fi++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", tu_fixture(FAM[fi][0]));
        for (size_t ci = 0; ci < sizeof CONVS / sizeof *CONVS; ci++) {
            for (int gen = 0; gen < 2; gen++) {
                const char *want_text = expected_text(cases, FAM[fi][1], CONVS[ci], gen);
                if (!want_text) continue;
                char args[4096], conv_path[1024], text_path[1100];
                snprintf(conv_path, sizeof conv_path, "%s", write_conv(convs, CONVS[ci]));
                snprintf(args, sizeof args, "kvq-tokenize -m %s --chat %s %s%s", dir, conv_path, FAM[fi][2],
                         gen ? "" : " --no-generation-prompt");
                int st;
                char *got = tool(args, &st);
                assert_int_equal(st, 0);
                /* the Jinja text through the plain tokenizer (no BOS added: the text has it) */
                snprintf(text_path, sizeof text_path, "%s/want.txt", tu_tmpdir());
                FILE *f = fopen(text_path, "w");
                assert_non_null(f);
                fputs(want_text, f);
                fclose(f);
                snprintf(args, sizeof args, "kvq-tokenize -m %s -f %s", dir, text_path);
                char *want = tool(args, &st);
                assert_int_equal(st, 0);
                if (strcmp(got, want)) fail_msg("%s %s gen=%d: ids '%s', want '%s'", FAM[fi][0], CONVS[ci], gen, got, want);
                /* exactly one BOS, at the start */
                const char *bos = fi == 1 ? "128000 " : "1 ";
                assert_true(!strncmp(got, bos, strlen(bos)));
                if (fi != 0) assert_null(strstr(got + 1, fi == 1 ? " 128000 " : " 1 "));
                free(got);
                free(want);
            }
        }
    }
    /* spelled out: Llama-3 special ids around a two-turn conversation */
    char args[2048];
    int st;
    snprintf(args, sizeof args, "kvq-tokenize -m %s --chat %s", tu_fixture("tokenizers/llama3"), write_conv(convs, "user_assistant"));
    char *got = tool(args, &st);
    assert_int_equal(st, 0);
    assert_string_equal(got, "128000 128006 882 128007 271 9906 128009 128006 78191 128007 271 13347 1070 128009 128006 78191 "
                             "128007 271\n");
    free(got);
    cJSON_Delete(convs);
    cJSON_Delete(cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_matches_jinja), cmocka_unit_test(test_published_families),
        cmocka_unit_test(test_detect),               cmocka_unit_test(test_roles_and_none),
        cmocka_unit_test(test_tokenize_chat_text),   cmocka_unit_test(test_tokenize_chat_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
