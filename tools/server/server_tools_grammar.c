/* kvq-server: a forced tool call (tool_choice "required" or a named function) written under
 * the JSON grammar, so that its arguments always parse and follow the function's parameters
 * schema. The reply goes on from the prefilled call opening (srv_tools_prefill); then:
 *   name   "required" with several tools: the name, one of theirs (an enum)
 *   key    forced tokens: `, "arguments": ` (Llama, Command-R: "parameters")
 *   args   the arguments, under the chosen function's parameters schema
 *   close  forced tokens: the rest of the call in the template's format
 * Forced tokens are fed to the model like sampled ones (one step each), so it sees the call.
 * Formats: Llama-3.1 JSON, Mistral [TOOL_CALLS], Qwen <tool_call>, Command-R Action: list. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* A call in each template's format: what comes before the name, the name's key, the key
 * between the name and the arguments, and what closes the call after the arguments. */
typedef struct {
    const char *fmt, *open, *name_key, *args_key, *close;
} call_fmt;

static const call_fmt FORMATS[] = {
    {"llama3-json", "", "{\"name\": ", ", \"parameters\": ", "}"},
    {"mistral", "[TOOL_CALLS] [", "{\"name\": ", ", \"arguments\": ", "}]"},
    {"qwen", "<tool_call>\n", "{\"name\": ", ", \"arguments\": ", "}\n</tool_call>"},
    {"command-r", "Action:\n```json\n[\n    ", "{\"tool_name\": ", ", \"parameters\": ", "}\n]```"},
};

static const call_fmt *format_of(const char *fmt) {
    for (size_t i = 0; fmt && i < sizeof FORMATS / sizeof *FORMATS; i++)
        if (!strcmp(FORMATS[i].fmt, fmt)) return &FORMATS[i];
    return NULL;
}

enum { CALL_NAME, CALL_KEY, CALL_ARGS, CALL_CLOSE, CALL_DONE };

struct srv_call {
    const kvq_tokenizer *tok;
    const call_fmt *f;
    cJSON *tools;
    int stage;
    kvq_json_constraint *c; /* the name's or the arguments' constraint */
    int32_t *forced;        /* key / close: the ids still to write, from `at` */
    int n_forced, at;
    int32_t name_ids[256]; /* the name as written, read back when it is complete */
    int pretty;            /* the arguments' layout (kvq_layout) */
    int n_name;
};

static const cJSON *tool_named(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return f;
    }
    return NULL;
}

/* A function's parameters schema as text (NULL: none given, any object). */
static char *params_text(const cJSON *f) {
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    return ps ? cJSON_PrintUnformatted(ps) : NULL;
}

const char *srv_call_forced_name(const srv_params *p) {
    if (p->tool_choice == SRV_TOOLS_NAMED) return p->tool_name;
    if (p->tool_choice != SRV_TOOLS_REQUIRED || !p->tools_json) return NULL;
    cJSON *tools = cJSON_Parse(p->tools_json);
    static _Thread_local char one[256]; /* "required" with one tool names it */
    const char *r = NULL;
    if (cJSON_GetArraySize(tools) == 1) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tools->child, "function"), "name");
        if (cJSON_IsString(n) && strlen(n->valuestring) < sizeof one) r = strcpy(one, n->valuestring);
    }
    cJSON_Delete(tools);
    return r;
}

int srv_call_check(const srv_params *p, srv_error *e) {
    if (p->tool_choice != SRV_TOOLS_REQUIRED && p->tool_choice != SRV_TOOLS_NAMED) return 0;
    cJSON *tools = cJSON_Parse(p->tools_json ? p->tools_json : "[]");
    const cJSON *t;
    int i = 0, bad = 0;
    cJSON_ArrayForEach(t, tools) { /* each function the call may be to: its schema must compile */
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (p->tool_choice == SRV_TOOLS_NAMED && (!cJSON_IsString(n) || strcmp(n->valuestring, p->tool_name))) {
            i++;
            continue;
        }
        char err[256], *schema = params_text(f);
        kvq_json_constraint *c = kvq_json_constraint_new(NULL, schema, 0, err, sizeof err);
        free(schema);
        if (!c) {
            bad = srv_fail(e, 400, "invalid_json_schema", "tools[%d].function.parameters cannot constrain a forced call: %s", i, err);
            break;
        }
        kvq_json_constraint_free(c);
        i++;
    }
    cJSON_Delete(tools);
    return bad;
}

static int force_text(srv_call *c, const char *text) {
    free(c->forced);
    c->at = 0;
    int n = kvq_tokenize(c->tok, text, strlen(text), 0, NULL, 0);
    if (n <= 0 || !(c->forced = malloc(sizeof *c->forced * (size_t)n))) return c->forced = NULL, -1;
    c->n_forced = kvq_tokenize(c->tok, text, strlen(text), 0, c->forced, n);
    return 0;
}

static int start_args(srv_call *c, const char *name, srv_error *e) {
    const cJSON *f = tool_named(c->tools, name);
    if (!f) return srv_fail(e, 500, NULL, "forced tool call: no function '%.64s'", name);
    char err[256], *schema = params_text(f);
    kvq_json_constraint_free(c->c);
    c->c = kvq_json_constraint_new(c->tok, schema, 0, err, sizeof err);
    free(schema);
    if (!c->c) return srv_fail(e, 400, "invalid_json_schema", "tools: '%.64s' parameters: %s", name, err);
    kvq_json_constraint_set_layout(c->c, c->pretty);
    c->stage = CALL_ARGS;
    return 0;
}

char *srv_call_prefill(const char *fmt, const srv_params *p) {
    const call_fmt *f = format_of(fmt);
    if (!f || !p->tools_json || (p->tool_choice != SRV_TOOLS_REQUIRED && p->tool_choice != SRV_TOOLS_NAMED)) return NULL;
    const char *fn = srv_call_forced_name(p);
    char *q = NULL;
    if (fn) { /* the name as a JSON string, escaped */
        cJSON *name = cJSON_CreateString(fn);
        q = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!q) return NULL;
    }
    size_t n = strlen(f->open) + strlen(f->name_key) + (q ? strlen(q) : 0) + strlen(f->args_key) + 1;
    char *s = malloc(n);
    /* several tools: up to the name, which the grammar keeps to theirs */
    if (s) snprintf(s, n, "%s%s%s%s", f->open, f->name_key, q ? q : "", q ? f->args_key : "");
    free(q);
    return s;
}

srv_call *srv_call_new(const kvq_tokenizer *tok, const srv_params *p, srv_error *e) {
    if (!format_of(p->tools_fmt) || !p->tools_json || (p->tool_choice != SRV_TOOLS_REQUIRED && p->tool_choice != SRV_TOOLS_NAMED))
        return NULL;
    srv_call *c = calloc(1, sizeof *c);
    if (!c || !(c->tools = cJSON_Parse(p->tools_json))) {
        free(c);
        return srv_fail(e, 500, NULL, "out of memory"), NULL;
    }
    c->tok = tok;
    c->pretty = p->json_pretty;
    c->f = format_of(p->tools_fmt);
    const char *name = srv_call_forced_name(p);
    if (name) {
        if (!start_args(c, name, e)) return c;
    } else { /* the name first: one of the tools' names */
        cJSON *names = cJSON_CreateArray(), *schema = cJSON_CreateObject();
        const cJSON *t;
        cJSON_ArrayForEach(t, c->tools) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            cJSON_AddItemToArray(names, cJSON_CreateString(n->valuestring));
        }
        cJSON_AddItemToObject(schema, "enum", names);
        char err[256], *text = cJSON_PrintUnformatted(schema);
        cJSON_Delete(schema);
        c->c = text ? kvq_json_constraint_new(tok, text, 0, err, sizeof err) : NULL;
        free(text);
        c->stage = CALL_NAME;
        if (c->c) return c;
        srv_fail(e, 400, "invalid_value", "tools: the names cannot be constrained (%s)", text ? err : "out of memory");
    }
    srv_call_free(c);
    return NULL;
}

void srv_call_free(srv_call *c) {
    if (!c) return;
    kvq_json_constraint_free(c->c);
    cJSON_Delete(c->tools);
    free(c->forced);
    free(c);
}

int srv_call_done(const srv_call *c) { return c->stage == CALL_DONE; }

/* The name is complete: read it back and force the arguments key. */
static void end_name(srv_call *c) {
    int n = kvq_detokenize(c->tok, c->name_ids, c->n_name, 1, NULL, 0);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    cJSON *v = NULL;
    if (s) kvq_detokenize(c->tok, c->name_ids, c->n_name, 1, s, (size_t)n + 1), v = cJSON_Parse(s);
    free(s);
    srv_error e = {0};
    /* the arguments' constraint is made now; the key's tokens are written first */
    if (!cJSON_IsString(v) || start_args(c, v->valuestring, &e) || force_text(c, c->f->args_key)) c->stage = CALL_DONE;
    else c->stage = CALL_KEY;
    cJSON_Delete(v);
}

static void end_args(srv_call *c) {
    c->stage = force_text(c, c->f->close) ? CALL_DONE : CALL_CLOSE;
}

int32_t srv_call_sample(srv_call *c, kvq_sampler *s, const float *logits, int n_vocab) {
    if (c->stage == CALL_NAME || c->stage == CALL_ARGS) {
        int32_t id = kvq_json_constraint_sample(c->c, s, logits, n_vocab);
        if (id < 0 || !kvq_token_is_eog(c->tok, id)) return id;
        /* an end token: the value may end here (a number), or nothing could continue it */
        if (c->stage == CALL_NAME) end_name(c);
        else end_args(c);
    }
    if ((c->stage == CALL_KEY || c->stage == CALL_CLOSE) && c->at < c->n_forced) return c->forced[c->at];
    return -1;
}

void srv_call_accept(srv_call *c, int32_t id) {
    switch (c->stage) {
    case CALL_NAME:
        if (kvq_json_constraint_accept(c->c, id)) break;
        if (c->n_name < (int)(sizeof c->name_ids / sizeof *c->name_ids)) c->name_ids[c->n_name++] = id;
        if (kvq_json_constraint_complete(c->c)) end_name(c); /* a string's closing quote ends it */
        break;
    case CALL_ARGS:
        kvq_json_constraint_accept(c->c, id);
        if (kvq_json_constraint_complete(c->c) == 2) end_args(c); /* the object's closing brace */
        break;
    case CALL_KEY:
    case CALL_CLOSE:
        if (++c->at < c->n_forced) break;
        if (c->stage == CALL_KEY) c->stage = CALL_ARGS;
        else c->stage = CALL_DONE;
        break;
    default: break;
    }
}
