/* kvq-server, n > 1 on the HTTP side: the answer of a request's n choices (one srv_req each,
 * sharing the prompt's cache: server_fork.c), whole or as server-sent events whose chunks
 * carry each choice's index. usage counts the prompt once and the completions summed. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "server.h"

struct srv_choices {
    srv_server *s;
    const kvq_tokenizer *tok;
    const char *model;
    srv_req **r;
    int n, include_usage, started, ended;
    char *echo;
    srv_buf *text, *lps; /* per choice: the reply so far; its logprob entries as bytes (whole answer) */
    int *lp_seen, *closed;
    srv_buf out; /* events not yet read */
    const kvq_chat_template *tmpl; /* with tools: each reply's calls are parsed (not streamed) */
    char *prefill;                 /* the forced call's opening the replies go on from */
    size_t off;
};

srv_choices *srv_choices_new(srv_server *s, const kvq_tokenizer *tok, const char *model, srv_req **r, int n, char *echo,
                             int include_usage) {
    srv_choices *c = calloc(1, sizeof *c);
    if (c) {
        c->text = calloc((size_t)n, sizeof *c->text);
        c->lps = calloc((size_t)n, sizeof *c->lps);
        c->lp_seen = calloc((size_t)n, sizeof *c->lp_seen);
        c->closed = calloc((size_t)n, sizeof *c->closed);
        c->r = malloc(sizeof *c->r * (size_t)n);
    }
    if (!c || !c->text || !c->lps || !c->lp_seen || !c->closed || !c->r) {
        if (c) c->n = 0, c->echo = NULL, srv_choices_free(c);
        for (int i = 0; i < n; i++) srv_req_cancel(s, r[i]), srv_req_release(s, r[i]);
        free(echo);
        return NULL;
    }
    memcpy(c->r, r, sizeof *r * (size_t)n);
    c->s = s, c->tok = tok, c->model = model, c->n = n, c->echo = echo, c->include_usage = include_usage;
    return c;
}

void srv_choices_free(srv_choices *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        srv_req_cancel(c->s, c->r[i]); /* nothing when it is done */
        srv_req_release(c->s, c->r[i]);
        free(c->text[i].p);
        free(c->lps[i].p);
    }
    free(c->r);
    free(c->text);
    free(c->lps);
    free(c->lp_seen);
    free(c->closed);
    free(c->echo);
    free(c->prefill);
    free(c->out.p);
    free(c);
}

static cJSON *envelope(const srv_choices *c, const char *object) {
    const srv_req *r = c->r[0];
    char id[48];
    snprintf(id, sizeof id, "%s-%ld", r->chat ? "chatcmpl" : "cmpl", r->id);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)time(NULL));
    cJSON_AddStringToObject(j, "model", c->model);
    srv_add_fingerprint(j, r->json);
    return j;
}

static cJSON *usage_json(const srv_choices *c) {
    int gen = 0;
    for (int i = 0; i < c->n; i++) gen += c->r[i]->n_gen;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", c->r[0]->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", gen);
    cJSON_AddNumberToObject(u, "total_tokens", c->r[0]->n_prompt + gen);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", c->r[0]->n_cached);
    return u;
}

/* The lead's prompt figures; generation summed over the choices, over the time all took. */
static cJSON *timings_json(const srv_choices *c) {
    const srv_req *r = c->r[0];
    double pd = r->t_prompt_done > 0 ? r->t_prompt_done : r->t_done, end = r->t_done;
    int gen = 0, dn = 0, da = 0;
    for (int i = 0; i < c->n; i++) {
        gen += c->r[i]->n_gen;
        dn += c->r[i]->draft_n, da += c->r[i]->draft_accepted;
        if (c->r[i]->t_done > end) end = c->r[i]->t_done;
    }
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "cache_n", r->n_cached);
    cJSON_AddNumberToObject(t, "cache_disk_n", r->n_disk);
    cJSON_AddNumberToObject(t, "prompt_n", r->n_prompt - r->n_cached);
    cJSON_AddNumberToObject(t, "prompt_ms", 1e3 * (pd - r->t_submit));
    cJSON_AddNumberToObject(t, "predicted_n", gen);
    cJSON_AddNumberToObject(t, "predicted_ms", 1e3 * (end - pd));
    cJSON_AddNumberToObject(t, "predicted_per_second", end > pd ? gen / (end - pd) : 0);
    cJSON_AddNumberToObject(t, "draft_n", dn);
    cJSON_AddNumberToObject(t, "draft_n_accepted", da);
    return t;
}

/* Choice i's entries lp[0..n) (first: entries of it already sent); NULL when none were asked. */
static cJSON *logprobs_json(const srv_choices *c, int i, const srv_lp *lp, int n, int first) {
    const srv_req *r = c->r[i];
    if (!r->logprobs) return NULL;
    if (r->chat) return srv_chat_logprobs_json(c->tok, lp, n);
    return srv_cmpl_logprobs_json(c->tok, lp, n, first, r->echo ? r->n_prompt : 0, c->echo ? strlen(c->echo) : 0);
}

static cJSON *choice(const srv_choices *c, int i, const char *text, int finish, int delta, int role, cJSON *lp) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    if (c->r[i]->chat) {
        cJSON *m = cJSON_AddObjectToObject(ch, delta ? "delta" : "message");
        if (role) cJSON_AddStringToObject(m, "role", "assistant");
        if (text) cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(ch, "text", text ? text : "");
    }
    if (lp) cJSON_AddItemToObject(ch, "logprobs", lp);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish == SRV_FINISH_LENGTH ? "length" : "stop");
    else cJSON_AddNullToObject(ch, "finish_reason");
    return ch;
}

/* Takes what each choice has made since the last call; waits up to ms on one when none had
 * anything. Returns 1 when every choice is done. on_new(i, text, lp, n_lp) sees the news. */
static int poll(srv_choices *c, int ms, void (*on_new)(srv_choices *, int, char *, size_t, srv_lp *, int)) {
    int all = 1, got = 0, wait_on = -1;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < c->n; i++) {
            if (c->closed[i] || (pass && i != wait_on)) continue;
            char *chunk;
            size_t k;
            int done = 0, n_lp = 0;
            srv_lp *lp = NULL;
            srv_req_wait(c->s, c->r[i], pass ? ms : 0, &chunk, &k, c->r[i]->logprobs ? &lp : NULL, &n_lp, &done);
            if (chunk || n_lp) got = 1, on_new(c, i, chunk, k, lp, n_lp);
            free(chunk);
            free(lp);
            if (done) c->closed[i] = 1, on_new(c, i, NULL, 0, NULL, -1), got = 1;
            else if (wait_on < 0) wait_on = i;
        }
        if (got || wait_on < 0) break;
    }
    for (int i = 0; i < c->n; i++) all &= c->closed[i];
    return all;
}

void srv_choices_tools(srv_choices *c, const kvq_chat_template *t, char *prefill) {
    c->tmpl = t;
    c->prefill = prefill;
}

/* Choice i's calls (its text after the prefilled call opening) into its message. */
static void tools_reply(const srv_choices *c, int i, cJSON *ch) {
    srv_buf t = {0};
    if (c->prefill) srv_buf_add(&t, c->prefill, strlen(c->prefill));
    if (c->text[i].n) srv_buf_add(&t, c->text[i].p, c->text[i].n);
    srv_tools_reply(c->tmpl, t.p ? t.p : "", ch, 0);
    free(t.p);
}

static void keep(srv_choices *c, int i, char *t, size_t k, srv_lp *lp, int n_lp) {
    if (t) srv_buf_add(&c->text[i], t, k);
    if (n_lp > 0) srv_buf_add(&c->lps[i], (const char *)lp, sizeof *lp * (size_t)n_lp);
}

cJSON *srv_choices_wait(srv_choices *c, int (*gone)(void *), void *arg, srv_error *e) {
    double checked = kvq_tool_now();
    while (!poll(c, 50, keep)) {
        double now = kvq_tool_now();
        if (now - checked < 0.02) continue;
        checked = now;
        if (gone(arg)) return NULL; /* e untouched: nobody to answer */
    }
    for (int i = 0; i < c->n; i++)
        if (c->r[i]->err.status) return *e = c->r[i]->err, NULL;
    const srv_req *r = c->r[0];
    cJSON *j = envelope(c, r->chat ? "chat.completion" : "text_completion"), *chs = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < c->n; i++) {
        srv_buf t = {0};
        if (c->echo) srv_buf_add(&t, c->echo, strlen(c->echo));
        if (c->text[i].n) srv_buf_add(&t, c->text[i].p, c->text[i].n);
        cJSON *lpj = logprobs_json(c, i, (const srv_lp *)c->lps[i].p, (int)(c->lps[i].n / sizeof(srv_lp)), 0);
        cJSON *ch = choice(c, i, t.p ? t.p : "", c->r[i]->finish, 0, 1, lpj);
        if (c->tmpl) tools_reply(c, i, ch);
        cJSON_AddItemToArray(chs, ch);
        free(t.p);
    }
    cJSON_AddItemToObject(j, "usage", usage_json(c));
    cJSON_AddItemToObject(j, "timings", timings_json(c));
    return j;
}

static void sse(srv_choices *c, cJSON *j) { srv_sse_event(&c->out, j); }

/* One chunk of choice i (n_lp -1: its end). */
static void event(srv_choices *c, int i, char *t, size_t k, srv_lp *lp, int n_lp) {
    (void)k;
    const srv_req *r = c->r[i];
    if (n_lp < 0 && r->err.status) return; /* the stream's end says it */
    cJSON *j = envelope(c, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *lpj = n_lp > 0 ? logprobs_json(c, i, lp, n_lp, c->lp_seen[i]) : NULL;
    if (n_lp > 0) c->lp_seen[i] += n_lp;
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), choice(c, i, n_lp < 0 ? NULL : t, n_lp < 0 ? r->finish : 0, 1, 0, lpj));
    if (c->include_usage) cJSON_AddNullToObject(j, "usage");
    sse(c, j);
}

long srv_choices_stream(srv_choices *c, char *buf, size_t max, int (*gone)(void *), void *arg) {
    while (c->off == c->out.n) {
        c->off = c->out.n = 0;
        if (c->ended) return 0;
        if (!c->started) {
            c->started = 1;
            for (int i = 0; i < c->n; i++) { /* chat: the role first; completions: the echo */
                if (!c->r[i]->chat && !(c->echo && *c->echo)) break;
                cJSON *j = envelope(c, c->r[i]->chat ? "chat.completion.chunk" : "text_completion");
                cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), choice(c, i, c->r[i]->chat ? "" : c->echo, 0, 1, c->r[i]->chat, NULL));
                if (c->include_usage) cJSON_AddNullToObject(j, "usage");
                sse(c, j);
            }
            continue;
        }
        int all = poll(c, 100, event);
        if (!all && c->out.n == 0 && gone(arg)) return -1;
        if (!all) continue;
        const srv_error *bad = NULL;
        for (int i = 0; i < c->n && !bad; i++)
            if (c->r[i]->err.status) bad = &c->r[i]->err;
        int usage = c->include_usage && !bad;
        srv_sse_end(&c->out, bad, usage ? envelope(c, c->r[0]->chat ? "chat.completion.chunk" : "text_completion") : NULL,
                    usage ? timings_json(c) : NULL, usage ? usage_json(c) : NULL);
        c->ended = 1;
    }
    size_t k = c->out.n - c->off < max ? c->out.n - c->off : max;
    memcpy(buf, c->out.p + c->off, k);
    c->off += k;
    return (long)k;
}
