/* kvq-chat's conversation: messages rendered by the chat template, and the KV
 * cache kept equal to the tokens of that rendering. Each turn re-renders the
 * conversation, keeps the cached prefix that still matches and evaluates only
 * the rest (normally just the new turn). When the context is full the oldest
 * whole turns are dropped (the system message and --keep tokens stay) and the
 * remainder is evaluated again; RoPE'd keys are never moved. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"

void chat_notice(const chat_session *S, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (S->color) fprintf(stderr, "\033[2m%s: %s\033[0m\n", CHAT_PROG, msg);
    else fprintf(stderr, "%s: %s\n", CHAT_PROG, msg);
}

int chat_session_init(chat_session *S, const chat_opts *o, kvq_model *m, kvq_context *c) {
    memset(S, 0, sizeof *S);
    S->o = o;
    S->m = m;
    S->c = c;
    S->tok = kvq_model_tokenizer(m);
    S->n_vocab = kvq_model_n_vocab(m);
    kvq_status st = kvq_chat_template_load(o->model, o->chat_template, &S->t);
    if (st == KVQ_ERR_UNSUPPORTED) {
        /* a template we do not know: say so and continue the text as it stands */
        chat_notice(S, "%s; running without a template", kvq_last_error());
        st = kvq_chat_template_load(o->model, "none", &S->t);
    }
    if (st != KVQ_OK) return kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
    S->plain = !strcmp(kvq_chat_template_name(S->t), "none");
    S->n_ctx = (int)o->n_ctx; /* the caller resolves 0 to the size the context got */
    S->cap_ids = S->n_ctx + 1;
    S->ids = malloc(sizeof *S->ids * (size_t)S->cap_ids);
    if (!S->ids) return kvq_tool_die(CHAT_PROG, "out of memory");
    if (o->system && *o->system) {
        /* a template that raises on a system message (Gemma 1, the first Mistral revisions) is
         * said at start, not at the first turn */
        kvq_chat_msg probe[2] = {{.role = "system", .content = o->system}, {.role = "user", .content = "x"}};
        char one[8];
        if (kvq_chat_render(S->t, probe, 2, 1, one, sizeof one) < 0)
            return kvq_tool_die(CHAT_PROG, "--system: this model's chat template (%s) takes no system message: %s",
                                kvq_chat_template_name(S->t), kvq_last_error());
    }
    if (o->system && chat_set_system(S, o->system)) return 1;
    if (o->prompt_cache && access(o->prompt_cache, F_OK) == 0) chat_cache_restore(S, o->prompt_cache);
    return 0;
}

int chat_cache_save(chat_session *S, const char *path) {
    if (kvq_context_save(S->c, path, S->ids, S->n_ids) != KVQ_OK) {
        chat_notice(S, "%s", kvq_last_error());
        return -1;
    }
    return 0;
}

int chat_cache_restore(chat_session *S, const char *path) {
    int n = 0;
    if (kvq_context_restore(S->c, path, S->ids, S->cap_ids, &n) != KVQ_OK) {
        chat_notice(S, "%s; starting without it", kvq_last_error());
        S->n_ids = kvq_n_past(S->c); /* unchanged, unless the device failed mid-write (then 0) */
        return -1;
    }
    S->n_ids = n;
    chat_notice(S, "%s: %d tokens of KV cache restored", path, n);
    return 0;
}

static void free_msg(chat_msg *m) {
    free(m->role);
    free(m->content);
}

void chat_session_free(chat_session *S) {
    for (int i = 0; i < S->n_msgs; i++) free_msg(&S->msgs[i]);
    free(S->msgs);
    free(S->ids);
    free(S->pin);
    kvq_chat_template_free(S->t);
}

static int insert_msg(chat_session *S, int at, const char *role, const char *content) {
    if (S->n_msgs == S->cap_msgs) {
        int cap = S->cap_msgs ? 2 * S->cap_msgs : 16;
        chat_msg *m = realloc(S->msgs, sizeof *m * (size_t)cap);
        if (!m) return -1;
        S->msgs = m;
        S->cap_msgs = cap;
    }
    chat_msg nm = {strdup(role), strdup(content)};
    if (!nm.role || !nm.content) {
        free_msg(&nm);
        return -1;
    }
    memmove(S->msgs + at + 1, S->msgs + at, sizeof *S->msgs * (size_t)(S->n_msgs - at));
    S->msgs[at] = nm;
    S->n_msgs++;
    return 0;
}

static void remove_msgs(chat_session *S, int at, int n) {
    if (n <= 0) return;
    for (int i = at; i < at + n; i++) free_msg(&S->msgs[i]);
    memmove(S->msgs + at, S->msgs + at + n, sizeof *S->msgs * (size_t)(S->n_msgs - at - n));
    S->n_msgs -= n;
}

static int has_system(const chat_session *S) { return S->n_msgs > 0 && !strcmp(S->msgs[0].role, "system"); }

/* Renders msgs[0..n) and tokenizes without BOS (the template places it). */
static int render_msgs(chat_session *S, const chat_msg *msgs, int n, int gen, int32_t **out) {
    kvq_chat_msg *v = malloc(sizeof *v * (size_t)(n + 1));
    char *text = NULL;
    int k = -1;
    *out = NULL;
    if (!v) goto done;
    for (int i = 0; i < n; i++) v[i] = (kvq_chat_msg){.role = msgs[i].role, .content = msgs[i].content};
    int len = kvq_chat_render(S->t, v, n, gen, NULL, 0);
    if (len < 0 || !(text = malloc((size_t)len + 1))) goto done;
    kvq_chat_render(S->t, v, n, gen, text, (size_t)len + 1);
    k = kvq_tokenize(S->tok, text, (size_t)len, 0, NULL, 0);
    if (k < 0 || !(*out = malloc(sizeof **out * (size_t)(k + 1)))) {
        k = -1;
        goto done;
    }
    kvq_tokenize(S->tok, text, (size_t)len, 0, *out, k);
done:
    free(v);
    free(text);
    if (k < 0) kvq_tool_die(CHAT_PROG, "rendering the conversation: %s", kvq_last_error());
    return k;
}

static int render_ids(chat_session *S, int n, int gen, int32_t **out) { return render_msgs(S, S->msgs, n, gen, out); }

/* Index of the first message of the oldest droppable turn, or -1 when only the
 * last user turn (and the system message) is left. */
static int oldest_turn(const chat_session *S, int *len) {
    int first = has_system(S) ? 1 : 0, last_user = -1;
    for (int i = S->n_msgs - 1; i >= first; i--)
        if (!strcmp(S->msgs[i].role, "user")) {
            last_user = i;
            break;
        }
    if (last_user <= first) return -1;
    int end = first + 1;
    while (end < last_user && strcmp(S->msgs[end].role, "user")) end++;
    *len = end - first;
    return first;
}

/* The cache layout for a rendering: --keep's pinned tokens go back where they were. */
static int32_t *with_pin(const chat_session *S, const int32_t *full, int n, int *n_out) {
    int32_t *w = malloc(sizeof *w * (size_t)(n + S->n_pin + 1));
    if (!w) return NULL;
    int at = S->pin_at < n ? S->pin_at : n;
    memcpy(w, full, sizeof *w * (size_t)at);
    if (S->n_pin) memcpy(w + at, S->pin, sizeof *w * (size_t)S->n_pin);
    memcpy(w + at + S->n_pin, full + at, sizeof *w * (size_t)(n - at));
    *n_out = n + S->n_pin;
    return w;
}

/* Makes the cache hold exactly want[0..n): keeps the matching prefix, evaluates
 * the rest in n_batch pieces (Ctrl-C is honoured between them). Returns 0, 1 on a
 * fatal error, 2 when interrupted (the cache then holds a consistent prefix). */
static int sync_cache(chat_session *S, const int32_t *want, int n) {
    int p = 0;
    while (p < S->n_ids && p < n && S->ids[p] == want[p]) p++;
    if (p == n) p = n - 1; /* the last token again, for fresh logits */
    if (p < S->n_ids) {
        if (kvq_kv_truncate(S->c, p) != KVQ_OK) return kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
        S->n_ids = p;
    }
    int step = S->o->n_batch > 0 ? (int)S->o->n_batch : 512;
    double t0 = kvq_tool_now();
    while (S->n_ids < n) {
        if (chat_interrupted) break;
        int k = n - S->n_ids < step ? n - S->n_ids : step;
        if (kvq_eval(S->c, want + S->n_ids, k) != KVQ_OK) return kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
        memcpy(S->ids + S->n_ids, want + S->n_ids, sizeof *want * (size_t)k);
        S->n_ids += k;
        S->n_prompt_eval += k;
    }
    S->t_prompt += kvq_tool_now() - t0;
    /* KVQ_CHAT_VERIFY=1 (tests): compare the logits of the incrementally kept cache
     * with a fresh evaluation of the same tokens */
    if (getenv("KVQ_CHAT_VERIFY") && S->n_ids == n) {
        kvq_context_params cp = kvq_context_default_params();
        cp.n_ctx = S->n_ctx;
        cp.type_k = (kvq_cache_type)S->o->type_k;
        cp.type_v = (kvq_cache_type)S->o->type_v;
        cp.kv_rotate = S->o->kv_rotate;
        kvq_context *c2;
        if (kvq_context_new(S->m, &cp, &c2) == KVQ_OK && kvq_eval(c2, S->ids, S->n_ids) == KVQ_OK) {
            const float *a = kvq_logits(S->c), *b = kvq_logits(c2);
            double d = 0, nb = 0;
            for (int i = 0; i < S->n_vocab; i++) d += (a[i] - b[i]) * (a[i] - b[i]), nb += b[i] * b[i];
            fprintf(stderr, "%s: verify: %d tokens, squared rel. logits difference %.3g\n", CHAT_PROG, S->n_ids, d / nb);
        }
        kvq_context_free(c2);
    }
    /* the repeat penalty looks at the last tokens of the context */
    kvq_sampler_reset(S->s);
    int from = S->n_ids - (int)S->o->sp.repeat_last_n;
    for (int i = from > 0 ? from : 0; i < S->n_ids; i++) kvq_sampler_accept(S->s, S->ids[i]);
    return S->n_ids < n ? 2 : 0;
}

/* Tokens a reply needs at least, beyond the prompt. */
static int reply_room(const chat_session *S) {
    int r = S->n_ctx / 8;
    return r < 4 ? 4 : r;
}

/* Drops oldest turns until the rendering plus `extra` tokens fits. Returns the
 * number dropped, or -1 on error; *full / *n hold the last rendering. */
static int fit_turns(chat_session *S, int extra, int32_t **full, int *n) {
    int dropped = 0, len;
    while (S->n_pin + *n + extra > S->n_ctx) {
        int at = oldest_turn(S, &len);
        if (at < 0) break;
        if (!dropped && S->o->keep > 0 && !S->n_pin) {
            /* --keep N: the first N tokens in the cache stay, after the part that re-renders the same */
            int common = 0;
            free(*full);
            remove_msgs(S, at, len);
            if ((*n = render_ids(S, S->n_msgs, 1, full)) < 0) return -1;
            while (common < S->n_ids && common < *n && S->ids[common] == (*full)[common]) common++;
            int keep = (int)S->o->keep < S->n_ids ? (int)S->o->keep : S->n_ids;
            if (keep > common && (S->pin = malloc(sizeof *S->pin * (size_t)(keep - common)))) {
                memcpy(S->pin, S->ids + common, sizeof *S->pin * (size_t)(keep - common));
                S->n_pin = keep - common;
                S->pin_at = common;
            }
            dropped++;
            continue;
        }
        remove_msgs(S, at, len);
        dropped++;
        free(*full);
        if ((*n = render_ids(S, S->n_msgs, 1, full)) < 0) return -1;
    }
    return dropped;
}

/* Streams reply text: newlines are held back until more text follows, so the
 * reply ends in exactly one newline; leading newlines are not printed. */
typedef struct {
    int pending_nl, started;
} emitter;

static void emit(emitter *e, const char *s) {
    for (; *s; s++) {
        if (*s == '\n') {
            if (e->started) e->pending_nl++;
            continue;
        }
        for (; e->pending_nl; e->pending_nl--) putchar('\n');
        putchar(*s);
        e->started = 1;
    }
    fflush(stdout);
}

typedef struct {
    char *p;
    size_t n, cap;
} strbuf;

static void sb_add(strbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + k + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

/* The cache filled up during a reply: drop older turns, or failing that (only
 * when allow_cut, i.e. --ignore-eos) the older part of this reply, and
 * re-evaluate. *n_reply shrinks to the reply tokens still in the cache.
 * Returns as sync_cache, or 3 when the reply cannot go on. */
static int shift_in_reply(chat_session *S, int32_t *reply, int *n_reply, int allow_cut) {
    int32_t *full;
    int n = render_ids(S, S->n_msgs, 1, &full);
    if (n < 0) return 1;
    int dropped = fit_turns(S, *n_reply + reply_room(S), &full, &n);
    if (dropped < 0) return 1;
    int room = S->n_ctx - S->n_pin - n - 1, off = 0;
    if (*n_reply >= room && !allow_cut) {
        free(full);
        chat_notice(S, "context full: the reply stops here (a larger -c, or --ignore-eos, lets it go on)");
        return 3;
    }
    if (*n_reply > room) off = *n_reply - room / 2; /* keep the newer half of what fits */
    int nw;
    int32_t *w = with_pin(S, full, n, &nw);
    free(full);
    int32_t *all = w ? realloc(w, sizeof *w * (size_t)(nw + *n_reply - off + 1)) : NULL;
    if (!all) {
        free(w);
        return kvq_tool_die(CHAT_PROG, "out of memory");
    }
    memmove(reply, reply + off, sizeof *reply * (size_t)(*n_reply - off));
    *n_reply -= off;
    memcpy(all + nw, reply, sizeof *all * (size_t)*n_reply);
    S->n_shifts++;
    long evals = S->n_prompt_eval;
    int r = sync_cache(S, all, nw + *n_reply);
    free(all);
    if (r == 0)
        chat_notice(S, "context full: dropped %d oldest turn(s)%s; %ld tokens re-evaluated", dropped,
                    off ? " and the start of this reply" : "", S->n_prompt_eval - evals);
    return r;
}

/* With spec, before a step: when the cache is full its pending token (the last of ids and
 * reply) cannot go in, so the context shifts as plain decoding would before evaluating it, and
 * the steps continue from the rebuilt cache. Returns 0, else as shift_in_reply. */
static int spec_room(chat_session *S, int32_t *reply, int *n_reply) {
    if (!chat_spec_empty(S->spec) || kvq_n_past(S->c) < S->n_ctx) return 0;
    int32_t pend = S->ids[S->n_ids - 1];
    if (chat_spec_settle(S->spec, S->c, S->ids, S->n_ids - 1)) return 1;
    S->n_ids--, (*n_reply)--;
    int r = shift_in_reply(S, reply, n_reply, S->o->ignore_eos);
    if (r) return r;
    if (kvq_eval(S->c, &pend, 1) != KVQ_OK) return kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
    S->ids[S->n_ids++] = pend;
    reply[(*n_reply)++] = pend;
    kvq_sampler_accept(S->s, pend);
    return chat_spec_start(S->spec, S->ids, S->n_ids);
}

static int generate(chat_session *S) {
    const chat_opts *o = S->o;
    kvq_detok *dt = kvq_detok_new(S->tok, 1);
    int32_t *reply = malloc(sizeof *reply * (size_t)(S->n_ctx + 1));
    if (!dt || !reply) {
        kvq_detok_free(dt);
        free(reply);
        return kvq_tool_die(CHAT_PROG, "out of memory");
    }
    char piece[1024];
    /* running text: decode in the context of what precedes, so spaces stay */
    if (S->plain)
        for (int i = 0; i < S->n_ids; i++) kvq_detok_push(dt, S->ids[i], piece, sizeof piece);
    strbuf text = {0};
    sb_add(&text, "");
    emitter em = {0};
    int n_reply = 0, rc = 0, content_seen = 0;
    long gen = 0;
    double t0 = kvq_tool_now();
    if (S->spec && chat_spec_start(S->spec, S->ids, S->n_ids)) rc = 1;
    while (!rc && !chat_interrupted && (o->n_predict < 0 || gen < o->n_predict)) {
        int32_t id;
        if (S->spec) {
            if ((rc = spec_room(S, reply, &n_reply)) != 0) {
                if (rc != 1) rc = 0;
                break;
            }
            if ((id = chat_spec_next(S->spec, S->s, o->n_predict < 0 ? 0 : o->n_predict - gen)) < 0) {
                rc = 1;
                break;
            }
        } else {
            id = kvq_sample(S->s, kvq_logits(S->c), S->n_vocab);
        }
        if (!o->ignore_eos && kvq_token_is_eog(S->tok, id)) break;
        int k = kvq_detok_push(dt, id, piece, sizeof piece);
        if (k > 0) {
            emit(&em, piece);
            sb_add(&text, piece);
        }
        gen++;
        if (!S->spec && S->n_ids >= S->n_ctx) {
            int r = shift_in_reply(S, reply, &n_reply, o->ignore_eos);
            if (r == 1) { rc = 1; break; }
            if (r >= 2) break;
        }
        if (!S->spec && kvq_eval(S->c, &id, 1) != KVQ_OK) {
            rc = kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
            break;
        }
        S->ids[S->n_ids++] = id; /* with spec: in the cache, or the step's pending token */
        reply[n_reply++] = id;
        if (!S->spec) kvq_sampler_accept(S->s, id);
        /* running text: a reply is the rest of the line */
        if (S->plain && !o->ignore_eos && k > 0) {
            char *nl = strchr(piece, '\n');
            for (const char *q = piece; q < (nl ? nl : piece + k); q++)
                if (*q != ' ' && *q != '\t') content_seen = 1;
            if (nl && content_seen) break;
        }
    }
    if (S->spec && !rc && chat_spec_settle(S->spec, S->c, S->ids, S->n_ids)) rc = 1;
    if (kvq_detok_flush(dt, piece, sizeof piece) > 0) {
        emit(&em, piece);
        sb_add(&text, piece);
    }
    putchar('\n');
    fflush(stdout);
    S->t_gen += kvq_tool_now() - t0;
    S->n_gen += gen;
    kvq_detok_free(dt);
    free(reply);
    if (!rc) {
        /* templates add their own separators around a reply: store it trimmed */
        char *c = text.p ? text.p : "";
        if (!S->plain) {
            while (*c == ' ' || *c == '\n' || *c == '\t' || *c == '\r') c++;
            size_t len = strlen(c);
            while (len && (c[len - 1] == ' ' || c[len - 1] == '\n' || c[len - 1] == '\t' || c[len - 1] == '\r')) c[--len] = 0;
        }
        if (insert_msg(S, S->n_msgs, "assistant", c)) rc = kvq_tool_die(CHAT_PROG, "out of memory");
    }
    free(text.p);
    return rc;
}

int chat_turn(chat_session *S, const char *text) {
    if (insert_msg(S, S->n_msgs, "user", text)) return kvq_tool_die(CHAT_PROG, "out of memory");
    int32_t *full;
    /* first the input alone (with the system message): when even that does not fit, keep the conversation */
    chat_msg alone[2];
    int n_alone = 0;
    if (has_system(S)) alone[n_alone++] = S->msgs[0];
    alone[n_alone++] = S->msgs[S->n_msgs - 1];
    int n = render_msgs(S, alone, n_alone, 1, &full);
    if (n < 0) return 1;
    free(full);
    if (S->n_pin + n + reply_room(S) > S->n_ctx) {
        long need = ((long)S->n_pin + n + reply_room(S) + 255) / 256 * 256;
        chat_notice(S, "input too long: %d tokens with the template, the context holds %d (-c %ld would fit)", n, S->n_ctx, need);
        remove_msgs(S, S->n_msgs - 1, 1);
        putchar('\n'); /* an empty reply keeps replies paired with inputs */
        fflush(stdout);
        return 0;
    }
    if ((n = render_ids(S, S->n_msgs, 1, &full)) < 0) return 1;
    int before = S->n_msgs;
    int dropped = fit_turns(S, reply_room(S), &full, &n);
    if (dropped < 0) return 1;
    int nw;
    int32_t *w = with_pin(S, full, n, &nw);
    free(full);
    if (!w) return kvq_tool_die(CHAT_PROG, "out of memory");
    if (nw == 0) { /* an empty first input to a model without BOS: nothing to continue from */
        free(w);
        remove_msgs(S, S->n_msgs - 1, 1);
        putchar('\n');
        fflush(stdout);
        return 0;
    }
    int reused = 0;
    while (reused < S->n_ids && reused < nw && S->ids[reused] == w[reused]) reused++;
    int r = sync_cache(S, w, nw);
    free(w);
    if (r == 0 && S->o->prompt_cache && !S->cache_saved && reused < S->n_ids) /* what the next run can start from */
        S->cache_saved = !chat_cache_save(S, S->o->prompt_cache);
    if (S->o->verbose_prompt)
        chat_notice(S, "turn: %d tokens evaluated, %d reused from the cache", S->n_ids - reused, reused);
    if (dropped) {
        S->n_shifts++;
        chat_notice(S, "context full: dropped %d oldest turn(s) (%d messages); %d tokens in context", dropped, before - S->n_msgs, S->n_ids);
    }
    if (r == 1) return 1;
    if (r == 2) { /* interrupted while reading the prompt: forget this input */
        remove_msgs(S, S->n_msgs - 1, 1);
        putchar('\n');
        fflush(stdout);
        return 0;
    }
    return generate(S);
}

void chat_reset(chat_session *S) {
    int keep = has_system(S) ? 1 : 0;
    remove_msgs(S, keep, S->n_msgs - keep);
    kvq_kv_truncate(S->c, 0);
    S->n_ids = 0;
    free(S->pin);
    S->pin = NULL;
    S->n_pin = S->pin_at = 0;
    kvq_sampler_reset(S->s);
}

int chat_set_system(chat_session *S, const char *text) {
    if (has_system(S)) remove_msgs(S, 0, 1);
    if (text && *text && insert_msg(S, 0, "system", text)) return kvq_tool_die(CHAT_PROG, "out of memory");
    free(S->pin); /* positions move: the pin no longer applies */
    S->pin = NULL;
    S->n_pin = S->pin_at = 0;
    return 0;
}
