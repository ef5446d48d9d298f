/* Command-R's tool_use template (c4ai-command-r-v01, the revision taking OpenAI-style tools;
 * tests/data/chat_templates/c4ai-command-r-v01, SOURCES.md), byte for byte as Jinja renders it:
 * a fixed preamble, each tool as a Python signature with an Args docstring (JSON schema types
 * as Python ones), assistant calls as `Action:` and a ```json list, tool results in <results>,
 * then the instruction to answer with an Action. Where Jinja raises (a property without a
 * description, a type it cannot map, which makes its macro recurse forever) this refuses. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "chat_json.h"
#include "chat_tools.h"
#include "util.h"

#define SOT "<|START_OF_TURN_TOKEN|>"
#define EOT "<|END_OF_TURN_TOKEN|>"

static const char PREAMBLE[] =
    "# Safety Preamble\nThe instructions in this section override those in the task description and style guide "
    "sections. Don't answer questions that are harmful or immoral.\n\n# System Preamble\n## Basic Rules\nYou are a "
    "powerful conversational AI trained by Cohere to help people. You are augmented by a number of tools, and your job "
    "is to use and consume the output of these tools to best help the user. You will see a conversation history between "
    "yourself and a user, ending with an utterance from the user. You will then see a specific instruction instructing "
    "you what kind of response to generate. When you answer the user's requests, you cite your sources in your answers, "
    "according to those instructions.\n\n# User Preamble\n";

static const char DEFAULT_SYSTEM[] =
    "## Task and Context\nYou help people answer their questions and other requests interactively. You will be asked a "
    "very wide array of requests on all kinds of topics. You will be equipped with a wide range of search engines or "
    "similar tools to help you, which you use to research your answer. You should focus on serving the user's needs as "
    "best you can, which will be wide-ranging.\n\n## Style Guide\nUnless the user asks for a different style of answer, "
    "you should answer in full sentences, using proper grammar and spelling.";

static const char INSTRUCTION[] =
    SOT "<|SYSTEM_TOKEN|>Write 'Action:' followed by a json-formatted list of actions that you want to perform in order "
    "to produce a good response to the user's last input. You can use any of the supplied tools any number of times, but "
    "you should aim to execute the minimum number of necessary actions for the input. You should use the "
    "`directly-answer` tool if calling the other tools is unnecessary. The list of actions you want to call should be "
    "formatted as a list of json objects, for example:\n```json\n[\n    {\n        \"tool_name\": title of the tool in "
    "the specification,\n        \"parameters\": a dict of parameters to input into the tool as they are defined in the "
    "specs, or {} if it takes no parameters\n    }\n]```" EOT;

static int refuse(const char *msg) {
    kvq_fail(KVQ_ERR_ARG, "chat template (Command-R tool_use): %s", msg);
    return -1;
}

static int is(const kvq_chat_msg *m, const char *role) { return m->role && !strcmp(m->role, role); }

/* The template's json_to_python_type. spec NULL: Jinja's undefined (attribute access raises). */
static int py_type(const cJSON *spec, sbuf *b, int depth) {
    if (!spec || depth > 32) return refuse("a parameter's type is missing (the template raises)");
    const cJSON *ty = cJSON_IsObject(spec) ? cJSON_GetObjectItemCaseSensitive(spec, "type") : NULL;
    static const char *const MAP[][2] = {{"string", "str"}, {"number", "float"}, {"integer", "int"}, {"boolean", "bool"}};
    if (cJSON_IsString(ty)) {
        for (size_t i = 0; i < sizeof MAP / sizeof *MAP; i++)
            if (!strcmp(ty->valuestring, MAP[i][0])) return puts_(b, MAP[i][1]), 0;
        /* Jinja reads json_spec.items as the dict's items() method, not the "items" key, and a
         * method has no type: every array is List[Union[]] whatever its items */
        if (!strcmp(ty->valuestring, "array")) return puts_(b, "List[Union[]]"), 0;
        if (!strcmp(ty->valuestring, "object")) {
            puts_(b, "Dict[str, ");
            if (py_type(cJSON_GetObjectItemCaseSensitive(spec, "additionalProperties"), b, depth + 1)) return -1;
            return puts_(b, "]"), 0;
        }
        /* any other string is iterable: the macro recurses on its characters without end */
        return refuse("a JSON type the template cannot map (its macro recurses without end)");
    }
    if (cJSON_IsObject(ty)) return refuse("a parameter's type is an object");
    if (ty && !cJSON_IsArray(ty)) return puts_(b, "Any"), 0; /* a number, boolean or null: not iterable */
    /* a list of types, or none given (undefined is iterable and empty): Union[...] */
    puts_(b, "Union[");
    const cJSON *t;
    int first = 1;
    cJSON_ArrayForEach(t, ty) {
        if (!first) puts_(b, ",");
        first = 0;
        if (cJSON_IsArray(t) || cJSON_IsObject(t)) return refuse("a nested list of types");
        cJSON *one = cJSON_CreateObject();
        if (!one) return b->oom = 1, -1;
        cJSON_AddItemReferenceToObject(one, "type", (cJSON *)t);
        int r = py_type(one, b, depth + 1);
        cJSON_Delete(one);
        if (r) return -1;
    }
    return puts_(b, "]"), 0;
}

static int in_required(const cJSON *req, const char *name) {
    const cJSON *r;
    cJSON_ArrayForEach(r, req) if (cJSON_IsString(r) && !strcmp(r->valuestring, name)) return 1;
    return 0;
}

/* One parameter's type, wrapped in Optional[...] when it is not required. */
static int param_type(const cJSON *req, const cJSON *p, int with_default, sbuf *b) {
    int need = in_required(req, p->string);
    if (!need) puts_(b, "Optional[");
    if (py_type(p, b, 0)) return -1;
    if (!need) puts_(b, with_default ? "] = None" : "]");
    return 0;
}

/* The template's new_tool_parser: one tool as a Python function with its docstring. */
static int put_tool(const cJSON *tool, sbuf *b) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
    if (f) tool = f;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(tool, "name"), *desc = cJSON_GetObjectItemCaseSensitive(tool, "description");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(tool, "parameters");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
    if (!cJSON_IsString(name)) return refuse("a tool without a name");
    if (!cJSON_IsObject(props)) return refuse("a tool without parameters.properties (the template raises)");
    if (req && !cJSON_IsArray(req)) return refuse("parameters.required is not a list");
    if (desc && !cJSON_IsString(desc)) return refuse("a tool's description is not a string");
    puts_(b, "```python\ndef ");
    puts_(b, name->valuestring);
    puts_(b, "(");
    const cJSON *p;
    int i = 0;
    cJSON_ArrayForEach(p, props) {
        if (i++) puts_(b, ", ");
        puts_(b, p->string);
        puts_(b, ": ");
        if (param_type(req, p, 1, b)) return -1;
    }
    puts_(b, ") -> List[Dict]:\n    \"\"\"");
    if (desc) puts_(b, desc->valuestring);
    if (i) {
        puts_(b, "\n\n    Args:\n        ");
        i = 0;
        cJSON_ArrayForEach(p, props) {
            const cJSON *pd = cJSON_GetObjectItemCaseSensitive(p, "description");
            if (!cJSON_IsString(pd)) return refuse("a parameter without a description (the template raises)");
            if (i++) puts_(b, "\n        ");
            puts_(b, p->string);
            puts_(b, " (");
            if (param_type(req, p, 0, b)) return -1;
            puts_(b, "): ");
            puts_(b, pd->valuestring);
        }
    }
    puts_(b, "\n    \"\"\"\n    pass\n```");
    return 0;
}

/* Jinja's indent(8) (first line as is) of json.dumps text; its splitlines() also breaks at
 * U+0085, U+2028 and U+2029, which json.dumps leaves raw in strings. */
static void put_indented(sbuf *b, const char *s) {
    for (const char *p = s; *p;) {
        size_t brk = 0;
        if (*p == '\n') brk = 1;
        else if ((unsigned char)p[0] == 0xc2 && (unsigned char)p[1] == 0x85) brk = 2;
        else if ((unsigned char)p[0] == 0xe2 && (unsigned char)p[1] == 0x80 && ((unsigned char)p[2] == 0xa8 || (unsigned char)p[2] == 0xa9))
            brk = 3;
        if (!brk) {
            put(b, p++, 1);
            continue;
        }
        p += brk;
        puts_(b, "\n");
        /* blank lines stay unindented */
        if (*p && *p != '\n') puts_(b, "        ");
    }
}

/* An assistant message's calls as the Action list. */
static int put_calls(const kvq_chat_msg *m, sbuf *b) {
    cJSON *calls = cJSON_Parse(m->tool_calls);
    if (!cJSON_IsArray(calls)) {
        cJSON_Delete(calls);
        return refuse("an assistant message's tool_calls is not a JSON array");
    }
    puts_(b, SOT "<|CHATBOT_TOKEN|>");
    if (m->content) put_strip(b, m->content);
    puts_(b, "\nAction:\n```json\n[\n");
    const cJSON *c;
    int r = 0, k = 0, n_calls = cJSON_GetArraySize(calls);
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function"), *call = f ? f : c;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
        if (!cJSON_IsString(name)) {
            r = refuse("a tool call without a name");
            break;
        }
        /* OpenAI's arguments string holds the object the template expects */
        cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (parsed) args = parsed;
        puts_(b, "    {\n        \"tool_name\": \"");
        puts_(b, name->valuestring);
        puts_(b, "\",\n        \"parameters\": ");
        int size = cJSON_IsObject(args) || cJSON_IsArray(args) ? cJSON_GetArraySize(args)
                   : cJSON_IsString(args)                     ? (int)strlen(args->valuestring)
                                                              : -1;
        if (args && size < 0) r = refuse("tool call arguments that have no length");
        if (!r && size > 0) {
            char *j = chat_json_dump(args, 4);
            if (!j) b->oom = 1;
            else put_indented(b, j), puts_(b, "\n");
            free(j);
        } else if (!r) {
            puts_(b, "{}\n");
        }
        cJSON_Delete(parsed);
        if (r) break;
        puts_(b, "    }");
        if (++k < n_calls) puts_(b, ",\n");
    }
    cJSON_Delete(calls);
    if (r) return -1;
    puts_(b, "\n]```\n");
    return 0;
}

int chat_render_command_r_tools(const chat_tool_tmpl *t, const kvq_chat_msg *m, int n, const cJSON *tools, int gen, sbuf *b) {
    if (!tools) return refuse("tool messages need tools (only the tool_use template renders them)");
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        if (cJSON_GetObjectItemCaseSensitive(tool, "parameter_definitions"))
            return refuse("Cohere's parameter_definitions tools are not rendered; send OpenAI-style tools");
    }
    int start = n && is(&m[0], "system");
    puts_(b, t->bos ? t->bos : "");
    puts_(b, SOT "<|SYSTEM_TOKEN|>");
    puts_(b, PREAMBLE);
    puts_(b, start ? (m[0].content ? m[0].content : "") : DEFAULT_SYSTEM);
    puts_(b, "\n\n## Available Tools\nHere is a list of tools that you have available to you:\n\n");
    int i = 0;
    cJSON_ArrayForEach(tool, tools) {
        if (i++) puts_(b, "\n\n");
        if (put_tool(tool, b)) return -1;
    }
    puts_(b, EOT);
    for (int k = start; k < n; k++) {
        const kvq_chat_msg *x = &m[k];
        if (is(x, "assistant") && x->tool_calls) {
            if (put_calls(x, b)) return -1;
            continue;
        }
        if (!x->content && (is(x, "user") || is(x, "system") || is(x, "assistant") || is(x, "tool")))
            return refuse("a message without content");
        if (is(x, "user")) puts_(b, SOT "<|USER_TOKEN|>");
        else if (is(x, "system")) puts_(b, SOT "<|SYSTEM_TOKEN|>");
        else if (is(x, "assistant")) puts_(b, SOT "<|CHATBOT_TOKEN|>");
        else if (is(x, "tool")) puts_(b, SOT "<|SYSTEM_TOKEN|><results>\n");
        else continue; /* other roles: nothing */
        put_strip(b, x->content);
        puts_(b, is(x, "tool") ? "</results>" EOT : EOT);
    }
    puts_(b, INSTRUCTION);
    if (gen) puts_(b, SOT "<|CHATBOT_TOKEN|>");
    return 0;
}
