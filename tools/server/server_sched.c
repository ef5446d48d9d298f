/* kvq-server: the slots (one kvq_context each, all on one model) and the
 * scheduler thread. Every step makes one kvq_eval_batch call holding the
 * pending token of each decoding slot, then reads at most one chunk of one
 * slot's prompt, so a long prompt is read between decode steps instead of
 * stalling the streams already running. A request takes the free slot whose cached
 * tokens share the longest prefix with its prompt and evaluates only the rest. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common.h"
#include "server.h"
#include "server_sched.h"
#include "server_spec.h"

int srv_buf_add(srv_buf *b, const char *s, size_t k) {
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + k + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
    return 0;
}


int srv_n_ctx(const srv_server *s) { return s->n_ctx; }
int srv_n_slots(const srv_server *s) { return s->n_slots; }
kvq_model *srv_model(srv_server *s) { return s->m; }

static void req_free(srv_req *r) {
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->text);
    free(r->lp);
    free(r->prompt_off);
    kvq_json_constraint_free(r->json);
    srv_call_free(r->call);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* Under the lock. */
static void req_unref(srv_req *r) {
    if (--r->refs == 0) req_free(r);
}

void srv_req_release(srv_server *s, srv_req *r) {
    pthread_mutex_lock(&s->mu);
    req_unref(r);
    pthread_mutex_unlock(&s->mu);
}

void srv_req_cancel(srv_server *s, srv_req *r) {
    pthread_mutex_lock(&s->mu);
    if (!r->done) {
        r->cancelled = 1;
        s->met.disconnects++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

int srv_req_wait(srv_server *s, srv_req *r, int ms, char **chunk, size_t *n_chunk, srv_lp **lp, int *n_lp, int *done) {
    *chunk = NULL;
    *n_chunk = 0;
    if (lp) *lp = NULL, *n_lp = 0;
    pthread_mutex_lock(&s->mu);
    if (r->sent == r->n_text && (!lp || r->lp_sent == r->n_lp) && !r->done && ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&r->cv, &s->mu, &ts);
    }
    int got = 0;
    if (r->sent < r->n_text && (*chunk = malloc(r->n_text - r->sent + 1))) {
        *n_chunk = r->n_text - r->sent;
        memcpy(*chunk, r->text + r->sent, *n_chunk);
        (*chunk)[*n_chunk] = 0;
        r->sent = r->n_text;
        got = 1;
    }
    if (lp && r->lp_sent < r->n_lp && (*lp = malloc(sizeof **lp * (size_t)(r->n_lp - r->lp_sent)))) {
        *n_lp = r->n_lp - r->lp_sent;
        memcpy(*lp, r->lp + r->lp_sent, sizeof **lp * (size_t)*n_lp);
        r->lp_sent = r->n_lp;
        got = 1;
    }
    *done = r->done && r->sent == r->n_text && (!lp || r->lp_sent == r->n_lp);
    pthread_mutex_unlock(&s->mu);
    return got || *done;
}

/* Ends the slot's request (under the lock): publishes, wakes its connection, frees the slot. */
static void finish_slot(srv_server *s, slot *sl, int finish) {
    srv_req *r = sl->r;
    r->finish = finish;
    r->done = 1;
    r->t_done = kvq_tool_now();
    for (int i = 0; i < r->n_gen; i++) sl->counts[sl->gen[i]] = 0;
    kvq_detok_free(sl->dt);
    sl->dt = NULL;
    kvq_sampler_free(sl->smp);
    sl->smp = NULL;
    sl->has_pending = 0;
    sl->hold.n = sl->out.n = 0;
    sl->n_lp = 0;
    sl->last_use = r->t_done;
    sl->r = NULL;
    if (r->group > 1) srv_orphan_choices(s, r);
    pthread_cond_broadcast(&r->cv);
    req_unref(r);
}

static uint64_t random_seed(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = (uint64_t)(kvq_tool_now() * 1e9);
    return v;
}

/* A request for choice `index` of p (seed + index when p has a seed); takes prompt. */
/* NULL with e filled when the response_format constraint cannot be made (e->status set), else
 * NULL when out of memory. */
static srv_req *req_new(srv_server *s, const srv_params *p, int32_t *prompt, int n_prompt, int plain_chat, int index,
                       srv_error *e) {
    int n_ctx = s->n_ctx;
    srv_req *r = calloc(1, sizeof *r);
    if (!r) {
        free(prompt);
        return NULL;
    }
    pthread_cond_init(&r->cv, NULL);
    r->chat = p->chat;
    r->plain_chat = plain_chat;
    r->prompt = prompt;
    r->n_prompt = n_prompt;
    long room = n_ctx - n_prompt;
    r->max_tokens = p->max_tokens >= 0 && p->max_tokens < room ? p->max_tokens : room; /* 0: echo only */
    r->logprobs = p->logprobs;
    r->n_top = (int)p->top_logprobs;
    r->echo = p->echo;
    r->sp = kvq_sampler_default_params();
    if (p->has_temperature) r->sp.temp = (float)p->temperature;
    if (p->has_top_p) r->sp.top_p = (float)p->top_p;
    if (p->has_top_k) r->sp.top_k = (int)p->top_k;
    if (p->has_min_p) r->sp.min_p = (float)p->min_p;
    r->sp.repeat_penalty = 1.0f;
    r->sp.seed = p->has_seed ? p->seed + (uint64_t)index : random_seed();
    r->presence = (float)p->presence_penalty;
    r->frequency = (float)p->frequency_penalty;
    for (int i = 0; i < p->n_stop; i++)
        if ((r->stop[r->n_stop] = strdup(p->stop[i]))) r->n_stop++;
    if ((p->json_mode && !(r->json = srv_json_constraint(s->tok, p, e))) || (!(r->call = srv_call_new(s->tok, p, e)) && e->status)) {
        req_free(r);
        return NULL;
    }
    r->refs = 2;
    r->slot = -1;
    r->index = index;
    r->t_submit = kvq_tool_now();
    return r;
}

int srv_submit_n(srv_server *s, const srv_params *p, int32_t *prompt, int n_prompt, int plain_chat, srv_req **out, srv_error *e) {
    int n = p->n > 1 ? (int)p->n : 1;
    for (int i = 0; i < n; i++) out[i] = NULL;
    for (int i = 0; i < n; i++) {
        int32_t *ids = prompt;
        if (i > 0 && (ids = malloc(sizeof *ids * (size_t)n_prompt))) memcpy(ids, prompt, sizeof *ids * (size_t)n_prompt);
        e->status = 0;
        if (!ids || !(out[i] = req_new(s, p, ids, n_prompt, plain_chat, i, e))) {
            for (int k = 0; k < i; k++) req_free(out[k]);
            for (int k = 0; k < n; k++) out[k] = NULL;
            if (ids && e->status) return -1; /* the constraint's 400 */
            return srv_fail(e, 500, NULL, "out of memory");
        }
        out[i]->lead = i ? out[0] : NULL;
    }
    out[0]->group = n;
    pthread_mutex_lock(&s->mu);
    int busy = 0;
    for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].r != NULL;
    if (s->stop || (busy == s->n_slots && s->n_queued >= s->queue_max)) {
        int stopping = s->stop;
        s->met.rejected_busy++;
        pthread_mutex_unlock(&s->mu);
        for (int k = 0; k < n; k++) req_free(out[k]), out[k] = NULL;
        if (stopping) return srv_fail(e, 503, "shutting_down", "the server is shutting down");
        return srv_fail(e, 503, "server_busy", "all %d slots are busy and %d requests are waiting; retry later", busy, s->queue_max);
    }
    for (int i = 0; i < n; i++) {
        srv_req *r = out[i];
        r->id = i ? out[0]->id : ++s->next_id;
        r->queued = 1;
        if (busy + s->n_queued >= s->n_slots) s->met.queued_total++;
        if (s->q_tail) s->q_tail->next = r;
        else s->q_head = r;
        s->q_tail = r;
        s->n_queued++;
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

srv_req *srv_submit(srv_server *s, const srv_params *p, int32_t *prompt, int n_prompt, int plain_chat, srv_error *e) {
    srv_params one = *p;
    one.n = 1;
    srv_req *r;
    return srv_submit_n(s, &one, prompt, n_prompt, plain_chat, &r, e) ? NULL : r;
}

/* Under the lock: the free slot whose cache serves r: the longest shared prefix among the slots
 * that would keep at least half of what they hold, or that hold all of r's prompt (r continues
 * or repeats that slot's conversation; an empty slot always qualifies). Otherwise the least
 * recently used free slot: a prefix of a few tokens (BOS, a greeting) is not worth another
 * conversation's cache, which its next turn would find gone. */
static slot *pick_slot(srv_server *s, const srv_req *r, int *common) {
    slot *best = NULL, *lru = NULL;
    int best_n = -1, lru_n = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->r) continue;
        int n = 0;
        while (n < sl->n_ids && n < r->n_prompt && sl->ids[n] == r->prompt[n]) n++;
        if (!lru || sl->last_use < lru->last_use) lru = sl, lru_n = n;
        if (2 * n < sl->n_ids && n < r->n_prompt) continue;
        if (n > best_n || (n == best_n && sl->last_use < best->last_use)) best = sl, best_n = n;
    }
    if (!best) best = lru, best_n = lru_n;
    *common = best_n;
    return best;
}

/* Under the lock: drops the queued requests whose clients left, then moves the
 * oldest ones into free slots (first come, first served). The choices of an n > 1 request
 * queue right behind their lead and each takes a slot as one comes free, like any request:
 * a group never waits for n free slots at once, so nothing behind it waits while a slot
 * idles, and nothing passes it, so it cannot starve. A choice whose lead holds a slot takes
 * a copy of the lead's cache once the prompt is read (server_fork.c), so the prompt is still
 * evaluated once; after the lead has ended it reads the prompt like any request. */
static void admit(srv_server *s) {
    for (srv_req **pp = &s->q_head, *prev = NULL; *pp;) {
        srv_req *r = *pp;
        if (!r->cancelled) {
            prev = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (s->q_tail == r) s->q_tail = prev;
        s->n_queued--;
        r->queued = 0;
        r->done = 1;
        pthread_cond_broadcast(&r->cv);
        req_unref(r);
    }
    while (s->q_head) {
        srv_req *r = s->q_head;
        int common, follower = r->lead && srv_lead_slot(s, r) >= 0;
        slot *sl = pick_slot(s, r, &common);
        if (!sl) break;
        s->q_head = r->next;
        if (!s->q_head) s->q_tail = NULL;
        r->next = NULL;
        r->queued = 0;
        s->n_queued--;
        if (s->prefix) { /* disk I/O without the lock: the connections go on meanwhile */
            pthread_mutex_unlock(&s->mu);
            srv_prefix_evict(s, sl, follower ? 0 : common);
            if (!follower) common = srv_prefix_restore(s, sl, r, common);
            pthread_mutex_lock(&s->mu);
        }
        if (follower) common = 0; /* the lead's cache is copied in once its prompt is read */
        if (common >= r->n_prompt && sl->n_saved != r->n_prompt)
            common = r->n_prompt - 1; /* the last token again, for its logits */
        sl->smp = kvq_sampler_new(&r->sp);
        sl->dt = kvq_detok_new(s->tok, 1);
        if (!sl->smp || !sl->dt || kvq_kv_truncate(sl->c, common) != KVQ_OK) {
            kvq_sampler_free(sl->smp);
            kvq_detok_free(sl->dt);
            sl->smp = NULL;
            sl->dt = NULL;
            srv_fail(&r->err, 500, NULL, "cannot start the request: %s", kvq_last_error());
            r->done = 1;
            pthread_cond_broadcast(&r->cv);
            req_unref(r);
            continue;
        }
        sl->n_ids = common;
        if (sl->n_saved > common) sl->n_saved = 0;
        r->n_cached = common;
        r->slot = (int)(sl - s->slots);
        sl->r = r;
        sl->content_seen = 0;
        sl->finish = SRV_FINISH_NONE;
        sl->has_pending = 0;
        if (follower) r->wait_lead = 1, r->n_cached = r->n_prompt;
        s->met.prompt_tokens += (unsigned long)r->n_prompt;
        s->met.prompt_tokens_cached += (unsigned long)r->n_cached;
        sl->gen_bytes = 0;
        r->n_scored = 0;
        if (r->echo && r->logprobs) r->prompt_off = malloc(sizeof *r->prompt_off * (size_t)r->n_prompt);
        /* running text (a completion, or chat without a template): decode in the context of the
         * prompt, so the first piece keeps its leading space */
        if (!r->chat || r->plain_chat) {
            char tmp[1024];
            int off = 0;
            for (int i = 0; i < r->n_prompt; i++) {
                if (r->prompt_off) r->prompt_off[i] = off;
                int k = kvq_detok_push(sl->dt, r->prompt[i], tmp, sizeof tmp);
                off += k > 0 ? k : 0;
            }
            /* a flush would end the stream, and the next piece would lose its word-start space
             * again; plain chat keeps it so (the reply starts a line of its own) */
            if (r->plain_chat) kvq_detok_flush(sl->dt, tmp, sizeof tmp);
        }
    }
}

/* Adds fresh text to the slot's output through the plain-chat rule (the reply
 * is the rest of the line) and the stop strings; sets sl->finish when one hits. */
static void take_text(slot *sl, const char *t, size_t k) {
    srv_req *r = sl->r;
    if (sl->finish) return;
    for (size_t i = 0; i < k; i++) {
        if (!t[i]) continue; /* a <0x00> byte token: JSON strings here are C strings */
        if (r->plain_chat && !r->json && t[i] == '\n') { /* a JSON reply may span lines */
            if (!sl->content_seen) continue;
            sl->finish = SRV_FINISH_STOP;
            break;
        }
        if (t[i] != ' ' && t[i] != '\t' && t[i] != '\r') sl->content_seen = 1;
        srv_buf_add(&sl->hold, t + i, 1);
    }
    /* the earliest stop string in what is held */
    size_t cut = sl->hold.n;
    int hit = 0;
    for (int i = 0; i < r->n_stop; i++) {
        char *f = sl->hold.p ? strstr(sl->hold.p, r->stop[i]) : NULL;
        if (f && (size_t)(f - sl->hold.p) < cut) {
            cut = (size_t)(f - sl->hold.p);
            hit = 1;
        }
    }
    if (hit) sl->finish = SRV_FINISH_STOP;
    size_t keep = 0;
    if (!hit && !sl->finish) /* hold back the longest tail that may begin a stop string */
        for (int i = 0; i < r->n_stop; i++) {
            size_t ls = strlen(r->stop[i]);
            for (size_t l = ls - 1; l > keep; l--)
                if (l <= sl->hold.n && !memcmp(sl->hold.p + sl->hold.n - l, r->stop[i], l)) {
                    keep = l;
                    break;
                }
        }
    size_t emit = hit ? cut : sl->hold.n - keep;
    if (emit) srv_buf_add(&sl->out, sl->hold.p, emit);
    memmove(sl->hold.p, sl->hold.p + emit, sl->hold.n - emit);
    sl->hold.n -= emit;
    if (sl->hold.p) sl->hold.p[sl->hold.n] = 0;
}

/* The request ends without a stop string: whatever is held back goes out. */
static void flush_text(slot *sl, int finish) {
    char tmp[1024];
    int k = kvq_detok_flush(sl->dt, tmp, sizeof tmp);
    if (k > 0) take_text(sl, tmp, (size_t)k);
    if (!sl->finish) {
        if (sl->hold.n) srv_buf_add(&sl->out, sl->hold.p, sl->hold.n);
        sl->hold.n = 0;
        sl->finish = finish;
    }
}

/* A logprob entry for the slot to publish; NULL when out of memory (the entry is dropped). */
static srv_lp *new_lp(slot *sl) {
    if (sl->n_lp == sl->cap_lp) {
        int cap = sl->cap_lp ? 2 * sl->cap_lp : 16;
        srv_lp *p = realloc(sl->lp, sizeof *p * (size_t)cap);
        if (!p) return NULL;
        sl->lp = p;
        sl->cap_lp = cap;
    }
    return &sl->lp[sl->n_lp++];
}

/* After an evaluation that left fresh logits in the slot: samples the next token. */
static void sample_next(srv_server *s, slot *sl, const float *lg) {
    srv_req *r = sl->r;
    if (r->max_tokens == 0) { /* echo only: the prompt is read, nothing to generate */
        sl->finish = SRV_FINISH_LENGTH;
        return;
    }
    const float *raw = lg; /* logprobs are of the model's distribution, before penalties */
    if (r->presence != 0 || r->frequency != 0) {
        memcpy(s->logits, lg, sizeof *lg * (size_t)s->n_vocab);
        for (int i = 0; i < r->n_gen; i++) {
            int32_t t = sl->gen[i];
            if (sl->counts[t] > 0) { /* each id once, at its first occurrence */
                s->logits[t] -= (float)sl->counts[t] * r->frequency + r->presence;
                sl->counts[t] = -sl->counts[t];
            }
        }
        for (int i = 0; i < r->n_gen; i++)
            if (sl->counts[sl->gen[i]] < 0) sl->counts[sl->gen[i]] = -sl->counts[sl->gen[i]];
        lg = s->logits;
    }
    /* a constrained or drafted token is still a draw from the target's rule: drafts are kept
     * only when the token drawn here equals them (server_spec.c) */
    int32_t id = r->call ? srv_call_sample(r->call, sl->smp, lg, s->n_vocab)
                 : r->json ? kvq_json_constraint_sample(r->json, sl->smp, lg, s->n_vocab)
                 : sl->draft >= 0 ? srv_spec_pick(s, sl, lg) : kvq_sample(sl->smp, lg, s->n_vocab);
    if (!r->t_first) r->t_first = kvq_tool_now();
    if (id < 0 || kvq_token_is_eog(s->tok, id)) {
        flush_text(sl, SRV_FINISH_STOP);
        return;
    }
    kvq_sampler_accept(sl->smp, id);
    if (r->json) kvq_json_constraint_accept(r->json, id);
    if (r->call) srv_call_accept(r->call, id);
    sl->gen[r->n_gen++] = id;
    sl->counts[id]++;
    srv_lp *e = r->logprobs ? new_lp(sl) : NULL;
    if (e) {
        srv_logprobs(raw, s->n_vocab, id, r->n_top, e);
        e->offset = sl->gen_bytes;
    }
    char piece[1024];
    int k = kvq_detok_push(sl->dt, id, piece, sizeof piece);
    sl->gen_bytes += k > 0 ? k : 0;
    if (k > 0) take_text(sl, piece, (size_t)k);
    if (sl->finish) return;
    if ((r->json && kvq_json_constraint_complete(r->json) == 2) || (r->call && srv_call_done(r->call))) { /* the value is complete: nothing may follow */
        flush_text(sl, SRV_FINISH_STOP);
        return;
    }
    if (r->n_gen >= r->max_tokens || sl->n_ids >= s->n_ctx) {
        flush_text(sl, SRV_FINISH_LENGTH);
        return;
    }
    sl->pending = id;
    sl->has_pending = 1;
}

#define SRV_SCORE_ROWS 64 /* prompt positions scored per step (rows of logits held at once) */

/* Echo with logprobs reads the prompt on the scoring context first; with max_tokens 0 that is all. */
static int waits_for_score(const srv_req *r) {
    return r->wait_lead || (r->echo && r->logprobs && (r->n_scored < r->n_prompt || r->max_tokens == 0));
}

/* Scores up to SRV_SCORE_ROWS more prompt tokens of the slot's request (a chunk per step, so
 * the other slots' streams go on between chunks): row i of a kvq_eval over prompt[p..p+k)
 * predicts prompt[p+i+1]. Returns 0, or -1 with r->err filled. */
static int score_chunk(srv_server *s, slot *sl) {
    srv_req *r = sl->r;
    if (!s->score) {
        kvq_context_params cp = s->cp;
        cp.logits_all = 1;
        cp.n_batch = SRV_SCORE_ROWS;
        if (kvq_context_new(s->m, &cp, &s->score) != KVQ_OK) {
            s->score = NULL;
            return srv_fail(&r->err, 500, NULL, "cannot make the context that scores prompts: %s", kvq_last_error());
        }
    }
    if (r->n_scored == 0) {
        if (kvq_kv_truncate(s->score, 0) != KVQ_OK) return srv_fail(&r->err, 500, NULL, "%s", kvq_last_error());
        srv_lp *e = new_lp(sl);
        if (!e) return srv_fail(&r->err, 500, NULL, "out of memory");
        memset(e, 0, sizeof *e);
        e->id = r->prompt[0];
        e->logprob = NAN; /* nothing comes before the first token */
        r->n_scored = 1;
    }
    int p = r->n_scored - 1, k = r->n_prompt - r->n_scored;
    if (k > SRV_SCORE_ROWS) k = SRV_SCORE_ROWS;
    if (k > 0 && kvq_eval(s->score, r->prompt + p, k) != KVQ_OK)
        return srv_fail(&r->err, 500, NULL, "scoring the prompt failed: %s", kvq_last_error());
    for (int i = 0; i < k; i++) {
        srv_lp *e = new_lp(sl);
        if (!e) return srv_fail(&r->err, 500, NULL, "out of memory");
        srv_logprobs(kvq_logits_row(s->score, i), s->n_vocab, r->prompt[p + i + 1], r->n_top, e);
        e->offset = r->prompt_off ? r->prompt_off[p + i + 1] : 0;
    }
    if (sl->n_lp && r->prompt_off && r->n_scored == 1) sl->lp[0].offset = r->prompt_off[0];
    r->n_scored += k;
    return 0;
}

/* Under the lock: hands the slot's new logprob entries to its request. */
static void publish_lp(slot *sl) {
    srv_req *r = sl->r;
    if (!sl->n_lp) return;
    if (r->n_lp + sl->n_lp > r->cap_lp) {
        int cap = r->cap_lp ? r->cap_lp : 16;
        while (cap < r->n_lp + sl->n_lp) cap *= 2;
        srv_lp *p = realloc(r->lp, sizeof *p * (size_t)cap);
        if (!p) {
            sl->n_lp = 0;
            return;
        }
        r->lp = p;
        r->cap_lp = cap;
    }
    memcpy(r->lp + r->n_lp, sl->lp, sizeof *sl->lp * (size_t)sl->n_lp);
    r->n_lp += sl->n_lp;
    sl->n_lp = 0;
    pthread_cond_broadcast(&r->cv);
}

/* A step makes the decode rows' forwards (eval_decode), then the prompt chunk's alone. Mixed
 * into one, a step past 16 rows (kvq_model_exact_rows) took the batched kernels, which round
 * differently from the per-token ones a decode row gets alone or beside a few other decode
 * rows: a greedy reply changed with the moment another request's prompt happened to be read
 * (docs/serving.md#determinism). Did entry j's forward fail? */
static int eval_failed(const kvq_context *c, kvq_status st) { return c && st != KVQ_OK; }

/* The decode entries in forwards of at most kvq_model_exact_rows rows (whole entries), so each row
 * is a one-token decode's however many streams there are. The first failure fails them all. */
static kvq_status eval_decode(srv_server *s, kvq_context *const *ctx, const int32_t *const *ids, const int *n, int count) {
    const int most = kvq_model_exact_rows(s->m);
    kvq_status st = KVQ_OK;
    for (int a = 0, b; !st && a < count; a = b) {
        int rows = n[a];
        for (b = a + 1; b < count && rows + n[b] <= most; b++) rows += n[b];
        st = kvq_eval_batch(ctx + a, ids + a, n + a, b - a);
    }
    return st;
}

/* One step: the decode rows of the decoding slots, and at most one prompt chunk.
 * Called without the lock; publishes the new text under it and returns holding it. */
static void step(srv_server *s) {
    double t_step = kvq_tool_now();
    srv_fork_late(s);
    kvq_context *ctx[s->n_slots];
    const int32_t *ids[s->n_slots];
    int n[s->n_slots], who[s->n_slots], gen0[s->n_slots], count = 0, n_decode = 0, prefill = -1, scored = -1;
    for (int i = 0; i < s->n_slots && scored < 0; i++)
        if (s->slots[i].r && s->slots[i].r->echo && s->slots[i].r->logprobs && s->slots[i].r->n_scored < s->slots[i].r->n_prompt)
            scored = i;
    int score_err = scored >= 0 ? score_chunk(s, &s->slots[scored]) : 0;
    int budget = 0; /* speculation: rows left in the batch beside the decode rows and a prompt chunk */
    for (int i = 0; s->spec && i < s->n_slots; i++) budget += s->slots[i].r && s->slots[i].has_pending;
    if (budget) budget = ((s->cp.n_batch ? s->cp.n_batch : kvq_context_default_params().n_batch) - budget - s->chunk) / budget;
    if (s->spec) srv_spec_draft_all(s, budget);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->r && sl->has_pending) {
            ctx[count] = sl->c;
            ids[count] = &sl->pending;
            n[count] = s->spec ? srv_spec_rows(s, i, &ids[count]) : 1;
            who[count++] = i;
            n_decode++;
        }
    }
    for (int j = 0; j < s->n_slots && prefill < 0; j++) { /* round robin over prompts being read */
        int i = (s->prefill_next + j) % s->n_slots;
        slot *sl = &s->slots[i];
        if (sl->r && !sl->has_pending && sl->n_ids < sl->r->n_prompt && !waits_for_score(sl->r)) {
            prefill = i;
            int k = sl->r->n_prompt - sl->n_ids;
            ctx[count] = sl->c;
            ids[count] = sl->r->prompt + sl->n_ids;
            n[count] = k < s->chunk ? k : s->chunk;
            who[count++] = i;
            s->prefill_next = (i + 1) % s->n_slots;
        }
    }
    for (int i = 0; i < s->n_slots; i++) { /* a repeated prompt: its logits are saved */
        slot *sl = &s->slots[i];
        if (sl->r && !sl->has_pending && sl->n_ids == sl->r->n_prompt && !sl->r->t_prompt_done && !waits_for_score(sl->r)) {
            ctx[count] = NULL;
            ids[count] = NULL;
            n[count] = 0;
            who[count++] = i;
        }
    }
    if (!count && scored < 0) {
        pthread_mutex_lock(&s->mu);
        return;
    }
    /* the evaluated entries come first; saved-logits entries (ctx NULL) after them */
    int n_eval = 0;
    while (n_eval < count && ctx[n_eval]) n_eval++;
    double t0 = kvq_tool_now(), dt_pre = 0;
    kvq_status st_dec = n_decode ? eval_decode(s, ctx, ids, n, n_decode) : KVQ_OK, st_pre = KVQ_OK;
    double dt = kvq_tool_now() - t0;
    if (n_eval > n_decode) { /* the prompt chunk in a forward of its own: see eval_failed */
        st_pre = kvq_eval(ctx[n_decode], ids[n_decode], n[n_decode]);
        dt_pre = kvq_tool_now() - t0 - dt;
    }
    for (int j = 0; j < count; j++) {
        slot *sl = &s->slots[who[j]];
        gen0[j] = sl->r->n_gen;
        sl->finish = SRV_FINISH_NONE;
        sl->out.n = 0;
        if (eval_failed(ctx[j], j < n_decode ? st_dec : st_pre)) continue;
        if (!ctx[j]) {
            sl->r->t_prompt_done = kvq_tool_now();
            srv_fork_choices(s, sl);
            sample_next(s, sl, sl->saved);
        } else if (sl->has_pending) {
            sl->ids[sl->n_ids++] = sl->pending;
            sl->has_pending = 0;
            if (n[j] > 1) srv_spec_verify(s, who[j], sample_next);
            else sample_next(s, sl, kvq_logits(sl->c));
        } else {
            memcpy(sl->ids + sl->n_ids, ids[j], sizeof **ids * (size_t)n[j]);
            sl->n_ids += n[j];
            if (sl->n_ids == sl->r->n_prompt) {
                sl->r->t_prompt_done = kvq_tool_now();
                memcpy(sl->saved, kvq_logits(sl->c), sizeof *sl->saved * (size_t)s->n_vocab);
                sl->n_saved = sl->n_ids;
                srv_fork_choices(s, sl);
                sample_next(s, sl, sl->saved);
            }
        }
    }
    pthread_mutex_lock(&s->mu);
    s->met.steps++;
    int kept = srv_spec_commit(s); /* drafts kept: tokens beyond one per decoding slot */
    if (n_decode) {
        s->met.gen_seconds += dt;
        double tps = (n_decode + kept) / (dt > 1e-9 ? dt : 1e-9);
        s->met.gen_tps_ema = s->met.gen_tps_ema > 0 ? 0.8 * s->met.gen_tps_ema + 0.2 * tps : tps;
    }
    if (prefill >= 0) s->met.prompt_seconds += dt_pre;
    for (int j = 0; j < count; j++) {
        slot *sl = &s->slots[who[j]];
        srv_req *r = sl->r;
        s->met.gen_tokens += (unsigned long)(r->n_gen - gen0[j]);
        if (eval_failed(ctx[j], j < n_decode ? st_dec : st_pre)) {
            srv_fail(&r->err, 500, NULL, "evaluation failed: %s", kvq_last_error());
            kvq_kv_truncate(sl->c, 0);
            kvq_logits_all_set(sl->c, 0); /* a slot that was verifying drafts */
            sl->n_ids = sl->n_saved = 0;
            finish_slot(s, sl, SRV_FINISH_STOP);
            continue;
        }
        if (sl->out.n) {
            size_t need = r->n_text + sl->out.n + 1;
            if (need > r->cap_text) {
                size_t cap = r->cap_text ? r->cap_text * 2 : 256;
                while (cap < need) cap *= 2;
                char *t = realloc(r->text, cap);
                if (t) {
                    r->text = t;
                    r->cap_text = cap;
                }
            }
            if (need <= r->cap_text) {
                memcpy(r->text + r->n_text, sl->out.p, sl->out.n);
                r->n_text += sl->out.n;
                r->text[r->n_text] = 0;
            }
            pthread_cond_broadcast(&r->cv);
        }
        publish_lp(sl);
        if (sl->has_pending || (!sl->finish && sl->n_ids < r->n_prompt)) continue;
        finish_slot(s, sl, sl->finish ? sl->finish : SRV_FINISH_STOP);
    }
    slot *sc = scored >= 0 ? &s->slots[scored] : NULL;
    if (sc && sc->r) { /* still running unless it also read its prompt this step and ended */
        srv_req *r = sc->r;
        publish_lp(sc);
        if (score_err) {
            finish_slot(s, sc, SRV_FINISH_STOP);
        } else if (r->n_scored == r->n_prompt && r->max_tokens == 0) {
            r->t_prompt_done = kvq_tool_now();
            finish_slot(s, sc, SRV_FINISH_LENGTH);
        }
    }
    s->met.step_seconds += kvq_tool_now() - t_step;
}

static void *sched_main(void *arg) {
    srv_server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->r && sl->r->cancelled) finish_slot(s, sl, SRV_FINISH_STOP);
        }
        srv_run_slot_jobs(s);
        srv_run_embd_jobs(s);
        admit(s);
        int busy = 0;
        for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].r != NULL;
        if (!busy) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        /* the scheduler alone changes slot state (outside the lock); the connections only
         * read published text and set `cancelled`, under it */
        pthread_mutex_unlock(&s->mu);
        if (s->step_ms > 0) {
            struct timespec ts = {s->step_ms / 1000, (long)(s->step_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        step(s); /* returns with the lock held */
        size_t used = 0;
        for (int i = 0; i < s->n_slots; i++) used += kvq_kv_bytes_used(s->slots[i].c);
        s->kv_used = used;
    }
    /* shutting down: slot actions still queued fail, as do queued requests; running ones end here */
    srv_jobs_fail(&s->jobs);
    srv_jobs_fail(&s->embd_jobs);
    while (s->q_head) {
        srv_req *r = s->q_head;
        s->q_head = r->next;
        srv_fail(&r->err, 503, "shutting_down", "the server is shutting down");
        r->done = 1;
        pthread_cond_broadcast(&r->cv);
        req_unref(r);
    }
    s->q_tail = NULL;
    s->n_queued = 0;
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].r) finish_slot(s, &s->slots[i], SRV_FINISH_LENGTH);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int srv_sched_start(srv_server **out, const srv_opts *o, kvq_model *m) {
    srv_server *s = calloc(1, sizeof *s);
    if (!s) return kvq_tool_die(SRV_PROG, "out of memory");
    *out = s;
    s->m = m;
    s->tok = kvq_model_tokenizer(m);
    s->n_vocab = kvq_model_n_vocab(m);
    s->n_slots = (int)o->n_slots;
    s->chunk = (int)o->chunk;
    s->queue_max = (int)o->queue;
    const char *delay = getenv("KVQ_SERVER_STEP_MS");
    s->step_ms = delay ? atoi(delay) : 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->logits = malloc(sizeof *s->logits * (size_t)s->n_vocab);
    if (!s->slots || !s->logits) return kvq_tool_die(SRV_PROG, "out of memory");
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = (int)o->n_ctx; /* 0: the library's default, read back from the first slot */
    cp.n_batch = (int)o->n_batch;
    cp.type_k = (kvq_cache_type)o->type_k;
    cp.type_v = (kvq_cache_type)o->type_v;
    cp.kv_rotate = o->kv_rotate;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (kvq_context_new(m, &cp, &sl->c) != KVQ_OK)
            return kvq_tool_die(SRV_PROG, "slot %d of %d: %s", i + 1, s->n_slots, kvq_last_error());
        kvq_tool_report_context(SRV_PROG, sl->c);
        s->n_ctx = kvq_n_ctx(sl->c);
        sl->ids = malloc(sizeof *sl->ids * (size_t)(s->n_ctx + 1));
        sl->gen = malloc(sizeof *sl->gen * (size_t)(s->n_ctx + 1));
        sl->counts = calloc((size_t)s->n_vocab, sizeof *sl->counts);
        sl->saved = malloc(sizeof *sl->saved * (size_t)s->n_vocab);
        sl->draft = -1;
        if (!sl->ids || !sl->gen || !sl->counts || !sl->saved) return kvq_tool_die(SRV_PROG, "out of memory");
        s->kv_total += kvq_kv_bytes_total(sl->c);
    }
    s->cp = cp;
    s->cp.n_ctx = s->n_ctx;
    if (srv_prefix_open(s, o) || srv_spec_start(s, o)) return 1;
    if (pthread_create(&s->th, NULL, sched_main, s)) return kvq_tool_die(SRV_PROG, "cannot start the scheduler thread");
    s->started = 1;
    return 0;
}

void srv_sched_stop(srv_server *s) {
    if (!s || !s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->started = 0;
}

void srv_sched_free(srv_server *s) {
    if (!s) return;
    srv_sched_stop(s);
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        kvq_context_free(sl->c);
        free(sl->ids);
        free(sl->gen);
        free(sl->counts);
        free(sl->saved);
        free(sl->lp);
        free(sl->hold.p);
        free(sl->out.p);
        kvq_sampler_free(sl->smp);
        kvq_detok_free(sl->dt);
    }
    kvq_context_free(s->score);
    kvq_context_free(s->embd);
    srv_prefix_free(s);
    srv_spec_free(s);
    free(s->slots);
    free(s->logits);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

void srv_snapshot_get(srv_server *s, srv_snapshot *out) {
    pthread_mutex_lock(&s->mu);
    out->m = s->met;
    out->slots = s->n_slots;
    out->busy = 0;
    for (int i = 0; i < s->n_slots; i++) out->busy += s->slots[i].r != NULL;
    out->queued = s->n_queued;
    out->kv_used = s->kv_used;
    out->kv_total = s->kv_total;
    pthread_mutex_unlock(&s->mu);
}

void srv_count_request(srv_server *s, int route, int status) {
    pthread_mutex_lock(&s->mu);
    if (route >= 0 && route < SRV_N_ROUTES) s->met.requests[route]++;
    if (status >= 400 && status < 500) s->met.errors_4xx++;
    if (status >= 500) s->met.errors_5xx++;
    pthread_mutex_unlock(&s->mu);
}
