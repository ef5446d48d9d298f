/* The JSON constraint's view of a vocabulary (json_vocab.h): token bytes and their sorted
 * order, built once per tokenizer. Building takes ~25 ms at 32k ids and ~100 ms at 128k, which
 * every request with response_format or a forced tool call would otherwise pay. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_vocab.h"

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

/* Sort keys carry their bytes, so the comparison needs no shared state (builds may overlap). */
typedef struct {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
} sort_key;

static int by_bytes(const void *a, const void *b) {
    const sort_key *x = a, *y = b;
    int r = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    return r ? r : x->len < y->len ? -1 : x->len > y->len ? 1 : x->id - y->id;
}

void js_vocab_free(tk_cache *c) {
    js_vocab *v = (js_vocab *)c;
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->eog);
    free(v->order);
    free(v->lcp);
    free(v);
}

static int fill(js_vocab *v, const kvq_tokenizer *t) {
    int n = v->n_vocab = kvq_vocab_size(t);
    size_t cap = 1 << 16, used = 0;
    v->bytes = malloc(cap);
    v->off = calloc((size_t)n, sizeof *v->off);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->eog = calloc((size_t)n, 1);
    v->order = malloc(sizeof *v->order * (size_t)n);
    v->lcp = calloc((size_t)n, sizeof *v->lcp);
    if (!v->bytes || !v->off || !v->len || !v->eog || !v->order || !v->lcp) return -1;
    char buf[1024];
    for (int id = 0; id < n; id++) {
        v->eog[id] = (uint8_t)(kvq_token_is_eog(t, id) != 0);
        if (t->attr[id] & TK_ATTR_SPECIAL) continue;
        size_t k = token_bytes(t, id, buf, sizeof buf);
        if (!k || k > 255) continue;
        if (used + k > cap) {
            uint8_t *p = realloc(v->bytes, cap *= 2);
            if (!p) return -1;
            v->bytes = p;
        }
        memcpy(v->bytes + used, buf, k);
        v->off[id] = (uint32_t)used;
        v->len[id] = (uint32_t)k;
        used += k;
        v->order[v->n_order++] = id;
        if ((int)k > v->max_len) v->max_len = (int)k;
    }
    sort_key *keys = malloc(sizeof *keys * (size_t)(v->n_order ? v->n_order : 1));
    if (!keys) return -1;
    for (int i = 0; i < v->n_order; i++) {
        int32_t id = v->order[i];
        keys[i] = (sort_key){v->bytes + v->off[id], v->len[id], id};
    }
    qsort(keys, (size_t)v->n_order, sizeof *keys, by_bytes);
    for (int i = 0; i < v->n_order; i++) {
        v->order[i] = keys[i].id;
        if (!i) continue;
        uint32_t l = keys[i - 1].len < keys[i].len ? keys[i - 1].len : keys[i].len, k = 0;
        while (k < l && keys[i - 1].p[k] == keys[i].p[k]) k++;
        v->lcp[i] = (uint16_t)k;
    }
    free(keys);
    return 0;
}

js_vocab *js_vocab_build(const kvq_tokenizer *t) {
    js_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->base.free = js_vocab_free;
    if (fill(v, t)) {
        js_vocab_free(&v->base);
        return NULL;
    }
    return v;
}

const js_vocab *js_vocab_get(const kvq_tokenizer *t) {
    /* the cache lives in the tokenizer, which callers hold const: it is filled once, here */
    kvq_tokenizer *mt = (kvq_tokenizer *)t;
    tk_cache *c = atomic_load(&mt->json_vocab);
    if (c) return (const js_vocab *)c;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* one build at a time, not one per caller */
    pthread_mutex_lock(&mu);
    if (!(c = atomic_load(&mt->json_vocab))) {
        js_vocab *v = js_vocab_build(t);
        if (v) atomic_store(&mt->json_vocab, c = &v->base);
    }
    pthread_mutex_unlock(&mu);
    return (const js_vocab *)c;
}
