/* Tool calls in model output, per template format (kvq_chat_parse_tools), including
 * text cut short, junk, and the streaming hold-back (kvq_chat_tools_plain_prefix). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

#define DATA KVQ_SOURCE_DIR "/tests/data/chat_templates"

static kvq_chat_template *load(const char *name) {
    kvq_chat_template *t;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", DATA, name);
    if (kvq_chat_template_load(dir, NULL, &t) != KVQ_OK) fail_msg("%s: %s", name, kvq_last_error());
    return t;
}

/* Parses text; checks the count, the first call's name and arguments, and the content. */
static void expect(kvq_chat_template *t, const char *text, int n, const char *name, const char *args, const char *content) {
    kvq_tool_call *c;
    char *rest;
    int got = kvq_chat_parse_tools(t, text, &c, &rest);
    if (got != n) fail_msg("'%s': %d calls, want %d", text, got, n);
    if (n) {
        assert_string_equal(c[0].name, name);
        assert_string_equal(c[0].arguments, args);
        assert_true(strlen(c[0].id) >= 9);
    }
    assert_string_equal(rest, content);
    kvq_tool_calls_free(c, got);
    free(rest);
}

static void test_formats(void **state) {
    (void)state;
    kvq_chat_template *l = load("llama-3.1-instruct"), *m = load("mistral-7b-instruct-v0.3"), *q = load("qwen2.5-7b-instruct");
    assert_string_equal(kvq_chat_template_tools(l), "llama3-json");
    assert_string_equal(kvq_chat_template_tools(m), "mistral");
    assert_string_equal(kvq_chat_template_tools(q), "qwen");
    kvq_chat_template *plain = load("qwen2-7b-instruct");
    assert_null(kvq_chat_template_tools(plain));
    expect(plain, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", 0, NULL, NULL,
           "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");

    expect(l, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 1, "get_weather", "{\"city\":\"Paris\"}", "");
    expect(l, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}", 2, "a", "{}", "");
    expect(l, "It is sunny.", 0, NULL, NULL, "It is sunny.");
    expect(l, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par", 0, NULL, NULL,
           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par"); /* cut short: content */
    expect(l, "{\"parameters\": {}}", 0, NULL, NULL, "{\"parameters\": {}}");

    expect(m, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"id\": \"abcDEF123\"}]", 1,
           "get_weather", "{\"city\":\"Oslo\"}", "");
    expect(m, "Sure. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": [1, 2]}\"}]", 1, "f", "{\"k\":[1,2]}", "Sure.");
    expect(m, "[TOOL_CALLS] [junk]", 0, NULL, NULL, "[TOOL_CALLS] [junk]");
    expect(m, "[TOOL_CALLS] []", 0, NULL, NULL, "[TOOL_CALLS] []");
    /* the server decodes without special tokens: [TOOL_CALLS] is gone, the list remains */
    expect(m, " [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]", 1, "f", "{\"a\":1}", "");
    expect(m, "[{\"name\": \"f\", \"arguments\": {}}] and more", 0, NULL, NULL, "[{\"name\": \"f\", \"arguments\": {}}] and more");
    expect(m, "[1, 2]", 0, NULL, NULL, "[1, 2]");

    expect(q, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n"
              "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
           2, "get_weather", "{\"city\":\"Rome\"}", "Let me check.");
    expect(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", 1, "f", "{}", ""); /* stopped before the close tag */
    expect(q, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing\n</tool_call>", 0, NULL, NULL,
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing\n</tool_call>");
    expect(q, "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>", 0, NULL, NULL,
           "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>");

    /* Command-R (its tool_use template): Action: and a ```json list of tool_name / parameters */
    kvq_chat_template *cr = load("c4ai-command-r-v01");
    assert_string_equal(kvq_chat_template_tools(cr), "command-r");
    expect(cr, "I will look it up.\nAction:\n```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n"
               "        \"parameters\": {\n            \"city\": \"Oslo\"\n        }\n    },\n"
               "    {\"tool_name\": \"b\", \"parameters\": {}}\n]```",
           2, "get_weather", "{\"city\":\"Oslo\"}", "I will look it up.");
    expect(cr, "Action: [{\"tool_name\": \"f\", \"parameters\": {\"x\": 1}}]", 1, "f", "{\"x\":1}", ""); /* no fence */
    expect(cr, "Action:\n```json\n[{\"tool_name\": \"f\", \"parameters\": {}}", 0, NULL, NULL,
           "Action:\n```json\n[{\"tool_name\": \"f\", \"parameters\": {}}"); /* cut short: content */
    expect(cr, "Action:\n```json\n[{\"name\": \"f\", \"parameters\": {}}]```", 0, NULL, NULL,
           "Action:\n```json\n[{\"name\": \"f\", \"parameters\": {}}]```"); /* no tool_name */
    expect(cr, "The answer is 4.", 0, NULL, NULL, "The answer is 4.");
    assert_int_equal(kvq_chat_tools_plain_prefix(cr, "Sure. Act"), 6);
    assert_int_equal(kvq_chat_tools_plain_prefix(cr, "Sure. Actually"), 14);
    kvq_chat_template_free(cr);

    /* ids are fresh for each call */
    kvq_tool_call *c;
    char *rest;
    assert_int_equal(kvq_chat_parse_tools(l, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"a\", \"parameters\": {}}", &c, &rest), 2);
    assert_string_not_equal(c[0].id, c[1].id);
    kvq_tool_calls_free(c, 2);
    free(rest);
    kvq_chat_template_free(l);
    kvq_chat_template_free(m);
    kvq_chat_template_free(q);
    kvq_chat_template_free(plain);
}

/* Streaming: text is shown up to where a call may begin. */
static void test_plain_prefix(void **state) {
    (void)state;
    kvq_chat_template *l = load("llama-3.1-instruct"), *m = load("mistral-7b-instruct-v0.3"), *q = load("qwen2.5-7b-instruct");
    assert_int_equal(kvq_chat_tools_plain_prefix(q, "Hello <tool"), 6);
    assert_int_equal(kvq_chat_tools_plain_prefix(q, "Hello <b>"), 9);
    assert_int_equal(kvq_chat_tools_plain_prefix(q, "Hi <tool_call>{\"na"), 3);
    assert_int_equal(kvq_chat_tools_plain_prefix(m, "Ok [TOOL_"), 3);
    assert_int_equal(kvq_chat_tools_plain_prefix(m, "Ok [x]"), 6);
    assert_int_equal(kvq_chat_tools_plain_prefix(m, " [{\"na"), 0);
    assert_int_equal(kvq_chat_tools_plain_prefix(m, "["), 0);
    assert_int_equal(kvq_chat_tools_plain_prefix(m, "[1, 2]"), 6);
    assert_int_equal(kvq_chat_tools_plain_prefix(l, "  "), 0);
    assert_int_equal(kvq_chat_tools_plain_prefix(l, " {\"name"), 0);
    assert_int_equal(kvq_chat_tools_plain_prefix(l, "<|python"), 0);
    assert_int_equal(kvq_chat_tools_plain_prefix(l, "The answer"), 10);
    kvq_chat_template_free(l);
    kvq_chat_template_free(m);
    kvq_chat_template_free(q);
}

/* Tools with a template that has none, or a broken tools array, are refused. */
static void test_refused(void **state) {
    (void)state;
    kvq_chat_template *plain = load("qwen2-7b-instruct"), *q = load("qwen2.5-7b-instruct");
    kvq_chat_msg u[1] = {{.role = "user", .content = "Hi"}};
    assert_int_equal(kvq_chat_render_tools(plain, u, 1, "[]", 1, NULL, 0), -1);
    assert_non_null(strstr(kvq_last_error(), "no tool calling"));
    assert_int_equal(kvq_chat_render_tools(q, u, 1, "{\"not\": \"a list\"}", 1, NULL, 0), -1);
    kvq_chat_msg call[2] = {{.role = "user", .content = "Hi"}, {.role = "assistant", .tool_calls = "not json"}};
    assert_int_equal(kvq_chat_render_tools(q, call, 2, NULL, 1, NULL, 0), -1);
    /* OpenAI's string arguments are written as the object they hold */
    kvq_chat_msg ok[2] = {{.role = "user", .content = "Hi"},
                          {.role = "assistant", .tool_calls = "[{\"id\":\"x\",\"type\":\"function\",\"function\":"
                                                              "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]"}};
    char out[2048];
    assert_true(kvq_chat_render_tools(q, ok, 2, NULL, 0, out, sizeof out) > 0);
    assert_non_null(strstr(out, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"));
    kvq_chat_template_free(plain);
    kvq_chat_template_free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_plain_prefix),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
