/* Conversations with tools, rendered as the published templates with tool branches do
 * (tests/data/chat_templates: llama-3.1-instruct, mistral-7b-instruct-v0.3,
 * qwen2.5-7b-instruct). The tools and each message's tool_calls come as JSON text
 * (OpenAI's shapes); where a template writes them with tojson they are printed as
 * Python's json.dumps would (chat_json.c). OpenAI sends function.arguments as a JSON
 * string while the templates expect the object: a string that parses is used as the
 * object, as transformers' callers do. */
#include <cjson/cJSON.h>
#include <string.h>

#include "chat_json.h"
#include "chat_tools.h"
#include "util.h"

static int is(const kvq_chat_msg *m, const char *role) { return m->role && !strcmp(m->role, role); }

static int refuse(const char *msg) {
    kvq_fail(KVQ_ERR_ARG, "chat template: %s", msg);
    return -1;
}

static const char *text_of(const kvq_chat_msg *m) { return m->content ? m->content : ""; }

int chat_has_tool_msgs(const kvq_chat_msg *m, int n) {
    for (int i = 0; i < n; i++)
        if (m[i].tool_calls || is(&m[i], "tool")) return 1;
    return 0;
}

/* Appends v as tojson writes it; 0, or -1 when out of memory. */
static int put_json(sbuf *b, const cJSON *v, int indent) {
    char *s = chat_json_dump(v, indent);
    if (!s) return b->oom = 1, -1;
    puts_(b, s);
    free(s);
    return 0;
}

/* A message's tool_calls, with string arguments replaced by the object they hold. */
static cJSON *parse_calls(const kvq_chat_msg *m) {
    cJSON *a = cJSON_Parse(m->tool_calls);
    if (!cJSON_IsArray(a)) {
        cJSON_Delete(a);
        refuse("an assistant message's tool_calls is not a JSON array");
        return NULL;
    }
    cJSON *c;
    cJSON_ArrayForEach(c, a) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsString(args)) continue;
        cJSON *o = cJSON_Parse(args->valuestring);
        if (o) cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", o);
    }
    return a;
}

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Jinja's length of a string: code points. */
static size_t chars(const char *s) {
    size_t k = 0;
    for (; *s; s++) k += ((unsigned char)*s & 0xc0) != 0x80;
    return k;
}

/* ---- Llama 3.1 / 3.2 (tools_in_user_message, the default) ---- */

static void header(sbuf *b, const char *role) {
    puts_(b, "<|start_header_id|>");
    puts_(b, role);
    puts_(b, "<|end_header_id|>\n\n");
}

static int render_llama(const chat_tool_tmpl *t, const kvq_chat_msg *m, int n, const cJSON *tools, int gen, sbuf *b) {
    puts_(b, t->bos);
    header(b, "system");
    if (tools) puts_(b, "Environment: ipython\n");
    puts_(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    puts_(b, t->date);
    puts_(b, "\n\n");
    if (n && is(&m[0], "system")) put_strip(b, text_of(&m[0])), m++, n--;
    puts_(b, "<|eot_id|>");
    if (tools) { /* the first message after the system one carries the tools */
        if (!n) return refuse("Cannot put tools in the first user message when there's no first user message!");
        header(b, "user");
        puts_(b, "Given the following functions, please respond with a JSON for a function call "
                 "with its proper arguments that best answers the given prompt.\n\n"
                 "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}."
                 "Do not use variables.\n\n");
        const cJSON *tool;
        cJSON_ArrayForEach(tool, tools) {
            if (put_json(b, tool, 4)) return -1;
            puts_(b, "\n\n");
        }
        put_strip(b, text_of(&m[0]));
        puts_(b, "<|eot_id|>");
        m++, n--;
    }
    for (int i = 0; i < n; i++) {
        if (m[i].tool_calls) {
            cJSON *calls = parse_calls(&m[i]);
            if (!calls) return -1;
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "function");
            const char *name = str_of(f, "name");
            int r = 0;
            if (cJSON_GetArraySize(calls) != 1) r = refuse("This model only supports single tool-calls at once!");
            else if (!name) r = refuse("a tool call has no function name");
            else {
                header(b, "assistant");
                puts_(b, "{\"name\": \"");
                puts_(b, name);
                puts_(b, "\", \"parameters\": ");
                r = put_json(b, cJSON_GetObjectItemCaseSensitive(f, "arguments"), -1);
                puts_(b, "}<|eot_id|>");
            }
            cJSON_Delete(calls);
            if (r) return -1;
        } else if (is(&m[i], "tool") || is(&m[i], "ipython")) {
            /* a string is iterable to Jinja: the result is written as a JSON string */
            header(b, "ipython");
            char *q = chat_json_quote(text_of(&m[i]));
            if (!q) return b->oom = 1, -1;
            puts_(b, q);
            free(q);
            puts_(b, "<|eot_id|>");
        } else {
            header(b, m[i].role);
            put_strip(b, text_of(&m[i]));
            puts_(b, "<|eot_id|>");
        }
    }
    if (gen) header(b, "assistant");
    return 0;
}

/* ---- Mistral v0.3 ---- */

#define MISTRAL_ALTERNATE "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
#define MISTRAL_IDS "Tool call IDs should be alphanumeric strings with length 9!"

/* [AVAILABLE_TOOLS]: each tool's function, its string values written without escaping. */
static int mistral_tools(const cJSON *tools, sbuf *b) {
    puts_(b, "[AVAILABLE_TOOLS] [");
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
        if (!cJSON_IsObject(f)) return refuse("a tool has no function object");
        puts_(b, "{\"type\": \"function\", \"function\": {");
        int first = 1;
        for (const cJSON *kv = f->child; kv; kv = kv->next) {
            if (!strcmp(kv->string, "return")) continue;
            if (!first) puts_(b, ", ");
            first = 0;
            puts_(b, "\"");
            puts_(b, kv->string);
            if (cJSON_IsString(kv)) {
                puts_(b, "\": \"");
                puts_(b, kv->valuestring);
                puts_(b, "\"");
            } else {
                puts_(b, "\": ");
                if (put_json(b, kv, -1)) return -1;
            }
        }
        puts_(b, "}}");
        puts_(b, tool->next ? ", " : "]");
    }
    puts_(b, "[/AVAILABLE_TOOLS]");
    return 0;
}

static int mistral_calls(const chat_tool_tmpl *t, const kvq_chat_msg *m, sbuf *b) {
    cJSON *calls = parse_calls(m);
    if (!calls) return -1;
    puts_(b, "[TOOL_CALLS] [");
    int r = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        char *out = chat_json_dump(cJSON_GetObjectItemCaseSensitive(c, "function"), -1);
        if (!out) {
            r = b->oom = 1;
            break;
        }
        put(b, out, strlen(out) - 1); /* out[:-1]: the id goes inside */
        free(out);
        const char *id = str_of(c, "id");
        if (!id || chars(id) != 9) {
            r = refuse(MISTRAL_IDS);
            break;
        }
        puts_(b, ", \"id\": \"");
        puts_(b, id);
        puts_(b, "\"}");
        if (c->next) puts_(b, ", ");
        else puts_(b, "]"), puts_(b, t->eos);
    }
    cJSON_Delete(calls);
    return r ? -1 : 0;
}

static int same_user(const kvq_chat_msg *a, const kvq_chat_msg *b) {
    return !strcmp(text_of(a), text_of(b)) && !a->tool_calls && !b->tool_calls && !a->tool_call_id && !b->tool_call_id;
}

static int render_mistral(const chat_tool_tmpl *t, const kvq_chat_msg *m, int n, const cJSON *tools, sbuf *b) {
    const char *sys = NULL;
    if (n && is(&m[0], "system")) sys = text_of(&m[0]), m++, n--;
    int k = 0, last_user = -1;
    for (int i = 0; i < n; i++) { /* alternation, skipping tool calls and results */
        if (is(&m[i], "user")) last_user = i;
        if (is(&m[i], "tool") || is(&m[i], "tool_results") || m[i].tool_calls) continue;
        if (is(&m[i], "user") != (k++ % 2 == 0)) return refuse(MISTRAL_ALTERNATE);
    }
    puts_(b, t->bos);
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "user")) {
            /* the template compares messages by value: an equal earlier one gets the tools too */
            if (tools && same_user(&m[i], &m[last_user]) && mistral_tools(tools, b)) return -1;
            puts_(b, "[INST] ");
            if (sys && i == n - 1) {
                puts_(b, sys);
                puts_(b, "\n\n");
            }
            puts_(b, text_of(&m[i]));
            puts_(b, "[/INST]");
        } else if (m[i].tool_calls) {
            if (mistral_calls(t, &m[i], b)) return -1;
        } else if (is(&m[i], "assistant")) {
            puts_(b, " ");
            put_strip(b, text_of(&m[i]));
            puts_(b, t->eos);
        } else if (is(&m[i], "tool") || is(&m[i], "tool_results")) {
            puts_(b, "[TOOL_RESULTS] {\"content\": ");
            puts_(b, text_of(&m[i])); /* content|string: as it is, not quoted */
            puts_(b, ", ");
            if (!m[i].tool_call_id || chars(m[i].tool_call_id) != 9) return refuse(MISTRAL_IDS);
            puts_(b, "\"call_id\": \"");
            puts_(b, m[i].tool_call_id);
            puts_(b, "\"}[/TOOL_RESULTS]");
        } else {
            return refuse("Only user and assistant roles are supported, with the exception of an initial optional system message!");
        }
    }
    return 0;
}

/* ---- Qwen2.5 ---- */

static int render_qwen(const chat_tool_tmpl *t, const kvq_chat_msg *m, int n, const cJSON *tools, int gen, sbuf *b) {
    if (!n) return refuse("'list object' has no attribute '0' (the template reads the first message)");
    int sys = is(&m[0], "system");
    if (tools && cJSON_GetArraySize(tools) > 0) {
        puts_(b, "<|im_start|>system\n");
        puts_(b, sys ? text_of(&m[0]) : t->default_sys);
        puts_(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        const cJSON *tool;
        cJSON_ArrayForEach(tool, tools) {
            puts_(b, "\n");
            if (put_json(b, tool, -1)) return -1;
        }
        puts_(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                 "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
                 "<args-json-object>}}\n</tool_call><|im_end|>\n");
    } else {
        puts_(b, "<|im_start|>system\n");
        puts_(b, sys ? text_of(&m[0]) : t->default_sys);
        puts_(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        cJSON *calls = NULL;
        if (is(&m[i], "assistant") && m[i].tool_calls) {
            if (!(calls = parse_calls(&m[i]))) return -1;
            if (!calls->child) cJSON_Delete(calls), calls = NULL; /* an empty list is false */
        }
        if (is(&m[i], "user") || (is(&m[i], "system") && i) || (is(&m[i], "assistant") && !calls)) {
            puts_(b, "<|im_start|>");
            puts_(b, m[i].role);
            puts_(b, "\n");
            puts_(b, text_of(&m[i]));
            puts_(b, "<|im_end|>\n");
        } else if (calls) {
            puts_(b, "<|im_start|>assistant");
            if (*text_of(&m[i])) {
                puts_(b, "\n");
                puts_(b, text_of(&m[i]));
            }
            const cJSON *c;
            int r = 0;
            cJSON_ArrayForEach(c, calls) {
                const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
                if (!f) f = c;
                const char *name = str_of(f, "name");
                if (!name) {
                    r = refuse("a tool call has no function name");
                    break;
                }
                puts_(b, "\n<tool_call>\n{\"name\": \"");
                puts_(b, name);
                puts_(b, "\", \"arguments\": ");
                if ((r = put_json(b, cJSON_GetObjectItemCaseSensitive(f, "arguments"), -1))) break;
                puts_(b, "}\n</tool_call>");
            }
            cJSON_Delete(calls);
            if (r) return -1;
            puts_(b, "<|im_end|>\n");
        } else if (is(&m[i], "tool")) {
            if (i == 0 || !is(&m[i - 1], "tool")) puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            puts_(b, text_of(&m[i]));
            puts_(b, "\n</tool_response>");
            if (i == n - 1 || !is(&m[i + 1], "tool")) puts_(b, "<|im_end|>\n");
        } /* other roles: nothing */
    }
    if (gen) puts_(b, "<|im_start|>assistant\n");
    return 0;
}

int chat_render_tools(const chat_tool_tmpl *t, const kvq_chat_msg *m, int n, const char *tools_json, int gen, sbuf *b) {
    if (t->fmt == TOOLS_NONE) return refuse("this model's chat template has no tool calling");
    cJSON *tools = NULL;
    if (tools_json) {
        tools = cJSON_Parse(tools_json);
        if (!cJSON_IsArray(tools)) {
            cJSON_Delete(tools);
            return refuse("tools is not a JSON array");
        }
    }
    int r = t->fmt == TOOLS_LLAMA3    ? render_llama(t, m, n, tools, gen, b)
            : t->fmt == TOOLS_MISTRAL ? render_mistral(t, m, n, tools, b)
            : t->fmt == TOOLS_COMMAND_R ? chat_render_command_r_tools(t, m, n, tools, gen, b)
                                      : render_qwen(t, m, n, tools, gen, b);
    cJSON_Delete(tools);
    return r;
}
