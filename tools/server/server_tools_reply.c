/* kvq-server: tool calls in a reply. The library finds them in the template's
 * format (kvq_chat_parse_tools); this writes them as OpenAI's tool_calls. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

int srv_tools_check(const kvq_chat_template *t, const srv_params *p, srv_error *e) {
    int tool_msgs = 0;
    for (int i = 0; i < p->n_msgs; i++)
        if (p->msgs[i].tool_calls || !strcmp(p->msgs[i].role, "tool")) tool_msgs = 1;
    if ((p->tools_json || tool_msgs) && !kvq_chat_template_tools(t))
        return srv_fail(e, 400, "unsupported_value", "this model's chat template (%s) has no tool calling; send no tools or tool messages",
                        kvq_chat_template_name(t));
    if (p->tools_json && p->json_mode) /* one grammar for "a call or this JSON" is not built */
        return srv_fail(e, 400, "unsupported_value",
                        "'response_format' with 'tools' needs tool_choice \"none\" (the reply is then JSON content)");
    if (p->tools_json && p->n > 1 && p->stream) /* the choices' stream does not hold calls back */
        return srv_fail(e, 400, "unsupported_value", "'tools' with n > 1 are not streamed; ask with stream false");
    return srv_call_check(p, e);
}

/* calls as OpenAI's tool_calls array; delta: each with its index (streamed form). */
static cJSON *calls_json(const kvq_tool_call *c, int n, int delta) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (delta) cJSON_AddNumberToObject(o, "index", i);
        cJSON_AddStringToObject(o, "id", c[i].id);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(f, "name", c[i].name);
        cJSON_AddStringToObject(f, "arguments", c[i].arguments);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

int srv_tools_reply(const kvq_chat_template *t, const char *text, cJSON *choice, int delta) {
    kvq_tool_call *calls = NULL;
    char *content = NULL;
    int n = kvq_chat_parse_tools(t, text ? text : "", &calls, &content);
    if (n <= 0) {
        free(content);
        return 0;
    }
    cJSON *m = cJSON_GetObjectItemCaseSensitive(choice, delta ? "delta" : "message");
    cJSON_DeleteItemFromObjectCaseSensitive(m, "content");
    /* streamed: the text before the call went out already; not streamed: OpenAI's null when none */
    if (!delta && content && *content) cJSON_AddStringToObject(m, "content", content);
    else if (!delta) cJSON_AddNullToObject(m, "content");
    cJSON_AddItemToObject(m, "tool_calls", calls_json(calls, n, delta));
    cJSON_ReplaceItemInObjectCaseSensitive(choice, "finish_reason", cJSON_CreateString("tool_calls"));
    kvq_tool_calls_free(calls, n);
    free(content);
    return n;
}

char *srv_tools_prefill(const kvq_chat_template *t, const srv_params *p) {
    return srv_call_prefill(kvq_chat_template_tools(t), p);
}
