/* The JSON constraint on a vocabulary: each token's bytes (as the decoder writes them in the
 * middle of a text), sorted so that tokens sharing a prefix share the matcher's work, and a
 * mask of the tokens that keep the value valid. Sampling checks the sampler's pick first and
 * computes the whole mask only when the pick is rejected. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"
#include "util.h"

struct kvq_json_constraint {
    js_schema *s;
    js_state st;
    int n_vocab;
    uint8_t *bytes;      /* token bytes, all ids */
    uint32_t *off, *len; /* len 0: never generated (special, or empty) */
    uint8_t *eog;
    int32_t *order; /* ids with bytes, sorted by them */
    uint16_t *lcp;  /* bytes order[i] shares with order[i-1] */
    int n_order, max_len;
    js_state *path; /* path[k]: the state after k bytes of the token being tried */
    float *scratch;
};

/* Replaces each `from` in buf[0..*n) by `to` (to no longer than from). */
static void replace_lit(char *buf, size_t *n, const char *from, size_t fl, const char *to, size_t tl) {
    if (!fl || tl > fl) return;
    size_t w = 0;
    for (size_t r = 0; r < *n;) {
        if (r + fl <= *n && !memcmp(buf + r, from, fl)) {
            memcpy(buf + w, to, tl);
            w += tl;
            r += fl;
        } else buf[w++] = buf[r++];
    }
    *n = w;
}

/* The bytes token id adds in the middle of a text: the decoder's steps applied to the one
 * piece, without the start-of-text rules (Strip) that only touch a text's first token. */
static size_t token_bytes(const kvq_tokenizer *t, int32_t id, char *buf, size_t cap) {
    size_t n;
    const char *s = tk_id_text(t, id, &n);
    if (!s || n >= cap) return 0;
    memcpy(buf, s, n);
    for (int i = 0; i < t->dec.n; i++) {
        const tk_step *st = &t->dec.s[i];
        switch (st->type) {
        case TK_D_REPLACE:
            if (st->str) replace_lit(buf, &n, st->str, st->str_len, st->content, st->content_len);
            break;
        case TK_D_METASPACE:
            replace_lit(buf, &n, st->str, st->str_len, " ", 1);
            break;
        case TK_D_BYTEFALLBACK: {
            int b = tk_byte_token(buf, n);
            if (b >= 0) {
                buf[0] = (char)b;
                n = 1;
            }
            break;
        }
        case TK_D_BYTELEVEL: {
            size_t w = 0, adv;
            char out[256];
            for (size_t k = 0; k < n; k += adv) {
                int32_t cp = tk_utf8_decode(buf + k, n - k, &adv);
                int byte = cp >= 0 && cp < 324 ? t->cp_byte[cp] : -1;
                if (byte < 0 || w == sizeof out) { w = SIZE_MAX; break; } /* not in the byte alphabet: stays as is */
                out[w++] = (char)byte;
            }
            if (w != SIZE_MAX && w <= n) {
                memcpy(buf, out, w);
                n = w;
            }
            break;
        }
        default: break;
        }
    }
    return n;
}

static const kvq_json_constraint *g_sort; /* qsort has no context argument */
static int by_bytes(const void *a, const void *b) {
    const kvq_json_constraint *c = g_sort;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = c->len[x], ly = c->len[y];
    int r = memcmp(c->bytes + c->off[x], c->bytes + c->off[y], lx < ly ? lx : ly);
    return r ? r : lx < ly ? -1 : lx > ly ? 1 : x - y;
}

static int load_vocab(kvq_json_constraint *c, const kvq_tokenizer *t) {
    int n = c->n_vocab = kvq_vocab_size(t);
    size_t cap = 1 << 16, used = 0;
    c->bytes = malloc(cap);
    c->off = calloc((size_t)n, sizeof *c->off);
    c->len = calloc((size_t)n, sizeof *c->len);
    c->eog = calloc((size_t)n, 1);
    c->order = malloc(sizeof *c->order * (size_t)n);
    c->lcp = calloc((size_t)n, sizeof *c->lcp);
    if (!c->bytes || !c->off || !c->len || !c->eog || !c->order || !c->lcp) return -1;
    char buf[1024];
    for (int id = 0; id < n; id++) {
        c->eog[id] = (uint8_t)(kvq_token_is_eog(t, id) != 0);
        if (t->attr[id] & TK_ATTR_SPECIAL) continue;
        size_t k = token_bytes(t, id, buf, sizeof buf);
        if (!k || k > 255) continue;
        if (used + k > cap) {
            uint8_t *p = realloc(c->bytes, cap *= 2);
            if (!p) return -1;
            c->bytes = p;
        }
        memcpy(c->bytes + used, buf, k);
        c->off[id] = (uint32_t)used;
        c->len[id] = (uint32_t)k;
        used += k;
        c->order[c->n_order++] = id;
        if ((int)k > c->max_len) c->max_len = (int)k;
    }
    g_sort = c;
    qsort(c->order, (size_t)c->n_order, sizeof *c->order, by_bytes);
    for (int i = 1; i < c->n_order; i++) {
        const uint8_t *a = c->bytes + c->off[c->order[i - 1]], *b = c->bytes + c->off[c->order[i]];
        uint32_t l = c->len[c->order[i - 1]] < c->len[c->order[i]] ? c->len[c->order[i - 1]] : c->len[c->order[i]], k = 0;
        while (k < l && a[k] == b[k]) k++;
        c->lcp[i] = (uint16_t)k;
    }
    c->path = malloc(sizeof *c->path * (size_t)(c->max_len + 1));
    c->scratch = malloc(sizeof *c->scratch * (size_t)n);
    return c->path && c->scratch ? 0 : -1;
}

kvq_json_constraint *kvq_json_constraint_new(const kvq_tokenizer *tok, const char *schema, int strict, char *err,
                                             size_t errsz) {
    char e[256] = "";
    kvq_json_constraint *c = calloc(1, sizeof *c);
    if (!c) snprintf(e, sizeof e, "out of memory");
    else if (!(c->s = js_compile(schema, schema ? strlen(schema) : 0, e, sizeof e, strict))) {
    } else if (tok && load_vocab(c, tok)) snprintf(e, sizeof e, "out of memory");
    if (e[0]) {
        kvq_json_constraint_free(c);
        if (err && errsz) snprintf(err, errsz, "%s", e);
        kvq_fail(KVQ_ERR_ARG, "json schema: %s", e);
        return NULL;
    }
    js_start(&c->st, c->s);
    return c;
}

void kvq_json_constraint_free(kvq_json_constraint *c) {
    if (!c) return;
    js_free(c->s);
    free(c->bytes);
    free(c->off);
    free(c->len);
    free(c->eog);
    free(c->order);
    free(c->lcp);
    free(c->path);
    free(c->scratch);
    free(c);
}

void kvq_json_constraint_reset(kvq_json_constraint *c) {
    if (c) js_start(&c->st, c->s);
}

int kvq_json_constraint_complete(const kvq_json_constraint *c) {
    return !c ? 0 : js_is_done(&c->st) ? 2 : js_can_end(&c->st) ? 1 : 0;
}

/* Feeds n bytes to a copy of the state; 0 when all are taken (*out holds the result). */
static int try_bytes(const js_state *from, const uint8_t *p, size_t n, js_state *out) {
    js_copy(out, from);
    for (size_t i = 0; i < n; i++)
        if (js_feed(out, p[i])) return -1;
    return 0;
}

int kvq_json_constraint_allows(const kvq_json_constraint *c, int32_t id) {
    if (!c || !c->bytes || id < 0 || id >= c->n_vocab) return 0;
    if (c->eog[id]) return js_can_end(&c->st);
    if (!c->len[id]) return 0;
    js_state tmp;
    return !try_bytes(&c->st, c->bytes + c->off[id], c->len[id], &tmp);
}

int kvq_json_constraint_feed(kvq_json_constraint *c, const char *text, size_t len) {
    js_state tmp;
    if (!c || try_bytes(&c->st, (const uint8_t *)text, len, &tmp)) return -1;
    js_copy(&c->st, &tmp);
    return 0;
}

int kvq_json_constraint_accept(kvq_json_constraint *c, int32_t id) {
    if (!kvq_json_constraint_allows(c, id)) return -1;
    if (c->eog[id]) return 0;
    return kvq_json_constraint_feed(c, (const char *)c->bytes + c->off[id], c->len[id]);
}

void kvq_json_constraint_apply(kvq_json_constraint *c, float *logits, int n_vocab) {
    if (!c || !c->bytes || !logits) return;
    int n = n_vocab < c->n_vocab ? n_vocab : c->n_vocab;
    /* allowed ids keep their logit: save them, clear all, put them back */
    int can_end = js_can_end(&c->st), any = 0;
    float *keep = c->scratch;
    for (int i = 0; i < n; i++) {
        keep[i] = logits[i];
        logits[i] = -INFINITY;
    }
    for (int i = n; i < n_vocab; i++) logits[i] = -INFINITY;
    js_copy(&c->path[0], &c->st);
    int good = 0;      /* path[0..good] hold the states of the previous token's prefix */
    int fail_at = -1;  /* the previous token failed at this byte (-1: it did not) */
    for (int k = 0; k < c->n_order; k++) {
        int32_t id = c->order[k];
        const uint8_t *p = c->bytes + c->off[id];
        int len = (int)c->len[id], l = k ? c->lcp[k] : 0;
        if (fail_at >= 0 && l > fail_at) continue; /* shares the byte that failed */
        if (l > good) l = good;
        fail_at = -1;
        for (int i = l; i < len; i++) {
            js_copy(&c->path[i + 1], &c->path[i]);
            if (js_feed(&c->path[i + 1], p[i])) {
                fail_at = i;
                break;
            }
        }
        good = fail_at >= 0 ? fail_at : len;
        if (fail_at < 0 && id < n) {
            logits[id] = keep[id];
            any = 1;
        }
    }
    /* nothing can continue (a dead end): let the generation end rather than loop */
    for (int i = 0; i < n; i++)
        if (c->eog[i] && (can_end || !any)) logits[i] = keep[i];
}

int32_t kvq_json_constraint_sample(kvq_json_constraint *c, kvq_sampler *s, const float *logits, int n_vocab) {
    int32_t id = kvq_sample(s, logits, n_vocab);
    if (!c || !c->bytes || kvq_json_constraint_allows(c, id)) return id;
    float *m = malloc(sizeof *m * (size_t)n_vocab);
    if (!m) return id;
    memcpy(m, logits, sizeof *m * (size_t)n_vocab);
    kvq_json_constraint_apply(c, m, n_vocab);
    id = kvq_sample(s, m, n_vocab);
    free(m);
    return id;
}
