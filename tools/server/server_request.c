/* kvq-server: JSON request bodies to checked parameters. Nothing here touches
 * the model, so the fuzz target (fuzz/fuzz_server_request.c) runs it alone. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

int srv_fail(srv_error *e, int status, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = status;
    e->code = code;
    switch (status) {
    case 401: e->type = "authentication_error"; break;
    case 404: e->type = "not_found_error"; break;
    case 503: e->type = "server_overloaded"; break;
    case 500: e->type = "server_error"; break;
    default: e->type = "invalid_request_error"; break;
    }
    return -1;
}

void srv_params_free(srv_params *p) {
    for (int i = 0; i < p->n_msgs; i++) {
        free((char *)p->msgs[i].role);
        free((char *)p->msgs[i].content);
        free((char *)p->msgs[i].tool_calls);
        free((char *)p->msgs[i].tool_call_id);
    }
    free(p->tools_json);
    free(p->tool_name);
    free(p->msgs);
    free(p->prompt);
    free(p->prompt_ids);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->json_schema);
    free(p->grammar);
    memset(p, 0, sizeof *p);
}

static cJSON *parse_object(const char *body, size_t len, srv_error *e) {
    if (!body || !len) return srv_fail(e, 400, "invalid_json", "the request body is empty; send a JSON object"), NULL;
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (!j) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= body && at <= body + len ? (long)(at - body) : -1;
        srv_fail(e, 400, "invalid_json", "the request body is not valid JSON (near byte %ld)", off);
        return NULL;
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        srv_fail(e, 400, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Optional number field in [lo, hi]: 0 when absent or null, 1 when set, -1 on error. */
static int get_num(const cJSON *j, const char *key, double lo, double hi, double *out, srv_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return srv_fail(e, 400, "invalid_type", "'%s' must be a number", key);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return srv_fail(e, 400, "invalid_value", "'%s' is %g; it must be between %g and %g", key, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return 1;
}

/* Optional integer field in [lo, hi]. */
static int get_int(const cJSON *j, const char *key, double lo, double hi, long *out, srv_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return srv_fail(e, 400, "invalid_type", "'%s' must be an integer", key);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return srv_fail(e, 400, "invalid_value", "'%s' is %.0f; it must be between %.0f and %.0f", key, v->valuedouble, lo, hi);
    *out = (long)v->valuedouble;
    return 1;
}

static int get_bool(const cJSON *j, const char *key, int *out, srv_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return srv_fail(e, 400, "invalid_type", "'%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 1;
}

static char *dup_or_fail(const char *s, srv_error *e) {
    char *d = strdup(s);
    if (!d) srv_fail(e, 500, NULL, "out of memory");
    return d;
}

/* A message's content: a string, or an array of {"type": "text", "text": str} parts. */
static char *message_content(const cJSON *c, int i, srv_error *e) {
    if (cJSON_IsString(c)) return dup_or_fail(c->valuestring, e);
    if (!cJSON_IsArray(c)) {
        srv_fail(e, 400, "invalid_type", "messages[%d].content must be a string or an array of text parts", i);
        return NULL;
    }
    size_t n = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            srv_fail(e, 400, "unsupported_content", "messages[%d].content: only parts {\"type\": \"text\", \"text\": ...} are supported", i);
            return NULL;
        }
        n += strlen(text->valuestring);
    }
    char *out = malloc(n + 1), *w = out;
    if (!out) {
        srv_fail(e, 500, NULL, "out of memory");
        return NULL;
    }
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t k = strlen(t);
        memcpy(w, t, k);
        w += k;
    }
    *w = 0;
    return out;
}

static int parse_messages(const cJSON *j, srv_params *p, srv_error *e) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!ms) return srv_fail(e, 400, "missing_field", "'messages' is required");
    if (!cJSON_IsArray(ms)) return srv_fail(e, 400, "invalid_type", "'messages' must be an array");
    int n = cJSON_GetArraySize(ms);
    if (n <= 0) return srv_fail(e, 400, "invalid_value", "'messages' is empty");
    if (!(p->msgs = calloc((size_t)n, sizeof *p->msgs))) return srv_fail(e, 500, NULL, "out of memory");
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, ms) {
        if (!cJSON_IsObject(m)) return srv_fail(e, 400, "invalid_type", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role)) return srv_fail(e, 400, "invalid_type", "messages[%d].role must be a string", i);
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system"; /* OpenAI's newer name for the system role */
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
            return srv_fail(e, 400, "invalid_role", "messages[%d].role '%.64s' is not one of system, user, assistant, tool", i,
                            role->valuestring);
        p->n_msgs = i + 1; /* what is set below is freed with p */
        if (srv_parse_msg_tools(m, i, r, &p->msgs[i], e)) return -1;
        /* an assistant reply that is only tool calls has no content */
        if ((!content || cJSON_IsNull(content)) && !p->msgs[i].tool_calls)
            return srv_fail(e, 400, "missing_field", "messages[%d].content is required", i);
        char *text = content && !cJSON_IsNull(content) ? message_content(content, i, e) : NULL;
        if (!text && content && !cJSON_IsNull(content)) return -1;
        p->msgs[i].content = text;
        if (!(p->msgs[i].role = dup_or_fail(r, e))) {
            p->n_msgs = i + 1; /* frees text; role stays NULL */
            return -1;
        }
        p->n_msgs = ++i;
    }
    return 0;
}

static int parse_prompt(const cJSON *j, srv_params *p, srv_error *e) {
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (!pr) return srv_fail(e, 400, "missing_field", "'prompt' is required");
    if (cJSON_IsString(pr)) return (p->prompt = dup_or_fail(pr->valuestring, e)) ? 0 : -1;
    if (!cJSON_IsArray(pr)) return srv_fail(e, 400, "invalid_type", "'prompt' must be a string or an array of token ids");
    int n = cJSON_GetArraySize(pr);
    if (n == 1 && cJSON_IsString(cJSON_GetArrayItem(pr, 0))) return (p->prompt = dup_or_fail(pr->child->valuestring, e)) ? 0 : -1;
    if (n == 0) return srv_fail(e, 400, "invalid_value", "'prompt' is empty");
    if (!(p->prompt_ids = malloc(sizeof *p->prompt_ids * (size_t)n))) return srv_fail(e, 500, NULL, "out of memory");
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, pr) {
        if (cJSON_IsString(t)) return srv_fail(e, 400, "unsupported_value", "'prompt' with several strings (n > 1) is not supported");
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble > INT32_MAX)
            return srv_fail(e, 400, "invalid_type", "prompt[%d] must be a token id (a non-negative integer)", i);
        p->prompt_ids[i++] = (int32_t)t->valuedouble;
    }
    p->n_prompt_ids = n;
    return 0;
}

static int parse_stop(const cJSON *j, srv_params *p, srv_error *e) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (!st || cJSON_IsNull(st)) return 0;
    if (cJSON_IsString(st)) {
        if (!*st->valuestring) return 0;
        return (p->stop[p->n_stop++] = dup_or_fail(st->valuestring, e)) ? 0 : -1;
    }
    if (!cJSON_IsArray(st)) return srv_fail(e, 400, "invalid_type", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(st) > SRV_MAX_STOP)
        return srv_fail(e, 400, "invalid_value", "'stop' has %d strings; at most %d are allowed", cJSON_GetArraySize(st), SRV_MAX_STOP);
    const cJSON *s;
    cJSON_ArrayForEach(s, st) {
        if (!cJSON_IsString(s)) return srv_fail(e, 400, "invalid_type", "'stop' must be a string or an array of strings");
        if (!*s->valuestring) continue;
        if (strlen(s->valuestring) > 256) return srv_fail(e, 400, "invalid_value", "a stop string is longer than 256 bytes");
        if (!(p->stop[p->n_stop] = dup_or_fail(s->valuestring, e))) return -1;
        p->n_stop++;
    }
    return 0;
}

/* Chat: "logprobs": bool and "top_logprobs": 0..20 (which needs logprobs). Completions (the
 * legacy API): "logprobs": 0..20 alternatives (OpenAI allows 5; llama-server more) and "echo". */
static int parse_logprobs(const cJSON *j, srv_params *p, srv_error *e) {
    if (p->chat) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "logprobs");
        if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v))
            return srv_fail(e, 400, "invalid_type", "'logprobs' must be true or false in chat completions ('top_logprobs' is the count)");
        p->logprobs = cJSON_IsTrue(v);
        int r = get_int(j, "top_logprobs", 0, SRV_MAX_TOP, &p->top_logprobs, e);
        if (r < 0) return -1;
        if (r && !p->logprobs) return srv_fail(e, 400, "invalid_value", "'top_logprobs' needs 'logprobs': true");
        const cJSON *echo = cJSON_GetObjectItemCaseSensitive(j, "echo");
        if (cJSON_IsTrue(echo)) return srv_fail(e, 400, "unsupported_value", "'echo' is for /v1/completions, not chat");
        return 0;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "logprobs");
    if (cJSON_IsBool(v)) return srv_fail(e, 400, "invalid_type", "'logprobs' must be an integer 0..%d in completions (alternatives per token)", SRV_MAX_TOP);
    int r = get_int(j, "logprobs", 0, SRV_MAX_TOP, &p->top_logprobs, e);
    if (r < 0) return -1;
    p->logprobs = r;
    return get_bool(j, "echo", &p->echo, e) < 0 ? -1 : 0;
}

static int parse_sampling(const cJSON *j, srv_params *p, srv_error *e) {
    long n = 1, mt = -1, mct = -1;
    int r;
    if (get_int(j, "n", -1e18, 1e18, &n, e) < 0) return -1;
    if (n < 1 || n > SRV_MAX_CHOICES) return srv_fail(e, 400, "invalid_value", "'n' is %ld; it must be 1..%d", n, SRV_MAX_CHOICES);
    p->n = n;
    if ((r = get_int(j, "max_tokens", -1e18, 1e18, &mt, e)) < 0) return -1;
    if (r && mt < 0) return srv_fail(e, 400, "invalid_value", "'max_tokens' is %ld; it must be at least 1", mt);
    if ((r = get_int(j, "max_completion_tokens", -1e18, 1e18, &mct, e)) < 0) return -1;
    if (r && mct <= 0) return srv_fail(e, 400, "invalid_value", "'max_completion_tokens' is %ld; it must be at least 1", mct);
    p->max_tokens = mct > 0 ? mct : mt; /* 0 is checked once 'echo' is known */
    if ((p->has_temperature = get_num(j, "temperature", 0, 2, &p->temperature, e)) < 0) return -1;
    if ((p->has_top_p = get_num(j, "top_p", 0, 1, &p->top_p, e)) < 0) return -1;
    if ((p->has_min_p = get_num(j, "min_p", 0, 1, &p->min_p, e)) < 0) return -1;
    if ((p->has_top_k = get_int(j, "top_k", 0, 1 << 30, &p->top_k, e)) < 0) return -1;
    if (get_num(j, "presence_penalty", -2, 2, &p->presence_penalty, e) < 0) return -1;
    if (get_num(j, "frequency_penalty", -2, 2, &p->frequency_penalty, e) < 0) return -1;
    long seed = 0;
    if ((p->has_seed = get_int(j, "seed", -9.2e18, 9.2e18, &seed, e)) < 0) return -1;
    p->seed = (uint64_t)seed;
    if (get_bool(j, "stream", &p->stream, e) < 0) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return srv_fail(e, 400, "invalid_type", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &p->include_usage, e) < 0) return -1;
    }
    if (parse_logprobs(j, p, e) < 0) return -1;
    if (p->max_tokens == 0 && !p->echo)
        return srv_fail(e, 400, "invalid_value", "'max_tokens' is 0; it must be at least 1 (0 only with 'echo', to score a prompt)");
    /* what is not supported is said, not ignored */
    if (srv_parse_tools(j, p, e)) return -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) return srv_fail(e, 400, "invalid_type", "'model' must be a string");
    return parse_stop(j, p, e);
}

int srv_parse_completion(const char *body, size_t len, int chat, srv_params *p, srv_error *e) {
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    cJSON *j = parse_object(body, len, e);
    if (!j) return -1;
    int r = chat ? parse_messages(j, p, e) : parse_prompt(j, p, e);
    if (!r) r = parse_sampling(j, p, e);
    if (!r) r = srv_parse_response_format(j, p, e);
    cJSON_Delete(j);
    if (r) srv_params_free(p);
    return r;
}

int srv_parse_tokenize(const char *body, size_t len, char **content, int *add_special, srv_error *e) {
    *content = NULL;
    *add_special = 0;
    cJSON *j = parse_object(body, len, e);
    if (!j) return -1;
    int r = -1;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    if (!c) srv_fail(e, 400, "missing_field", "'content' is required");
    else if (!cJSON_IsString(c)) srv_fail(e, 400, "invalid_type", "'content' must be a string");
    else if (get_bool(j, "add_special", add_special, e) >= 0 && (*content = dup_or_fail(c->valuestring, e))) r = 0;
    cJSON_Delete(j);
    return r;
}

int srv_parse_detokenize(const char *body, size_t len, int32_t **ids, int *n, srv_error *e) {
    *ids = NULL;
    *n = 0;
    cJSON *j = parse_object(body, len, e);
    if (!j) return -1;
    int r = -1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    if (!t) srv_fail(e, 400, "missing_field", "'tokens' is required");
    else if (!cJSON_IsArray(t)) srv_fail(e, 400, "invalid_type", "'tokens' must be an array of token ids");
    else {
        int k = cJSON_GetArraySize(t), i = 0;
        const cJSON *v;
        if (!(*ids = malloc(sizeof **ids * (size_t)(k + 1)))) srv_fail(e, 500, NULL, "out of memory");
        else {
            r = 0;
            cJSON_ArrayForEach(v, t) {
                if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > INT32_MAX) {
                    r = srv_fail(e, 400, "invalid_type", "tokens[%d] must be a token id (a non-negative integer)", i);
                    break;
                }
                (*ids)[i++] = (int32_t)v->valuedouble;
            }
            *n = i;
            if (r) {
                free(*ids);
                *ids = NULL;
                *n = 0;
            }
        }
    }
    cJSON_Delete(j);
    return r;
}
