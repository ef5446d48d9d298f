/* A constraint on a vocabulary: the tokenizer's token bytes, sorted so that tokens sharing a
 * prefix share the matcher's work (json_vocab.c, built once per tokenizer), and a mask of the
 * tokens that keep the text valid. Sampling checks the sampler's pick first and computes the
 * whole mask only when the pick is rejected. The matcher is JSON under a schema or a GBNF
 * grammar (matcher.h); everything here works on either. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/json_vocab.h"
#include "grammar/matcher.h"
#include "util.h"

struct kvq_json_constraint {
    const gm_ops *ops;
    js_schema *s;      /* JSON (else NULL) */
    gb_grammar *gb;    /* GBNF (else NULL) */
    const void *g;     /* the one in use */
    void *st;          /* the text so far */
    void *tmp[2];      /* a token's bytes fed in turn */
    const js_vocab *v; /* the tokenizer's, shared (json_vocab.c); NULL: bytes only */
    char *path;        /* state k: the matcher after k bytes of the token being tried */
    float *scratch;
};

#define PATH(c, k) ((void *)((c)->path + (size_t)(k) * (c)->ops->size))

static int alloc_states(kvq_json_constraint *c, const kvq_tokenizer *t) {
    if (!(c->st = malloc(c->ops->size)) || !(c->tmp[0] = malloc(c->ops->size)) || !(c->tmp[1] = malloc(c->ops->size)))
        return -1;
    if (!t) return 0;
    if (!(c->v = js_vocab_get(t))) return -1;
    c->path = malloc(c->ops->size * (size_t)(c->v->max_len + 1));
    c->scratch = malloc(sizeof *c->scratch * (size_t)c->v->n_vocab);
    return c->path && c->scratch ? 0 : -1;
}

static kvq_json_constraint *finish_new(kvq_json_constraint *c, const kvq_tokenizer *tok, char *e, size_t esz,
                                       const char *what, char *err, size_t errsz) {
    if (!e[0] && alloc_states(c, tok)) snprintf(e, esz, "out of memory");
    if (e[0]) {
        kvq_json_constraint_free(c);
        if (err && errsz) snprintf(err, errsz, "%s", e);
        kvq_fail(KVQ_ERR_ARG, "%s: %s", what, e);
        return NULL;
    }
    c->ops->start(c->st, c->g);
    return c;
}

kvq_json_constraint *kvq_json_constraint_new(const kvq_tokenizer *tok, const char *schema, int strict, char *err,
                                             size_t errsz) {
    char e[256] = "";
    kvq_json_constraint *c = calloc(1, sizeof *c);
    if (!c) snprintf(e, sizeof e, "out of memory");
    else if ((c->s = js_compile(schema, schema ? strlen(schema) : 0, e, sizeof e, strict))) c->g = c->s, c->ops = &JS_OPS;
    return finish_new(c, tok, e, sizeof e, "json schema", err, errsz);
}

kvq_json_constraint *kvq_grammar_constraint_new(const kvq_tokenizer *tok, const char *gbnf, char *err, size_t errsz) {
    char e[256] = "";
    kvq_json_constraint *c = calloc(1, sizeof *c);
    if (!c) snprintf(e, sizeof e, "out of memory");
    else if ((c->gb = gb_compile(gbnf ? gbnf : "", e, sizeof e))) c->g = c->gb, c->ops = &GB_OPS;
    return finish_new(c, tok, e, sizeof e, "grammar", err, errsz);
}

void kvq_json_constraint_free(kvq_json_constraint *c) {
    if (!c) return;
    js_free(c->s);
    gb_free(c->gb);
    free(c->st);
    free(c->tmp[0]);
    free(c->tmp[1]);
    free(c->path);
    free(c->scratch);
    free(c);
}

void kvq_json_constraint_reset(kvq_json_constraint *c) {
    if (c) c->ops->start(c->st, c->g);
}

int kvq_json_constraint_complete(const kvq_json_constraint *c) {
    return !c ? 0 : c->ops->is_done(c->st) ? 2 : c->ops->can_end(c->st) ? 1 : 0;
}

const char *kvq_json_constraint_ignored(const kvq_json_constraint *c) { return c && c->s ? c->s->ignored : ""; }

void kvq_json_constraint_set_layout(kvq_json_constraint *c, int pretty) {
    if (c && c->s) c->s->pretty = pretty != 0;
}

/* Feeds n bytes to the paths, in c->tmp; the set they end in, or NULL when refused. */
static const void *try_bytes(kvq_json_constraint *c, const uint8_t *p, size_t n) {
    const void *cur = c->st;
    for (size_t i = 0; i < n; i++) {
        void *next = c->tmp[i & 1];
        c->ops->step(cur, p[i], next);
        if (!c->ops->alive(next)) return NULL;
        cur = next;
    }
    return cur;
}

int kvq_json_constraint_allows(const kvq_json_constraint *c, int32_t id) {
    if (!c || !c->v || id < 0 || id >= c->v->n_vocab) return 0;
    if (c->v->eog[id]) return c->ops->can_end(c->st);
    if (!c->v->len[id]) return 0;
    /* the scratch sets are the constraint's own, not part of its value */
    return try_bytes((kvq_json_constraint *)c, c->v->bytes + c->v->off[id], c->v->len[id]) != NULL;
}

int kvq_json_constraint_feed(kvq_json_constraint *c, const char *text, size_t len) {
    if (!c) return -1;
    if (!len) return 0;
    const void *r = try_bytes(c, (const uint8_t *)text, len);
    if (!r) return -1;
    c->ops->copy(c->st, r);
    return 0;
}

int kvq_json_constraint_accept(kvq_json_constraint *c, int32_t id) {
    if (!kvq_json_constraint_allows(c, id)) return -1;
    if (c->v->eog[id]) return 0;
    return kvq_json_constraint_feed(c, (const char *)c->v->bytes + c->v->off[id], c->v->len[id]);
}

void kvq_json_constraint_apply(kvq_json_constraint *c, float *logits, int n_vocab) {
    if (!c || !c->v || !logits) return;
    int n = n_vocab < c->v->n_vocab ? n_vocab : c->v->n_vocab;
    /* allowed ids keep their logit: save them, clear all, put them back */
    int can_end = c->ops->can_end(c->st), any = 0;
    float *keep = c->scratch;
    for (int i = 0; i < n; i++) {
        keep[i] = logits[i];
        logits[i] = -INFINITY;
    }
    for (int i = n; i < n_vocab; i++) logits[i] = -INFINITY;
    c->ops->copy(PATH(c, 0), c->st);
    int good = 0;      /* path[0..good] hold the states of the previous token's prefix */
    int fail_at = -1;  /* the previous token failed at this byte (-1: it did not) */
    for (int k = 0; k < c->v->n_order; k++) {
        int32_t id = c->v->order[k];
        const uint8_t *p = c->v->bytes + c->v->off[id];
        int len = (int)c->v->len[id], l = k ? c->v->lcp[k] : 0;
        if (fail_at >= 0 && l > fail_at) continue; /* shares the byte that failed */
        if (l > good) l = good;
        fail_at = -1;
        for (int i = l; i < len; i++) {
            c->ops->step(PATH(c, i), p[i], PATH(c, i + 1));
            if (!c->ops->alive(PATH(c, i + 1))) {
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
        if (c->v->eog[i] && (can_end || !any)) logits[i] = keep[i];
}

/* Bytes tried first when looking for a choice: two of them taken ends the search early. */
static const uint8_t PROBE_FIRST[] = "\"0123456789aetnsrilof-,}]{[:";

/* The bytes the value must go on with (every other byte refused there): how many, up to cap.
 * A string's text, a number's digits or a choice of key end it. */
static int forced_bytes(kvq_json_constraint *c, const void *from, uint8_t *out, int cap) {
    void *a = c->tmp[0], *b = c->tmp[1];
    if (from != a) c->ops->copy(a, from);
    int n = 0;
    while (n < cap && c->ops->alive(a) && !c->ops->can_end(a)) {
        int only = -1;
        uint8_t tried[256] = {0};
        for (int i = 0; i < 256 + (int)sizeof PROBE_FIRST - 1 && only != -2; i++) {
            int x = i < (int)sizeof PROBE_FIRST - 1 ? PROBE_FIRST[i] : i - ((int)sizeof PROBE_FIRST - 1);
            if (tried[x]) continue;
            tried[x] = 1;
            c->ops->step(a, (uint8_t)x, b);
            if (c->ops->alive(b)) only = only == -1 ? x : -2;
        }
        if (only < 0) break;
        out[n++] = (uint8_t)only;
        c->ops->step(a, (uint8_t)only, b);
        void *t = a;
        a = b, b = t;
    }
    return n;
}

/* The longest token whose bytes begin p[0..n) (-1: none), by binary search in sorted order. */
static int32_t longest_token(const js_vocab *v, const uint8_t *p, int n) {
    for (int len = n; len > 0; len--) {
        int lo = 0, hi = v->n_order - 1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            int32_t id = v->order[mid];
            uint32_t l = v->len[id];
            int r = memcmp(v->bytes + v->off[id], p, l < (uint32_t)len ? l : (uint32_t)len);
            if (!r) r = l < (uint32_t)len ? -1 : l > (uint32_t)len ? 1 : 0;
            if (!r) return id;
            if (r < 0) lo = mid + 1;
            else hi = mid - 1;
        }
    }
    return -1;
}

int32_t kvq_json_constraint_sample(kvq_json_constraint *c, kvq_sampler *s, const float *logits, int n_vocab) {
    /* text the schema forces (keys, punctuation, the rest of an enum value) is written as the
     * longest token it begins with: no draw, and no token spent on a piece of it */
    uint8_t forced[128];
    int nf = c && c->v ? forced_bytes(c, c->st, forced, 64) : 0;
    int32_t fid = nf ? longest_token(c->v, forced, nf) : -1;
    if (fid >= 0 && fid < n_vocab && kvq_json_constraint_allows(c, fid)) return fid;
    int32_t id = kvq_sample(s, logits, n_vocab);
    if (!c || !c->v) return id;
    if (!kvq_json_constraint_allows(c, id)) {
        float *m = malloc(sizeof *m * (size_t)n_vocab);
        if (!m) return id;
        memcpy(m, logits, sizeof *m * (size_t)n_vocab);
        kvq_json_constraint_apply(c, m, n_vocab);
        id = kvq_sample(s, m, n_vocab);
        free(m);
    }
    /* the pick settles what follows (the rest of a key or an enum value, say): the longest
     * token within the pick and that forced rest, so one token writes what several would */
    if (id < 0 || id >= c->v->n_vocab || c->v->eog[id] || !c->v->len[id] || c->v->len[id] > 64) return id;
    const uint8_t *p = c->v->bytes + c->v->off[id];
    int np = (int)c->v->len[id];
    const void *after = try_bytes(c, p, (size_t)np);
    if (!after) return id;
    memcpy(forced, p, (size_t)np);
    nf = forced_bytes(c, after, forced + np, 64);
    if (!nf) return id;
    fid = longest_token(c->v, forced, np + nf);
    return fid >= 0 && fid < n_vocab && (int)c->v->len[fid] > np && kvq_json_constraint_allows(c, fid) ? fid : id;
}
