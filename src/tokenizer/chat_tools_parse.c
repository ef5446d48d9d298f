/* Tool calls in a model's reply, in its template's format, as OpenAI tool_calls:
 *   llama3-json  {"name": ..., "parameters": {...}} (a reply that is only calls; <|python_tag|>
 *                before it and several calls split by ';' are accepted)
 *   mistral      [TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}, ...]
 *   qwen         <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one block a call
 *   command-r    Action: ```json [{"tool_name": ..., "parameters": {...}}, ...]``` (text before it: content)
 * A reply whose calls do not parse (junk, cut short) is plain content: nothing is guessed. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvq.h"

#define LLAMA_TAG "<|python_tag|>"
#define MISTRAL_TAG "[TOOL_CALLS]"
#define QWEN_OPEN "<tool_call>"
#define QWEN_CLOSE "</tool_call>"
#define CR_ACTION "Action:"

typedef struct {
    kvq_tool_call *v;
    int n, cap, bad;
} call_list;

/* A 9-character alphanumeric id (Mistral's templates need that length; others take any). */
static char *new_id(void) {
    static const char ALNUM[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ (++counter * 0x9e3779b97f4a7c15ull);
    char *id = malloc(10);
    if (!id) return NULL;
    for (int i = 0; i < 9; i++) {
        x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 29;
        id[i] = ALNUM[x % 62];
    }
    id[9] = 0;
    return id;
}

/* One call object: its name (a string under nkey) and its arguments object under akey (or a
 * JSON string holding one). */
static void add_call(call_list *l, const cJSON *o, const char *nkey, const char *akey) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, nkey);
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, akey);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) args = parsed = cJSON_Parse(args->valuestring);
    if (!cJSON_IsString(name) || !*name->valuestring || !cJSON_IsObject(args)) {
        l->bad = 1;
        cJSON_Delete(parsed);
        return;
    }
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        kvq_tool_call *v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) {
            l->bad = 2;
            cJSON_Delete(parsed);
            return;
        }
        l->v = v, l->cap = cap;
    }
    kvq_tool_call *c = &l->v[l->n++];
    c->id = cJSON_IsString(id) && *id->valuestring ? strdup(id->valuestring) : new_id();
    c->name = strdup(name->valuestring);
    c->arguments = cJSON_PrintUnformatted(args);
    cJSON_Delete(parsed);
    if (!c->id || !c->name || !c->arguments) l->bad = 2;
}

static const char *skip_ws(const char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    return s;
}

/* Parses one JSON value at s; *end is where it stopped. NULL when it is not JSON. */
static cJSON *json_at(const char *s, const char **end) {
    return cJSON_ParseWithOpts(s, end, 0);
}

static void parse_llama(const char *text, call_list *l) {
    const char *s = skip_ws(text);
    if (!strncmp(s, LLAMA_TAG, strlen(LLAMA_TAG))) s = skip_ws(s + strlen(LLAMA_TAG));
    if (*s != '{') return;
    while (*s && !l->bad) {
        const char *end;
        cJSON *o = json_at(s, &end);
        if (!cJSON_IsObject(o)) l->bad = 1;
        else add_call(l, o, "name", cJSON_GetObjectItemCaseSensitive(o, "parameters") ? "parameters" : "arguments");
        cJSON_Delete(o);
        if (l->bad) break;
        s = skip_ws(end);
        if (*s == ';') s = skip_ws(s + 1);
    }
}

static void parse_mistral(const char *text, call_list *l, size_t *before) {
    const char *at = strstr(text, MISTRAL_TAG), *list;
    if (at) {
        *before = (size_t)(at - text);
        list = skip_ws(at + strlen(MISTRAL_TAG));
    } else { /* [TOOL_CALLS] is a control token, gone when special tokens are not decoded */
        list = skip_ws(text);
        if (strncmp(list, "[{", 2)) return;
        *before = 0;
    }
    const char *end;
    cJSON *a = json_at(list, &end);
    if (!cJSON_IsArray(a) || !a->child || *skip_ws(end)) l->bad = 1;
    const cJSON *o;
    cJSON_ArrayForEach(o, a) if (!l->bad) add_call(l, o, "name", "arguments");
    cJSON_Delete(a);
}

/* Command-R: "Action:", then the list in a ```json fence (the fence may be left out). */
static void parse_command_r(const char *text, call_list *l, size_t *before) {
    const char *at = strstr(text, CR_ACTION);
    if (!at) return;
    *before = (size_t)(at - text);
    const char *s = skip_ws(at + strlen(CR_ACTION)), *end;
    int fenced = !strncmp(s, "```json", 7);
    if (fenced) s += 7;
    cJSON *a = json_at(skip_ws(s), &end);
    end = skip_ws(end ? end : s);
    if (fenced && !strncmp(end, "```", 3)) end = skip_ws(end + 3);
    if (!cJSON_IsArray(a) || !a->child || *end) l->bad = 1;
    const cJSON *o;
    cJSON_ArrayForEach(o, a) if (!l->bad) add_call(l, o, "tool_name", "parameters");
    cJSON_Delete(a);
}

/* Qwen: the blocks; *outside gets the text between them. */
static void parse_qwen(const char *text, call_list *l, char *outside) {
    const char *s = text;
    size_t k = 0;
    while (!l->bad) {
        const char *at = strstr(s, QWEN_OPEN);
        size_t plain = at ? (size_t)(at - s) : strlen(s);
        memcpy(outside + k, s, plain);
        k += plain;
        if (!at) break;
        const char *body = at + strlen(QWEN_OPEN), *close = strstr(body, QWEN_CLOSE);
        const char *end;
        cJSON *o = json_at(skip_ws(body), &end);
        /* the last block may be cut by the end of the reply */
        if (!cJSON_IsObject(o) || (close ? skip_ws(end) != close : *skip_ws(end))) l->bad = 1;
        else add_call(l, o, "name", "arguments");
        cJSON_Delete(o);
        s = close ? close + strlen(QWEN_CLOSE) : body + strlen(body);
    }
    outside[k] = 0;
}

/* s without the whitespace around it, as a new string. */
static char *trimmed(const char *s, size_t n) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    char *r = malloc(n + 1);
    if (r) memcpy(r, s, n), r[n] = 0;
    return r;
}

int kvq_chat_parse_tools(const kvq_chat_template *t, const char *text, kvq_tool_call **calls, char **content) {
    *calls = NULL;
    *content = NULL;
    if (!text) text = "";
    const char *fmt = kvq_chat_template_tools(t);
    call_list l = {0};
    char *outside = NULL;
    size_t before = strlen(text);
    if (fmt && !strcmp(fmt, "llama3-json")) {
        parse_llama(text, &l), before = 0;
    } else if (fmt && !strcmp(fmt, "mistral")) {
        parse_mistral(text, &l, &before);
    } else if (fmt && !strcmp(fmt, "command-r")) {
        parse_command_r(text, &l, &before);
    } else if (fmt && !strcmp(fmt, "qwen")) {
        if (!(outside = malloc(strlen(text) + 1))) return -1;
        parse_qwen(text, &l, outside);
    }
    int oom = l.bad == 2;
    if (l.bad || !l.n) { /* no calls: all of it is content */
        kvq_tool_calls_free(l.v, l.n);
        l.v = NULL, l.n = 0;
        *content = strdup(text);
    } else {
        *content = outside ? trimmed(outside, strlen(outside)) : trimmed(text, before);
    }
    free(outside);
    if (oom || !*content) {
        kvq_tool_calls_free(l.v, l.n);
        free(*content);
        *content = NULL;
        return -1;
    }
    *calls = l.v;
    return l.n;
}

void kvq_tool_calls_free(kvq_tool_call *calls, int n) {
    for (int i = 0; calls && i < n; i++) {
        free(calls[i].id);
        free(calls[i].name);
        free(calls[i].arguments);
    }
    free(calls);
}

/* Where a marker starts in text, or where a suffix of text could be its start. */
static size_t before_marker(const char *text, const char *mark) {
    const char *at = strstr(text, mark);
    if (at) return (size_t)(at - text);
    size_t n = strlen(text), m = strlen(mark);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(text + n - k, mark, k)) return n - k;
    return n;
}

size_t kvq_chat_tools_plain_prefix(const kvq_chat_template *t, const char *text) {
    const char *fmt = kvq_chat_template_tools(t);
    size_t n = strlen(text);
    if (!fmt) return n;
    if (!strcmp(fmt, "mistral")) { /* the tag, or (its token not decoded) a reply opening with "[{" */
        const char *s = skip_ws(text);
        if (!*s || (*s == '[' && (!s[1] || s[1] == '{'))) return 0;
        return before_marker(text, MISTRAL_TAG);
    }
    if (!strcmp(fmt, "qwen")) return before_marker(text, QWEN_OPEN);
    if (!strcmp(fmt, "command-r")) return before_marker(text, CR_ACTION);
    /* Llama: calls are the whole reply; its first characters decide */
    const char *s = skip_ws(text);
    if (!*s || *s == '{') return 0;
    size_t k = strlen(s) < strlen(LLAMA_TAG) ? strlen(s) : strlen(LLAMA_TAG);
    return strncmp(s, LLAMA_TAG, k) ? n : 0;
}
