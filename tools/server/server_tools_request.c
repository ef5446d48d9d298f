/* kvq-server: the tool-calling fields of a chat request (tools, tool_choice, an
 * assistant's tool_calls, a tool message's tool_call_id), checked before the
 * template sees them. cJSON only, like server_request.c (the fuzz target links both). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static int check_tool(const cJSON *t, int i, srv_error *e) {
    if (!cJSON_IsObject(t)) return srv_fail(e, 400, "invalid_type", "tools[%d] must be an object", i);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return srv_fail(e, 400, "invalid_value", "tools[%d].type must be \"function\"", i);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(f)) return srv_fail(e, 400, "missing_field", "tools[%d].function must be an object", i);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsString(name) || !*name->valuestring)
        return srv_fail(e, 400, "missing_field", "tools[%d].function.name must be a non-empty string", i);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    if (params && !cJSON_IsObject(params))
        return srv_fail(e, 400, "invalid_type", "tools[%d].function.parameters must be an object (a JSON schema)", i);
    return 0;
}

static int has_tool(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return 1;
    }
    return 0;
}

int srv_parse_tools(const cJSON *j, srv_params *p, srv_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    int n = 0;
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) return srv_fail(e, 400, "invalid_type", "'tools' must be an array");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) if (check_tool(t, n++, e)) return -1;
    }
    if (n && !p->chat) return srv_fail(e, 400, "unsupported_value", "'tools' are for /v1/chat/completions");
    p->tool_choice = SRV_TOOLS_AUTO;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (!strcmp(c, "none")) p->tool_choice = SRV_TOOLS_NONE;
        else if (!strcmp(c, "required")) p->tool_choice = SRV_TOOLS_REQUIRED;
        else if (strcmp(c, "auto"))
            return srv_fail(e, 400, "invalid_value", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
    } else if (cJSON_IsObject(choice)) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(name)) return srv_fail(e, 400, "invalid_value", "'tool_choice' needs function.name");
        if (!has_tool(tools, name->valuestring))
            return srv_fail(e, 400, "invalid_value", "'tool_choice' names '%.64s', which is not in 'tools'", name->valuestring);
        p->tool_choice = SRV_TOOLS_NAMED;
        if (!(p->tool_name = strdup(name->valuestring))) return srv_fail(e, 500, NULL, "out of memory");
    } else if (choice && !cJSON_IsNull(choice)) {
        return srv_fail(e, 400, "invalid_type", "'tool_choice' must be a string or an object");
    }
    if (p->tool_choice != SRV_TOOLS_NONE && p->tool_choice != SRV_TOOLS_AUTO && !n)
        return srv_fail(e, 400, "invalid_value", "'tool_choice' asks for a tool call but 'tools' is empty");
    /* "none": the tools stay out of the prompt, so the model is not told of them */
    if (n && p->tool_choice != SRV_TOOLS_NONE) {
        if (!(p->tools_json = cJSON_PrintUnformatted(tools))) return srv_fail(e, 500, NULL, "out of memory");
    }
    return 0;
}

int srv_parse_msg_tools(const cJSON *m, int i, const char *role, kvq_chat_msg *msg, srv_error *e) {
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    if (calls && !cJSON_IsNull(calls)) {
        if (strcmp(role, "assistant")) return srv_fail(e, 400, "invalid_value", "messages[%d]: only assistant messages carry tool_calls", i);
        if (!cJSON_IsArray(calls)) return srv_fail(e, 400, "invalid_type", "messages[%d].tool_calls must be an array", i);
        const cJSON *c;
        int k = 0;
        cJSON_ArrayForEach(c, calls) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
            if (!cJSON_IsString(name))
                return srv_fail(e, 400, "missing_field", "messages[%d].tool_calls[%d].function.name is required", i, k);
            k++;
        }
        if (!(msg->tool_calls = cJSON_PrintUnformatted(calls))) return srv_fail(e, 500, NULL, "out of memory");
    }
    if (id && !cJSON_IsNull(id)) {
        if (!cJSON_IsString(id)) return srv_fail(e, 400, "invalid_type", "messages[%d].tool_call_id must be a string", i);
        if (!(msg->tool_call_id = strdup(id->valuestring))) return srv_fail(e, 500, NULL, "out of memory");
    }
    return 0;
}
