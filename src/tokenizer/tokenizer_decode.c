/* Ids -> text, as HF `tokenizers` decode: the token strings go through the
 * decoder chain (Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace...).
 *
 * The chain runs as a stream: each step takes text items one at a time, each
 * flagged as starting a new token or continuing the current one, and passes
 * its output on. Per-token rules (Strip, Metaspace's first token) follow the
 * flags, and byte-producing steps decode UTF-8 incrementally, holding back only
 * an incomplete trailing sequence. kvq_detokenize is "push all, then flush", so
 * streaming and one-shot decoding give the same text by construction. */
#include "tokenizer.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- parsing --------------------------------------------------------------------- */

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static kvq_status dup_str(const char *v, char **dst, size_t *len, const char *file) {
    *dst = strdup(v);
    *len = strlen(v);
    return *dst ? KVQ_OK : kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
}

/* A one-character string as a code point (-1 if it is not exactly one character). */
static int32_t one_char(const char *s) {
    size_t n = strlen(s), adv;
    int32_t cp = tk_utf8_decode(s, n, &adv);
    return n && adv == n ? cp : -1;
}

static kvq_status parse_one(const cJSON *j, const char *file, tk_steps *st) {
    const char *ty = jstr(j, "type");
    if (!ty) return kvq_fail(KVQ_ERR_FORMAT, "%s: decoder without a type", file);
    kvq_status rc;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (!cJSON_IsArray(list)) return kvq_fail(KVQ_ERR_FORMAT, "%s: Sequence decoder without a list", file);
        for (const cJSON *e = list->child; e; e = e->next)
            if ((rc = parse_one(e, file, st))) return rc;
        return KVQ_OK;
    }
    static const struct { const char *name; int type; } known[] = {
        {"Replace", TK_D_REPLACE}, {"ByteFallback", TK_D_BYTEFALLBACK}, {"Fuse", TK_D_FUSE},
        {"Strip", TK_D_STRIP},     {"ByteLevel", TK_D_BYTELEVEL},       {"Metaspace", TK_D_METASPACE},
    };
    int type = -1;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(ty, known[i].name)) type = known[i].type;
    if (type < 0) return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: decoder type \"%.60s\" is not supported", file, ty);
    tk_step *s = tk_steps_add(st, type);
    if (!s) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
    if (type == TK_D_REPLACE) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const char *lit = jstr(p, "String"), *re = jstr(p, "Regex"), *content = jstr(j, "content");
        if ((!lit && !re) || !content) return kvq_fail(KVQ_ERR_FORMAT, "%s: Replace decoder needs pattern and content", file);
        if (lit && (rc = dup_str(lit, &s->str, &s->str_len, file))) return rc;
        if (re && !(s->re = tk_regex_compile(re, strlen(re), file))) return KVQ_ERR_UNSUPPORTED;
        return dup_str(content, &s->content, &s->content_len, file);
    }
    if (type == TK_D_STRIP) {
        const char *c = jstr(j, "content");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "start"), *b = cJSON_GetObjectItemCaseSensitive(j, "stop");
        s->ch = c ? one_char(c) : -1;
        if (s->ch < 0 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble < 0 || b->valuedouble < 0 ||
            a->valuedouble > 1e6 || b->valuedouble > 1e6)
            return kvq_fail(KVQ_ERR_FORMAT, "%s: Strip decoder needs a one-character content, start and stop", file);
        s->flag_a = (int)a->valuedouble;
        s->flag_b = (int)b->valuedouble;
    }
    if (type == TK_D_METASPACE) {
        const char *r = jstr(j, "replacement"), *scheme = jstr(j, "prepend_scheme");
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        if ((rc = dup_str(r && *r ? r : "\xe2\x96\x81", &s->str, &s->str_len, file))) return rc;
        s->flag_a = cJSON_IsFalse(aps) ? TK_PREPEND_NEVER : TK_PREPEND_ALWAYS;
        if (scheme) s->flag_a = !strcmp(scheme, "never") ? TK_PREPEND_NEVER : !strcmp(scheme, "first") ? TK_PREPEND_FIRST
                                                                                                        : TK_PREPEND_ALWAYS;
    }
    return KVQ_OK;
}

kvq_status tk_parse_decoder(const cJSON *j, const char *file, tk_steps *st) {
    if (!j || cJSON_IsNull(j)) {
        /* without a decoder HF joins the tokens with spaces */
        return tk_steps_add(st, TK_D_JOIN) ? KVQ_OK : kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
    }
    return parse_one(j, file, st);
}

/* ---- streaming ---------------------------------------------------------------------- */

typedef struct {
    tk_buf pend; /* bytes not yet decodable (ByteFallback, ByteLevel) */
    tk_buf tmp;  /* this step's output item */
    int started; /* an item went out (of the run / of the whole stream) */
    int in_run;  /* ByteFallback: inside a run of <0xNN> tokens */
    long count;  /* Metaspace: tokens seen; Strip: leading chars stripped */
    long held;   /* Strip: trailing content chars held back */
    int strip_done;
} tk_dstate;

struct kvq_detok {
    const kvq_tokenizer *t;
    int skip_special;
    tk_dstate *st;
    tk_buf out; /* completed text not yet handed out */
    tk_spans spans;
    pcre2_match_data *md;
};

static int feed(kvq_detok *d, int i, const char *s, size_t n, int new_tok);

/* "<0xNN>" -> NN, else -1 (ByteFallback's byte tokens). */
int tk_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (x < 0) return -1;
        v = v * 16 + x;
    }
    return v;
}

/* Decodes what is pending in step i's byte buffer and passes it on; final turns an
 * incomplete tail into U+FFFD. The first item out of a run/stream starts a token. */
static int emit_bytes(kvq_detok *d, int i, int final) {
    tk_dstate *ds = &d->st[i];
    ds->tmp.len = 0;
    long used = tk_utf8_lossy((const uint8_t *)ds->pend.p, ds->pend.len, final, &ds->tmp);
    if (used < 0) return -1;
    if (used) {
        memmove(ds->pend.p, ds->pend.p + used, ds->pend.len - (size_t)used);
        ds->pend.len -= (size_t)used;
    }
    if (!ds->tmp.len) return 0;
    int first = !ds->started;
    ds->started = 1;
    return feed(d, i + 1, ds->tmp.p, ds->tmp.len, first);
}

static int put_cp(tk_buf *b, int32_t cp) {
    char u[4];
    return tk_buf_put(b, u, (size_t)tk_utf8_encode(cp, u));
}

static int feed_strip(kvq_detok *d, int i, const tk_step *st, const char *s, size_t n, int new_tok) {
    tk_dstate *ds = &d->st[i];
    if (new_tok) { /* the previous token's held trailing chars are stripped for good */
        ds->count = ds->held = 0;
        ds->strip_done = 0;
    }
    ds->tmp.len = 0;
    if (tk_buf_reserve(&ds->tmp, n)) return -1;
    for (size_t k = 0, adv; k < n; k += adv) {
        int32_t cp = tk_utf8_decode(s + k, n - k, &adv);
        if (!ds->strip_done) {
            if (ds->count < st->flag_a && cp == st->ch) {
                ds->count++;
                continue;
            }
            ds->strip_done = 1;
        }
        if (st->flag_b > 0) {
            if (cp == st->ch) { /* may be trailing: hold back at most `stop` of them */
                if (++ds->held > st->flag_b) {
                    ds->held--;
                    if (put_cp(&ds->tmp, cp)) return -1;
                }
                continue;
            }
            for (; ds->held > 0; ds->held--)
                if (put_cp(&ds->tmp, st->ch)) return -1;
        }
        if (tk_buf_put(&ds->tmp, s + k, adv)) return -1;
    }
    return feed(d, i + 1, ds->tmp.p, ds->tmp.len, new_tok);
}

static int feed(kvq_detok *d, int i, const char *s, size_t n, int new_tok) {
    const kvq_tokenizer *t = d->t;
    if (i == t->dec.n) return tk_buf_put(&d->out, s, n);
    const tk_step *st = &t->dec.s[i];
    tk_dstate *ds = &d->st[i];
    switch (st->type) {
    case TK_D_JOIN:
        if (new_tok && ds->started && feed(d, i + 1, " ", 1, 0)) return -1;
        ds->started = 1;
        return feed(d, i + 1, s, n, new_tok);
    case TK_D_FUSE: {
        int first = !ds->started;
        ds->started = 1;
        return feed(d, i + 1, s, n, first);
    }
    case TK_D_REPLACE: case TK_D_METASPACE: {
        if (st->type == TK_D_METASPACE && new_tok) ds->count++;
        if (st->re && !d->md && !(d->md = pcre2_match_data_create(1, NULL))) return tk_nomem();
        if (tk_find_all(st->re, st->str, st->str_len, s, n, d->md, &d->spans)) return -1;
        if (!d->spans.n) return feed(d, i + 1, s, n, new_tok);
        const char *with = st->content;
        size_t with_len = st->content_len;
        if (st->type == TK_D_METASPACE) {
            /* HF drops every replacement char of the first token when a prefix was prepended */
            int drop = ds->count == 1 && st->flag_a != TK_PREPEND_NEVER;
            with = " ";
            with_len = drop ? 0 : 1;
        }
        ds->tmp.len = 0;
        size_t prev = 0;
        for (size_t k = 0; k < d->spans.n; k++) {
            if (tk_buf_put(&ds->tmp, s + prev, d->spans.se[2 * k] - prev) || tk_buf_put(&ds->tmp, with, with_len))
                return -1;
            prev = d->spans.se[2 * k + 1];
        }
        if (tk_buf_put(&ds->tmp, s + prev, n - prev)) return -1;
        return feed(d, i + 1, ds->tmp.p, ds->tmp.len, new_tok);
    }
    case TK_D_BYTEFALLBACK: {
        int b = new_tok ? tk_byte_token(s, n) : -1;
        if (b >= 0) {
            if (!ds->in_run) {
                ds->in_run = 1;
                ds->started = 0;
            }
            uint8_t c = (uint8_t)b;
            return tk_buf_put(&ds->pend, &c, 1) ? -1 : emit_bytes(d, i, 0);
        }
        if (ds->in_run) { /* a run of bytes ends: whatever is left is invalid */
            ds->in_run = 0;
            if (emit_bytes(d, i, 1)) return -1;
        }
        return feed(d, i + 1, s, n, new_tok);
    }
    case TK_D_BYTELEVEL: {
        /* a token spelled in the byte alphabet becomes its bytes; any other token stays as is */
        size_t mark = ds->pend.len, adv;
        for (size_t k = 0; k < n; k += adv) {
            int32_t cp = tk_utf8_decode(s + k, n - k, &adv);
            int byte = cp >= 0 && cp < 324 ? t->cp_byte[cp] : -1;
            if (byte < 0) {
                ds->pend.len = mark;
                if (tk_buf_put(&ds->pend, s, n)) return -1;
                break;
            }
            uint8_t c = (uint8_t)byte;
            if (tk_buf_put(&ds->pend, &c, 1)) return -1;
        }
        return emit_bytes(d, i, 0);
    }
    case TK_D_STRIP:
        return feed_strip(d, i, st, s, n, new_tok);
    }
    return feed(d, i + 1, s, n, new_tok);
}

/* End of stream: pending bytes become text (or U+FFFD), held trailing chars are dropped. */
static int flush_steps(kvq_detok *d) {
    for (int i = 0; i < d->t->dec.n; i++) {
        tk_dstate *ds = &d->st[i];
        int type = d->t->dec.s[i].type;
        if ((type == TK_D_BYTEFALLBACK && ds->in_run) || (type == TK_D_BYTELEVEL && ds->pend.len))
            if (emit_bytes(d, i, 1)) return -1;
    }
    /* the stream is over: a later push starts a new text */
    for (int i = 0; i < d->t->dec.n; i++) {
        tk_dstate *ds = &d->st[i];
        ds->pend.len = 0;
        ds->started = ds->in_run = ds->strip_done = 0;
        ds->count = ds->held = 0;
    }
    return 0;
}

kvq_detok *kvq_detok_new(const kvq_tokenizer *tok, int skip_special) {
    if (!tok) {
        kvq_fail(KVQ_ERR_ARG, "kvq_detok_new: no tokenizer");
        return NULL;
    }
    kvq_detok *d = calloc(1, sizeof *d);
    if (d) d->st = calloc((size_t)tok->dec.n + 1, sizeof *d->st);
    if (!d || !d->st) {
        free(d);
        kvq_fail(KVQ_ERR_NOMEM, "kvq_detok_new: out of memory");
        return NULL;
    }
    d->t = tok;
    d->skip_special = skip_special;
    return d;
}

void kvq_detok_free(kvq_detok *d) {
    if (!d) return;
    for (int i = 0; i < d->t->dec.n; i++) {
        tk_buf_free(&d->st[i].pend);
        tk_buf_free(&d->st[i].tmp);
    }
    free(d->st);
    tk_buf_free(&d->out);
    free(d->spans.se);
    pcre2_match_data_free(d->md);
    free(d);
}

static int push_id(kvq_detok *d, int32_t id) {
    if (id < 0) {
        kvq_fail(KVQ_ERR_ARG, "%s: negative token id %d", d->t->file, (int)id);
        return -1;
    }
    size_t len;
    const char *s = tk_id_text(d->t, id, &len);
    /* unknown ids are skipped, as HF does */
    if (!s || (d->skip_special && (d->t->attr[id] & TK_ATTR_SPECIAL))) return 0;
    return feed(d, 0, s, len, 1);
}

/* Hands out as much completed text as fits, ending on a character boundary;
 * the rest stays queued for the next call. */
static int hand_out(kvq_detok *d, char *out, size_t size) {
    if (!out || !size) return 0;
    size_t n = d->out.len < size - 1 ? d->out.len : size - 1;
    if (n < d->out.len)
        while (n > 0 && ((uint8_t)d->out.p[n] & 0xC0) == 0x80) n--;
    if (n > INT_MAX) n = INT_MAX;
    out[n] = 0;
    if (!n) return 0;
    memcpy(out, d->out.p, n);
    memmove(d->out.p, d->out.p + n, d->out.len - n);
    d->out.len -= n;
    return (int)n;
}

int kvq_detok_push(kvq_detok *d, int32_t id, char *out, size_t size) {
    if (!d) {
        kvq_fail(KVQ_ERR_ARG, "kvq_detok_push: no decoder");
        return -1;
    }
    if (push_id(d, id)) return -1;
    return hand_out(d, out, size);
}

int kvq_detok_flush(kvq_detok *d, char *out, size_t size) {
    if (!d) {
        kvq_fail(KVQ_ERR_ARG, "kvq_detok_flush: no decoder");
        return -1;
    }
    if (flush_steps(d)) return -1;
    return hand_out(d, out, size);
}

int kvq_detokenize(const kvq_tokenizer *tok, const int32_t *ids, int n, int skip_special, char *out, size_t size) {
    if (!tok || n < 0 || (!ids && n > 0)) {
        kvq_fail(KVQ_ERR_ARG, "kvq_detokenize: bad arguments");
        return -1;
    }
    kvq_detok *d = kvq_detok_new(tok, skip_special);
    if (!d) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = push_id(d, ids[i]);
    if (!rc) rc = flush_steps(d);
    if (!rc && d->out.len > INT_MAX) {
        kvq_fail(KVQ_ERR_ARG, "kvq_detokenize: text too long");
        rc = -1;
    }
    if (!rc) {
        rc = (int)d->out.len;
        if (out && size) {
            size_t k = d->out.len < size - 1 ? d->out.len : size - 1;
            if (k < d->out.len) /* cut on a character boundary */
                while (k > 0 && ((uint8_t)d->out.p[k] & 0xC0) == 0x80) k--;
            if (k) memcpy(out, d->out.p, k);
            out[k] = 0;
        }
    }
    kvq_detok_free(d);
    return rc;
}
