/* kvq-server: HTTP routes on GNU libmicrohttpd (a thread per connection, so a
 * handler may wait for its request while the scheduler runs), OpenAI-style
 * JSON answers and server-sent events. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "server.h"

#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif

struct srv_http {
    struct MHD_Daemon *d;
    srv_server *s;
    const srv_opts *o;
    const kvq_chat_template *tmpl;
    const kvq_tokenizer *tok;
    char model_name[256];
    int plain; /* the template is "none" */
    long created;
    pthread_mutex_t mu; /* requests begun and not yet answered to the end (shutdown waits) */
    pthread_cond_t cv;
    int in_flight;
};

typedef struct {
    char *p;
    size_t n, cap;
    int too_large;
} body;

static int body_add(body *b, const char *s, size_t k) {
    srv_buf sb = {b->p, b->n, b->cap};
    int r = srv_buf_add(&sb, s, k);
    b->p = sb.p, b->n = sb.n, b->cap = sb.cap;
    return r;
}

/* ---- answers ---- */

static void cors(struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
}

static mhd_result send_buf(srv_http *h, struct MHD_Connection *c, int route, int status, const char *type, char *text,
                           size_t n, const char *extra_name, const char *extra_value) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (extra_name) MHD_add_response_header(r, extra_name, extra_value);
    cors(r);
    mhd_result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_count_request(h->s, route, status);
    return ret;
}

static mhd_result send_json(srv_http *h, struct MHD_Connection *c, int route, int status, cJSON *j) {
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    return send_buf(h, c, route, status, "application/json", text, strlen(text), NULL, NULL);
}

static mhd_result send_error(srv_http *h, struct MHD_Connection *c, int route, const srv_error *e) {
    cJSON *j = srv_error_json(e);
    char *t = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!t) return MHD_NO;
    const char *hn = NULL, *hv = NULL;
    if (e->status == 503) hn = "Retry-After", hv = "1";
    if (e->status == 401) hn = "WWW-Authenticate", hv = "Bearer";
    if (e->status == 405) hn = "Allow", hv = route == SRV_ROUTE_CHAT || route == SRV_ROUTE_COMPLETION || route == SRV_ROUTE_TOKENIZE || route == SRV_ROUTE_EMBEDDINGS ||
                                                   route == SRV_ROUTE_DETOKENIZE ? "POST, OPTIONS" : "GET, OPTIONS";
    return send_buf(h, c, route, e->status, "application/json", t, strlen(t), hn, hv);
}

/* ---- the client went away? ---- */

static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t k = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0) return 1;
    return k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

/* ---- completions ---- */

static const char *finish_name(int f) { return f == SRV_FINISH_LENGTH ? "length" : "stop"; }

static cJSON *usage_json(const srv_req *r) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->n_cached);
    return u;
}

/* llama-server's extra field: prompt and generation speed of this request */
static cJSON *timings_json(const srv_req *r) {
    cJSON *t = cJSON_CreateObject();
    double pd = r->t_prompt_done > 0 ? r->t_prompt_done : r->t_done, gen_s = r->t_done - pd;
    cJSON_AddNumberToObject(t, "cache_n", r->n_cached);
    cJSON_AddNumberToObject(t, "cache_disk_n", r->n_disk); /* of cache_n, from the disk prefix cache */
    cJSON_AddNumberToObject(t, "prompt_n", r->n_prompt - r->n_cached);
    cJSON_AddNumberToObject(t, "prompt_ms", 1e3 * (pd - r->t_submit));
    cJSON_AddNumberToObject(t, "predicted_n", r->n_gen);
    cJSON_AddNumberToObject(t, "predicted_ms", 1e3 * gen_s);
    cJSON_AddNumberToObject(t, "predicted_per_second", gen_s > 0 ? r->n_gen / gen_s : 0);
    cJSON_AddNumberToObject(t, "draft_n", r->draft_n); /* --draft/--lookup: tokens drafted, accepted */
    cJSON_AddNumberToObject(t, "draft_n_accepted", r->draft_accepted);
    return t;
}

static cJSON *envelope(srv_http *h, const srv_req *r, const char *object) {
    char id[48];
    snprintf(id, sizeof id, "%s-%ld", r->chat ? "chatcmpl" : "cmpl", r->id);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)time(NULL));
    cJSON_AddStringToObject(j, "model", h->model_name);
    srv_add_fingerprint(j, r->json);
    return j;
}

/* ---- logprobs as OpenAI writes them ---- */

/* One choice: text (NULL: none), finish reason (0: null), logprobs (NULL: null; taken). */
static cJSON *choice(const srv_req *r, const char *text, int finish, int delta, int role, cJSON *lp) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    if (r->chat) {
        cJSON *m = cJSON_AddObjectToObject(ch, delta ? "delta" : "message");
        if (role) cJSON_AddStringToObject(m, "role", "assistant");
        if (text) cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(ch, "text", text ? text : "");
    }
    if (lp) cJSON_AddItemToObject(ch, "logprobs", lp);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish_name(finish));
    else cJSON_AddNullToObject(ch, "finish_reason");
    return ch;
}

typedef struct {
    srv_http *h;
    srv_req *r;
    struct MHD_Connection *c;
    srv_buf out; /* formatted events not yet handed to MHD */
    size_t off;
    int include_usage, started, ended;
    char *echo;      /* completions with echo: the prompt's text, sent first */
    int lp_seen;     /* logprob entries sent so far */
    int tools;       /* the request has tools: text that may start a call is held back */
    body all;        /* with tools: the reply so far; all.p[0..sent) went out as content */
    size_t sent;
} stream;

static void sse(stream *st, cJSON *j) { srv_sse_event(&st->out, j); }

/* The logprobs of a request's entries first..first+n (NULL when none were asked for). */
static cJSON *logprobs_json(srv_http *h, const srv_req *r, const srv_lp *lp, int n, int first, const char *echo) {
    if (!r->logprobs) return NULL;
    if (r->chat) return srv_chat_logprobs_json(h->tok, lp, n);
    return srv_cmpl_logprobs_json(h->tok, lp, n, first, r->echo ? r->n_prompt : 0, echo ? strlen(echo) : 0);
}

static void sse_chunk(stream *st, const char *text, int finish, int role, const srv_lp *lp, int n_lp) {
    const srv_req *r = st->r;
    cJSON *j = envelope(st->h, r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *chs = cJSON_AddArrayToObject(j, "choices");
    cJSON *lpj = n_lp ? logprobs_json(st->h, r, lp, n_lp, st->lp_seen, st->echo) : NULL;
    st->lp_seen += n_lp;
    cJSON_AddItemToArray(chs, choice(r, text, finish, 1, role, lpj));
    if (finish) cJSON_AddItemToObject(j, "timings", timings_json(r));
    if (st->include_usage) cJSON_AddNullToObject(j, "usage");
    sse(st, j);
}

/* The end of a reply with tools: its calls as delta.tool_calls, else the held text. */
static void stream_tools_end(stream *st) {
    const srv_req *r = st->r;
    cJSON *j = envelope(st->h, r, "chat.completion.chunk");
    cJSON *ch = choice(r, NULL, r->finish, 1, 0, NULL);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), ch);
    if (!srv_tools_reply(st->h->tmpl, st->all.p, ch, 1) && st->all.n > st->sent)
        sse_chunk(st, st->all.p + st->sent, 0, 0, NULL, 0);
    cJSON_AddItemToObject(j, "timings", timings_json(r));
    if (st->include_usage) cJSON_AddNullToObject(j, "usage");
    sse(st, j);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    (void)pos;
    while (st->off == st->out.n) {
        st->off = st->out.n = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        srv_req *r = st->r;
        if (!st->started) {
            st->started = 1;
            if (r->chat) {
                sse_chunk(st, "", 0, 1, NULL, 0);
                continue;
            }
            if (st->echo && *st->echo) {
                sse_chunk(st, st->echo, 0, 0, NULL, 0);
                continue;
            }
        }
        char *chunk;
        size_t n;
        int done, n_lp = 0;
        srv_lp *lp = NULL;
        if (!srv_req_wait(st->h->s, r, 100, &chunk, &n, r->logprobs ? &lp : NULL, &n_lp, &done)) {
            if (client_gone(st->c)) {
                srv_req_cancel(st->h->s, r);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        if (st->tools && chunk) { /* send only what surely is no tool call */
            body_add(&st->all, chunk, n);
            size_t k = kvq_chat_tools_plain_prefix(st->h->tmpl, st->all.p);
            free(chunk);
            chunk = NULL;
            if (k > st->sent && (chunk = malloc(k - st->sent + 1))) {
                memcpy(chunk, st->all.p + st->sent, k - st->sent);
                chunk[k - st->sent] = 0;
                st->sent = k;
            }
        }
        if (chunk || n_lp) sse_chunk(st, chunk, 0, 0, lp, n_lp);
        free(chunk);
        free(lp);
        if (done) {
            int usage = st->include_usage && !r->err.status;
            if (!r->err.status && st->tools) stream_tools_end(st);
            else if (!r->err.status) sse_chunk(st, NULL, r->finish, 0, NULL, 0);
            srv_sse_end(&st->out, &r->err, usage ? envelope(st->h, r, r->chat ? "chat.completion.chunk" : "text_completion") : NULL,
                        NULL, usage ? usage_json(r) : NULL);
            st->ended = 1;
        }
    }
    size_t k = st->out.n - st->off < max ? st->out.n - st->off : max;
    memcpy(buf, st->out.p + st->off, k);
    st->off += k;
    return (ssize_t)k;
}

static void stream_free(void *cls) {
    stream *st = cls;
    srv_req_cancel(st->h->s, st->r); /* nothing when it is done */
    srv_req_release(st->h->s, st->r);
    free(st->out.p);
    free(st->all.p);
    free(st->echo);
    free(st);
}

/* The prompt of a request as token ids; *plain_chat for chat without a template. */
static int32_t *prompt_ids(srv_http *h, const srv_params *p, int *n, srv_error *e) {
    const int n_vocab = kvq_model_n_vocab(srv_model(h->s));
    int32_t *ids = NULL;
    if (p->prompt_ids) {
        for (int i = 0; i < p->n_prompt_ids; i++)
            if (p->prompt_ids[i] >= n_vocab)
                return srv_fail(e, 400, "invalid_value", "prompt[%d] = %d is not a token id (the vocabulary has %d)", i,
                                (int)p->prompt_ids[i], n_vocab), NULL;
        if (!(ids = malloc(sizeof *ids * (size_t)p->n_prompt_ids))) return srv_fail(e, 500, NULL, "out of memory"), NULL;
        memcpy(ids, p->prompt_ids, sizeof *ids * (size_t)p->n_prompt_ids);
        *n = p->n_prompt_ids;
        return ids;
    }
    char *rendered = NULL;
    const char *text = p->prompt;
    int bos = 1;
    if (p->chat) {
        if (srv_tools_check(h->tmpl, p, e)) return NULL;
        int len = kvq_chat_render_tools(h->tmpl, p->msgs, p->n_msgs, p->tools_json, 1, NULL, 0);
        if (len < 0) return srv_fail(e, 400, "invalid_messages", "the chat template rejects the messages: %s", kvq_last_error()), NULL;
        if (!(rendered = malloc((size_t)len + 1))) return srv_fail(e, 500, NULL, "out of memory"), NULL;
        kvq_chat_render_tools(h->tmpl, p->msgs, p->n_msgs, p->tools_json, 1, rendered, (size_t)len + 1);
        char *prefill = srv_tools_prefill(h->tmpl, p), *joined = NULL;
        if (prefill && (joined = malloc((size_t)len + strlen(prefill) + 1))) {
            memcpy(joined, rendered, (size_t)len);
            strcpy(joined + len, prefill);
            free(rendered);
            rendered = joined;
        }
        free(prefill);
        text = rendered;
        bos = 0; /* the template places BOS */
    }
    size_t len = strlen(text);
    int k = kvq_tokenize(h->tok, text, len, bos, NULL, 0);
    if (k < 0) srv_fail(e, 400, "invalid_prompt", "cannot tokenize the prompt: %s", kvq_last_error());
    else if (!(ids = malloc(sizeof *ids * (size_t)(k + 1)))) srv_fail(e, 500, NULL, "out of memory");
    else kvq_tokenize(h->tok, text, len, bos, ids, k);
    free(rendered);
    *n = k;
    return ids;
}

static int gone_cb(void *c) { return client_gone(c); }

static ssize_t choices_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_choices *ch = *(srv_choices **)cls;
    (void)pos;
    long k = srv_choices_stream(ch, buf, max, gone_cb, ((void **)cls)[1]);
    return k > 0 ? (ssize_t)k : k == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void choices_free(void *cls) {
    srv_choices_free(*(srv_choices **)cls);
    free(cls);
}

/* n > 1 (server_choices.c): takes p, ids and echo. n above the slots is refused rather than
 * left waiting for slots that never come free together. */
static mhd_result choices(srv_http *h, struct MHD_Connection *c, int route, srv_params *p, int32_t *ids, int n, char *echo) {
    srv_error e = {0};
    srv_req *r[SRV_MAX_CHOICES];
    int stream_it = p->stream, usage = p->include_usage, k = (int)p->n;
    int tools = p->tools_json != NULL;
    char *prefill = srv_tools_prefill(h->tmpl, p); /* each choice's reply goes on from it */
    if (k > srv_n_slots(h->s)) {
        srv_fail(&e, 400, "invalid_value", "'n' is %d; this server runs %d slots (-np), one per choice", k, srv_n_slots(h->s));
        free(ids);
    } else {
        srv_submit_n(h->s, p, ids, n, route == SRV_ROUTE_CHAT && h->plain, r, &e);
    }
    srv_params_free(p);
    if (e.status) {
        free(echo);
        free(prefill);
        return send_error(h, c, route, &e);
    }
    srv_choices *ch = srv_choices_new(h->s, h->tok, h->model_name, r, k, echo, usage);
    if (ch && tools) srv_choices_tools(ch, h->tmpl, prefill); /* takes prefill */
    else free(prefill);
    if (!ch) return MHD_NO;
    if (!stream_it) {
        cJSON *j = srv_choices_wait(ch, gone_cb, c, &e);
        srv_choices_free(ch);
        return j ? send_json(h, c, route, 200, j) : e.status ? send_error(h, c, route, &e) : MHD_NO;
    }
    void **cls = malloc(2 * sizeof *cls);
    struct MHD_Response *resp = cls ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, choices_read, cls, choices_free) : NULL;
    if (!resp) {
        free(cls);
        srv_choices_free(ch);
        return MHD_NO;
    }
    cls[0] = ch, cls[1] = c;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    cors(resp);
    mhd_result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    srv_count_request(h->s, route, 200);
    return ret;
}

static mhd_result completion(srv_http *h, struct MHD_Connection *c, int route, const body *b) {
    srv_error e = {0};
    srv_params p;
    if (srv_parse_completion(b->p, b->n, route == SRV_ROUTE_CHAT, &p, &e)) return send_error(h, c, route, &e);
    int n = 0, n_ctx = srv_n_ctx(h->s);
    int32_t *ids = prompt_ids(h, &p, &n, &e);
    p.tools_fmt = p.chat ? kvq_chat_template_tools(h->tmpl) : NULL; /* forced calls (srv_call) follow it */
    if (ids && n == 0) {
        srv_fail(&e, 400, "invalid_prompt", "the prompt is empty (no tokens)");
        free(ids);
        ids = NULL;
    } else if (ids && n >= n_ctx) {
        srv_fail(&e, 400, "context_length_exceeded",
                 "the prompt is %d tokens; the context holds %d, with room for at least one generated token (-c %d would fit)", n,
                 n_ctx, (n + 1 + 255) / 256 * 256);
        free(ids);
        ids = NULL;
    }
    if (!ids) {
        srv_params_free(&p);
        return send_error(h, c, route, &e);
    }
    /* echo: the prompt as sent, or the ids' text */
    char *echo = NULL;
    if (p.echo && p.prompt) echo = strdup(p.prompt);
    else if (p.echo) {
        int len = kvq_detokenize(h->tok, ids, n, 1, NULL, 0);
        if (len >= 0 && (echo = malloc((size_t)len + 1))) kvq_detokenize(h->tok, ids, n, 1, echo, (size_t)len + 1);
    }
    if (p.echo && !echo) {
        srv_params_free(&p);
        free(ids);
        srv_fail(&e, 500, NULL, "out of memory");
        return send_error(h, c, route, &e);
    }
    if (p.n > 1) return choices(h, c, route, &p, ids, n, echo);
    srv_req *r = srv_submit(h->s, &p, ids, n, route == SRV_ROUTE_CHAT && h->plain, &e);
    int stream_it = p.stream, usage = p.include_usage, tools = p.tools_json != NULL;
    char *prefill = srv_tools_prefill(h->tmpl, &p); /* the reply goes on from it */
    const char *pre = prefill ? prefill : "";
    srv_params_free(&p);
    if (!r) {
        free(echo);
        free(prefill);
        return send_error(h, c, route, &e);
    }
    if (stream_it) {
        stream *st = calloc(1, sizeof *st);
        struct MHD_Response *resp = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free) : NULL;
        if (!resp) {
            free(st);
            free(echo);
            free(prefill);
            srv_req_cancel(h->s, r);
            srv_req_release(h->s, r);
            return MHD_NO;
        }
        st->h = h;
        st->r = r;
        st->c = c;
        st->include_usage = usage;
        st->echo = echo;
        st->tools = tools;
        if (tools) { /* the prefilled call start counts as said, not sent */
            body_add(&st->all, pre, strlen(pre));
            st->sent = strlen(pre);
        }
        free(prefill);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        cors(resp);
        mhd_result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        srv_count_request(h->s, route, 200);
        return ret;
    }
    /* not streamed: wait here (this connection's thread), watching for the client leaving */
    body text = {0}, full = {0};
    body_add(&text, echo ? echo : "", echo ? strlen(echo) : 0);
    body_add(&full, pre, strlen(pre));
    body lps = {0}; /* the logprob entries, as bytes */
    double checked = kvq_tool_now();
    for (;;) {
        char *chunk;
        size_t k;
        int done = 0, n_lp = 0;
        srv_lp *lp = NULL;
        srv_req_wait(h->s, r, 50, &chunk, &k, r->logprobs ? &lp : NULL, &n_lp, &done);
        if (chunk) body_add(&text, chunk, k), body_add(&full, chunk, k);
        if (n_lp) body_add(&lps, (const char *)lp, sizeof *lp * (size_t)n_lp);
        free(chunk);
        free(lp);
        if (done) break;
        double now = kvq_tool_now();
        if (now - checked < 0.02) continue; /* a syscall per 20 ms is enough */
        checked = now;
        if (client_gone(c)) {
            srv_req_cancel(h->s, r);
            srv_req_release(h->s, r);
            free(text.p);
            free(full.p);
            free(prefill);
            free(lps.p);
            free(echo);
            return MHD_NO;
        }
    }
    mhd_result ret;
    if (r->err.status) {
        ret = send_error(h, c, route, &r->err);
    } else {
        cJSON *j = envelope(h, r, r->chat ? "chat.completion" : "text_completion");
        cJSON *lpj = logprobs_json(h, r, (const srv_lp *)lps.p, (int)(lps.n / sizeof(srv_lp)), 0, echo);
        cJSON *ch = choice(r, text.p, r->finish, 0, 1, lpj);
        if (tools) srv_tools_reply(h->tmpl, full.p, ch, 0);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), ch);
        cJSON_AddItemToObject(j, "usage", usage_json(r));
        cJSON_AddItemToObject(j, "timings", timings_json(r));
        ret = send_json(h, c, route, 200, j);
    }
    free(text.p);
    free(full.p);
    free(prefill);
    free(lps.p);
    free(echo);
    srv_req_release(h->s, r);
    return ret;
}

/* ---- the other routes ---- */

static mhd_result tokenize(srv_http *h, struct MHD_Connection *c, const body *b) {
    srv_error e = {0};
    char *content;
    int add_special;
    if (srv_parse_tokenize(b->p, b->n, &content, &add_special, &e)) return send_error(h, c, SRV_ROUTE_TOKENIZE, &e);
    size_t len = strlen(content);
    int n = kvq_tokenize(h->tok, content, len, add_special, NULL, 0);
    int32_t *ids = n >= 0 ? malloc(sizeof *ids * (size_t)(n + 1)) : NULL;
    if (!ids) {
        free(content);
        srv_fail(&e, n < 0 ? 400 : 500, NULL, "cannot tokenize: %s", n < 0 ? kvq_last_error() : "out of memory");
        return send_error(h, c, SRV_ROUTE_TOKENIZE, &e);
    }
    kvq_tokenize(h->tok, content, len, add_special, ids, n);
    free(content);
    cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "tokens");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    free(ids);
    return send_json(h, c, SRV_ROUTE_TOKENIZE, 200, j);
}

static mhd_result detokenize(srv_http *h, struct MHD_Connection *c, const body *b) {
    srv_error e = {0};
    int32_t *ids;
    int n;
    if (srv_parse_detokenize(b->p, b->n, &ids, &n, &e)) return send_error(h, c, SRV_ROUTE_DETOKENIZE, &e);
    const int n_vocab = kvq_model_n_vocab(srv_model(h->s));
    for (int i = 0; i < n; i++)
        if (ids[i] >= n_vocab) {
            srv_fail(&e, 400, "invalid_value", "tokens[%d] = %d is not a token id (the vocabulary has %d)", i, (int)ids[i], n_vocab);
            free(ids);
            return send_error(h, c, SRV_ROUTE_DETOKENIZE, &e);
        }
    int len = kvq_detokenize(h->tok, ids, n, 0, NULL, 0);
    char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (text) kvq_detokenize(h->tok, ids, n, 0, text, (size_t)len + 1);
    free(ids);
    if (!text) {
        srv_fail(&e, 400, NULL, "cannot detokenize: %s", kvq_last_error());
        return send_error(h, c, SRV_ROUTE_DETOKENIZE, &e);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "content", text);
    free(text);
    return send_json(h, c, SRV_ROUTE_DETOKENIZE, 200, j);
}

/* A slot file's name: letters, digits, '.', '_', '-', not starting with '.' (no way out of
 * --slot-save-path). */
static int good_filename(const char *f) {
    size_t n = strlen(f);
    if (n == 0 || n > 200 || f[0] == '.') return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)f[i]) && !strchr("._-", f[i])) return 0;
    return 1;
}

/* POST /slots/{id}?action=save|restore (body {"filename": NAME}, under --slot-save-path) or
 * action=erase: a slot's KV cache to or from disk, as llama-server's route. */
static mhd_result slots(srv_http *h, struct MHD_Connection *c, const char *url, const body *b) {
    srv_error e = {0};
    const char *id_s = url + strlen("/slots/"), *act = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    char *end;
    long id = strtol(id_s, &end, 10);
    int action = !act ? -1 : !strcmp(act, "save") ? SRV_SLOT_SAVE : !strcmp(act, "restore") ? SRV_SLOT_RESTORE
                                                   : !strcmp(act, "erase")  ? SRV_SLOT_ERASE : -1;
    if (!*id_s || *end || id < 0 || id > 1 << 20) srv_fail(&e, 400, NULL, "/slots/%.40s: the slot id is a number", id_s);
    else if (action < 0) srv_fail(&e, 400, NULL, "action=%.40s: want save, restore or erase", act ? act : "(none)");
    if (e.status) return send_error(h, c, SRV_ROUTE_SLOTS, &e);
    char path[4096] = "", name[256] = "";
    if (action != SRV_SLOT_ERASE) {
        if (!h->o->slot_save_path) {
            srv_fail(&e, 501, "not_supported", "slot %s needs the server started with --slot-save-path DIR", act);
            return send_error(h, c, SRV_ROUTE_SLOTS, &e);
        }
        cJSON *j = cJSON_ParseWithLength(b->p ? b->p : "", b->n);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "filename");
        if (!cJSON_IsString(f) || !good_filename(f->valuestring))
            srv_fail(&e, 400, NULL, "'filename': a file name of letters, digits, '.', '_' and '-' (not starting with '.')");
        else
            snprintf(name, sizeof name, "%s", f->valuestring);
        cJSON_Delete(j);
        if (e.status) return send_error(h, c, SRV_ROUTE_SLOTS, &e);
        snprintf(path, sizeof path, "%s/%s", h->o->slot_save_path, name);
    }
    srv_slot_result r = {0};
    if (srv_slot_action(h->s, (int)id, action, path, &r, &e)) return send_error(h, c, SRV_ROUTE_SLOTS, &e);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "id_slot", (double)id);
    if (action == SRV_SLOT_ERASE) {
        cJSON_AddNumberToObject(j, "n_erased", r.n_tokens);
    } else {
        int save = action == SRV_SLOT_SAVE;
        cJSON_AddStringToObject(j, "filename", name);
        cJSON_AddNumberToObject(j, save ? "n_saved" : "n_restored", r.n_tokens);
        cJSON_AddNumberToObject(j, save ? "n_written" : "n_read", (double)r.bytes);
        cJSON *t = cJSON_AddObjectToObject(j, "timings");
        cJSON_AddNumberToObject(t, save ? "save_ms" : "restore_ms", r.ms);
    }
    return send_json(h, c, SRV_ROUTE_SLOTS, 200, j);
}

static mhd_result models(srv_http *h, struct MHD_Connection *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", h->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->created);
    cJSON_AddStringToObject(m, "owned_by", "kvq");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_ctx", srv_n_ctx(h->s));
    cJSON_AddNumberToObject(meta, "n_slots", srv_n_slots(h->s));
    cJSON_AddNumberToObject(meta, "n_vocab", kvq_model_n_vocab(srv_model(h->s)));
    cJSON_AddStringToObject(meta, "chat_template", kvq_chat_template_name(h->tmpl));
    cJSON_AddStringToObject(meta, "desc", kvq_model_desc(srv_model(h->s)));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "data"), m);
    return send_json(h, c, SRV_ROUTE_MODELS, 200, j);
}

static mhd_result health(srv_http *h, struct MHD_Connection *c) {
    srv_snapshot sn;
    srv_snapshot_get(h->s, &sn);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", "ok");
    cJSON_AddNumberToObject(j, "slots_idle", sn.slots - sn.busy);
    cJSON_AddNumberToObject(j, "slots_processing", sn.busy);
    cJSON_AddNumberToObject(j, "queued", sn.queued);
    return send_json(h, c, SRV_ROUTE_HEALTH, 200, j);
}

static mhd_result metrics(srv_http *h, struct MHD_Connection *c) {
    srv_snapshot sn;
    srv_snapshot_get(h->s, &sn);
    char *t = srv_metrics_text(&sn);
    if (!t) return MHD_NO;
    return send_buf(h, c, SRV_ROUTE_METRICS, 200, "text/plain; version=0.0.4; charset=utf-8", t, strlen(t), NULL, NULL);
}

/* GET /stats: the counters as JSON (counted with /metrics) */
static mhd_result stats(srv_http *h, struct MHD_Connection *c) {
    srv_snapshot sn;
    srv_snapshot_get(h->s, &sn);
    cJSON *j = srv_stats_json(&sn);
    return j ? send_json(h, c, SRV_ROUTE_METRICS, 200, j) : MHD_NO;
}

static mhd_result ui(srv_http *h, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(kvq_server_ui_len, (void *)kvq_server_ui, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    mhd_result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    srv_count_request(h->s, SRV_ROUTE_UI, 200);
    return ret;
}

/* ---- routing ---- */

static const struct {
    const char *path;
    int route, post;
} ROUTES[] = {
    {"/v1/chat/completions", SRV_ROUTE_CHAT, 1}, {"/chat/completions", SRV_ROUTE_CHAT, 1},
    {"/v1/completions", SRV_ROUTE_COMPLETION, 1}, {"/completions", SRV_ROUTE_COMPLETION, 1},
    {"/v1/embeddings", SRV_ROUTE_EMBEDDINGS, 1}, {"/embeddings", SRV_ROUTE_EMBEDDINGS, 1},
    {"/tokenize", SRV_ROUTE_TOKENIZE, 1}, {"/detokenize", SRV_ROUTE_DETOKENIZE, 1},
    {"/v1/models", SRV_ROUTE_MODELS, 0}, {"/models", SRV_ROUTE_MODELS, 0},
    {"/health", SRV_ROUTE_HEALTH, 0}, {"/v1/health", SRV_ROUTE_HEALTH, 0},
    {"/metrics", SRV_ROUTE_METRICS, 0}, {"/stats", SRV_ROUTE_METRICS, 0}, {"/", SRV_ROUTE_UI, 0}, {"/index.html", SRV_ROUTE_UI, 0},
};

static int authorized(srv_http *h, struct MHD_Connection *c) {
    const char *key = h->o->api_key;
    if (!key || !*key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7)) return 0;
    a += 7;
    size_t la = strlen(a), lk = strlen(key);
    unsigned diff = la != lk;
    for (size_t i = 0; i < lk; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < la ? a[i] : 0);
    return !diff;
}

static mhd_result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                          const char *upload, size_t *upload_size, void **con_cls) {
    srv_http *h = cls;
    (void)version;
    body *b = *con_cls;
    srv_error e = {0};
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return MHD_NO;
        *con_cls = b;
        pthread_mutex_lock(&h->mu);
        h->in_flight++;
        pthread_mutex_unlock(&h->mu);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
        if (len > SRV_MAX_BODY) {
            b->too_large = 1;
            /* up to 64 MiB is read and dropped, so the client sees the answer rather than a
             * reset while it writes; beyond, the answer goes now and the connection closes */
            if (len > (64ull << 20)) {
                srv_fail(&e, 413, "body_too_large", "the request body is %s bytes; the limit is %u", cl, SRV_MAX_BODY);
                return send_error(h, c, -1, &e);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!b->too_large && (b->n + *upload_size > SRV_MAX_BODY || body_add(b, upload, *upload_size))) b->too_large = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    if (b->too_large) {
        srv_fail(&e, 413, "body_too_large", "the request body is over the limit of %u bytes", SRV_MAX_BODY);
        return send_error(h, c, -1, &e);
    }
    int route = -1, post = 0;
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++)
        if (!strcmp(url, ROUTES[i].path)) {
            route = ROUTES[i].route;
            post = ROUTES[i].post;
        }
    if (!strncmp(url, "/slots/", 7)) route = SRV_ROUTE_SLOTS, post = 1;
    if (!strcmp(method, "OPTIONS")) { /* CORS preflight */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        cors(r);
        mhd_result ret = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (route < 0) {
        srv_fail(&e, 404, "not_found", "no route %.100s %.200s", method, url);
        return send_error(h, c, -1, &e);
    }
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (post ? strcmp(method, "POST") : !is_get) {
        srv_fail(&e, 405, "method_not_allowed", "%.200s takes %s, not %.100s", url, post ? "POST" : "GET", method);
        return send_error(h, c, route, &e);
    }
    if (route != SRV_ROUTE_UI && route != SRV_ROUTE_HEALTH && !authorized(h, c)) {
        srv_fail(&e, 401, "invalid_api_key", "missing or wrong API key: send 'Authorization: Bearer <key>' (the server runs with --api-key)");
        return send_error(h, c, route, &e);
    }
    switch (route) {
    case SRV_ROUTE_CHAT:
    case SRV_ROUTE_COMPLETION: return completion(h, c, route, b);
    case SRV_ROUTE_TOKENIZE: return tokenize(h, c, b);
    case SRV_ROUTE_DETOKENIZE: return detokenize(h, c, b);
    case SRV_ROUTE_MODELS: return models(h, c);
    case SRV_ROUTE_HEALTH: return health(h, c);
    case SRV_ROUTE_METRICS: return strcmp(url, "/stats") ? metrics(h, c) : stats(h, c);
    case SRV_ROUTE_SLOTS: return slots(h, c, url, b);
    case SRV_ROUTE_EMBEDDINGS: {
        cJSON *j = srv_embeddings(h->s, h->model_name, b->p, b->n, &e);
        return j ? send_json(h, c, route, 200, j) : send_error(h, c, route, &e);
    }
    default: return ui(h, c);
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_http *h = cls;
    (void)c;
    (void)toe;
    body *b = *con_cls;
    if (b) {
        free(b->p);
        free(b);
        *con_cls = NULL;
        pthread_mutex_lock(&h->mu);
        h->in_flight--;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
}

int srv_http_start(srv_http **out, srv_server *s, const srv_opts *o, const char *model_name, const kvq_chat_template *tmpl,
                   int *bound_port) {
    *out = NULL;
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return kvq_tool_die(SRV_PROG, "out of memory");
    h->s = s;
    h->o = o;
    h->tmpl = tmpl;
    h->tok = kvq_model_tokenizer(srv_model(s));
    h->plain = !strcmp(kvq_chat_template_name(tmpl), "none");
    h->created = (long)time(NULL);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    snprintf(h->model_name, sizeof h->model_name, "%s", model_name);

    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%ld", o->port);
    int gr = getaddrinfo(o->host, port, &hints, &ai);
    if (gr || !ai) {
        free(h);
        return kvq_tool_die(SRV_PROG, "--host %s: %s", o->host, gai_strerror(gr));
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, handler, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_CONNECTION_LIMIT, 512u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 300u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 << 10),
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return kvq_tool_die(SRV_PROG, "cannot listen on %s port %ld (in use, or not an address of this machine?)", o->host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    *bound_port = (int)o->port;
    if (di && !getsockname(di->listen_fd, (struct sockaddr *)&sa, &sl))
        *bound_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    *out = h;
    return 0;
}

void srv_http_quiesce(srv_http *h) {
    if (!h || !h->d) return;
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void srv_http_drain(srv_http *h, double seconds) {
    if (!h) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)seconds;
    pthread_mutex_lock(&h->mu);
    while (h->in_flight > 0)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts)) break;
    pthread_mutex_unlock(&h->mu);
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}
