/* Forced tool calls under the grammar (tools/server/server_tools_grammar.c) without a model:
 * random logits over the demo vocabulary stand for a model that knows nothing of tools. For
 * Llama-3.1's, Mistral v0.3's, Qwen2.5's and Command-R's formats, tool_choice "required" (two tools) and a
 * named function, at temperatures 0 (greedy on random logits), 1.0 and 1.5: the prefill plus
 * the written tokens must parse (kvq_chat_parse_tools) into one call to an allowed tool whose
 * arguments are accepted whole by a fresh byte-level matcher of its parameters schema and
 * hold its required keys (checked with cJSON here). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

/* the server files under test, built into this test (they need srv_fail, defined below) */
#include "../tools/server/server_tools_grammar.c"
#include "../tools/server/server_tools_reply.c"

int srv_fail(srv_error *e, int status, const char *code, const char *fmt, ...) {
    e->status = status;
    e->code = code;
    snprintf(e->message, sizeof e->message, "%s", fmt);
    return -1;
}

#define DATA KVQ_SOURCE_DIR "/tests/data/chat_templates"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"maxLength\":12},\"unit\":{\"enum\":[\"C\",\"F\"]}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"plan_trip\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":30},\"stops\":{\"type\":\"array\",\"maxItems\":2,\"items\":{\"type\":\"object\","
    "\"properties\":{\"place\":{\"type\":\"string\",\"maxLength\":8}},\"required\":[\"place\"]}},"
    "\"flags\":{\"type\":\"object\",\"properties\":{\"pets\":{\"type\":\"boolean\"}},\"required\":[\"pets\"]}},"
    "\"required\":[\"days\",\"stops\",\"flags\"]}}}]";

static uint64_t rng = 88172645463325252ull;
static float urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 16777216.0f;
}

/* The arguments hold to the function's schema: a fresh matcher takes them whole, complete. */
static void check_args(const cJSON *tools, const char *name, const char *args, const char *text) {
    const cJSON *f = tool_named(tools, name);
    if (!f) fail_msg("call to an unknown tool '%s': %s", name, text);
    char *schema = params_text(f);
    kvq_json_constraint *c = kvq_json_constraint_new(NULL, schema, 0, NULL, 0);
    assert_non_null(c);
    if (kvq_json_constraint_feed(c, args, strlen(args)) || !kvq_json_constraint_complete(c))
        fail_msg("arguments do not follow %s's schema: %s (reply %s)", name, args, text);
    cJSON *a = cJSON_Parse(args), *s = cJSON_Parse(schema), *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(s, "required")) {
        if (!cJSON_GetObjectItemCaseSensitive(a, r->valuestring)) fail_msg("'%s' missing: %s", r->valuestring, args);
    }
    cJSON_Delete(a);
    cJSON_Delete(s);
    free(schema);
    kvq_json_constraint_free(c);
}

static void run(const kvq_tokenizer *tok, const char *tmpl_name, int choice, float temp, uint64_t seed) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", DATA, tmpl_name);
    kvq_chat_template *t;
    assert_int_equal(kvq_chat_template_load(dir, NULL, &t), KVQ_OK);
    srv_params p = {0};
    p.chat = 1;
    p.tools_json = (char *)TOOLS;
    p.tool_choice = choice;
    p.tool_name = choice == SRV_TOOLS_NAMED ? "plan_trip" : NULL;
    p.tools_fmt = kvq_chat_template_tools(t);
    srv_error e = {0};
    assert_int_equal(srv_call_check(&p, &e), 0);
    srv_call *call = srv_call_new(tok, &p, &e);
    if (!call) fail_msg("%s: %s", tmpl_name, e.message);
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = temp;
    sp.seed = seed;
    kvq_sampler *s = kvq_sampler_new(&sp);
    int n = kvq_vocab_size(tok), nid = 0;
    float *lg = malloc(sizeof *lg * (size_t)n);
    int32_t ids[1200];
    while (!srv_call_done(call) && nid < 1200) {
        for (int i = 0; i < n; i++) lg[i] = urand() * 8.0f;
        int32_t id = srv_call_sample(call, s, lg, n);
        assert_true(id >= 0 && !kvq_token_is_eog(tok, id));
        kvq_sampler_accept(s, id);
        srv_call_accept(call, id);
        ids[nid++] = id;
    }
    assert_true(srv_call_done(call));
    char *pre = srv_tools_prefill(t, &p), text[32768];
    size_t k = strlen(pre);
    memcpy(text, pre, k);
    assert_true(kvq_detokenize(tok, ids, nid, 1, text + k, sizeof text - k) < (int)(sizeof text - k));
    kvq_tool_call *calls;
    char *content;
    int got = kvq_chat_parse_tools(t, text, &calls, &content);
    if (getenv("KVQ_TEST_SHOW")) fprintf(stderr, "%s t=%.1f: %s\n", tmpl_name, temp, text);
    if (got != 1) fail_msg("%s t=%.1f: %d calls in %s", tmpl_name, temp, got, text);
    if (choice == SRV_TOOLS_NAMED) assert_string_equal(calls[0].name, "plan_trip");
    cJSON *tools = cJSON_Parse(TOOLS);
    check_args(tools, calls[0].name, calls[0].arguments, text);
    cJSON_Delete(tools);
    kvq_tool_calls_free(calls, got);
    free(content);
    free(pre);
    free(lg);
    kvq_sampler_free(s);
    srv_call_free(call);
    kvq_chat_template_free(t);
}

static void test_forced_calls(void **st) {
    (void)st;
    kvq_tokenizer *tok = NULL;
    assert_int_equal(kvq_tokenizer_load(KVQ_SOURCE_DIR "/models/demo", &tok), KVQ_OK);
    static const char *tmpl[] = {"llama-3.1-instruct", "mistral-7b-instruct-v0.3", "qwen2.5-7b-instruct", "c4ai-command-r-v01"};
    static const float temps[] = {0.0f, 1.0f, 1.5f};
    for (int f = 0; f < 4; f++)
        for (int ti = 0; ti < 3; ti++)
            for (uint64_t seed = 1; seed <= 4; seed++) {
                run(tok, tmpl[f], SRV_TOOLS_REQUIRED, temps[ti], seed);
                run(tok, tmpl[f], SRV_TOOLS_NAMED, temps[ti], seed);
            }
    kvq_tokenizer_free(tok);
}

/* "required" with one tool names it in the prefill; a schema the grammar cannot take is a 400. */
static void test_prefill_and_check(void **st) {
    (void)st;
    kvq_chat_template *t;
    assert_int_equal(kvq_chat_template_load(DATA "/qwen2.5-7b-instruct", NULL, &t), KVQ_OK);
    srv_params p = {0};
    p.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"only\"}}]";
    p.tool_choice = SRV_TOOLS_REQUIRED;
    char *pre = srv_tools_prefill(t, &p);
    assert_string_equal(pre, "<tool_call>\n{\"name\": \"only\", \"arguments\": ");
    free(pre);
    p.tools_json = (char *)TOOLS;
    pre = srv_tools_prefill(t, &p);
    assert_string_equal(pre, "<tool_call>\n{\"name\": ");
    free(pre);
    srv_error e = {0};
    p.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
                   "{\"x\":{\"type\":\"string\",\"pattern\":\"(\"}}}}}]";
    assert_int_equal(srv_call_check(&p, &e), -1);
    assert_int_equal(e.status, 400);
    p.tool_choice = SRV_TOOLS_AUTO; /* not forced: the schema is not needed */
    assert_int_equal(srv_call_check(&p, &e), 0);
    kvq_chat_template_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forced_calls),
        cmocka_unit_test(test_prefill_and_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
