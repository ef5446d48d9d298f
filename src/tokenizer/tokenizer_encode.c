/* Text -> ids, in HF `tokenizers` order: added tokens are cut out of the raw
 * text first (leftmost, longest match), each remaining segment is normalized,
 * then tokens marked `normalized` are cut out of the normalized text, and what
 * is left is pre-tokenized into pieces that go through BPE one by one. */
#include "tokenizer.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "util.h"

typedef struct {
    tk_pre_scratch pre;
    tk_bpe_scratch bpe;
    tk_ids ids;
} tk_enc;

static int is_word_char(int32_t cp) {
    if (cp == '_') return 1;
    if (cp < 0) return 0;
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO ? 1 : (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* Code point ending at s[end) (-1 if none / invalid). */
static int32_t cp_before(const char *s, size_t end, size_t *start) {
    if (!end) return -1;
    size_t k = end - 1;
    while (k > 0 && end - k < 4 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
    size_t adv;
    int32_t cp = tk_utf8_decode(s + k, end - k, &adv);
    if (k + adv != end) return -1;
    *start = k;
    return cp;
}

/* Next added token of kind (normalized flag) in s[from..n): the match as aho-corasick's
 * leftmost-longest search finds it, widened over whitespace for lstrip / rstrip. */
static const tk_added *next_added(const kvq_tokenizer *t, int kind, const char *s, size_t n, size_t from,
                                  size_t *ms, size_t *me) {
    if (t->added_first[kind][0] == t->added_first[kind][256]) return NULL; /* none of this kind */
    for (size_t p = from; p < n; p++) {
        uint8_t b = (uint8_t)s[p];
        const tk_added *hit = NULL;
        for (int i = t->added_first[kind][b]; i < t->added_first[kind][b + 1]; i++) {
            const tk_added *x = &t->added[i];
            if (x->len <= n - p && !memcmp(s + p, t->arena.p + x->off, x->len)) {
                hit = x;
                break; /* sorted longest first */
            }
        }
        if (!hit) continue;
        size_t start = p, stop = p + hit->len, adv, k;
        if (hit->single_word) {
            int before = is_word_char(cp_before(s, start, &k));
            int after = stop < n && is_word_char(tk_utf8_decode(s + stop, n - stop, &adv));
            if (before || after) {
                p = stop - 1; /* matches do not overlap: search on after this one */
                continue;
            }
        }
        if (hit->lstrip)
            for (int32_t cp; start > from && (cp = cp_before(s, start, &k)) >= 0 && tk_is_space(cp);) start = k;
        if (hit->rstrip)
            while (stop < n && tk_is_space(tk_utf8_decode(s + stop, n - stop, &adv))) stop += adv;
        *ms = start;
        *me = stop;
        return hit;
    }
    return NULL;
}

static int encode_pieces(const kvq_tokenizer *t, const char *s, size_t n, int first, tk_enc *e) {
    if (!n) return 0;
    tk_pieces *ps;
    if (tk_pretokenize(t, s, n, first, &e->pre, &ps)) return -1;
    for (size_t i = 0; i < ps->n; i++)
        if (tk_bpe_encode(t, ps->text.p + ps->p[i].off, ps->p[i].len, &e->bpe, &e->ids)) return -1;
    return 0;
}

/* A raw segment between added tokens: normalize, cut normalized added tokens, encode the rest. */
static int encode_segment(const kvq_tokenizer *t, const char *s, size_t n, int first, tk_enc *e) {
    if (!n) return 0;
    tk_buf *norm;
    if (tk_normalize(t, s, n, &e->pre, &norm)) return -1;
    size_t pos = 0, ms, me;
    for (const tk_added *x; (x = next_added(t, 1, norm->p, norm->len, pos, &ms, &me)); pos = me)
        if (encode_pieces(t, norm->p + pos, ms - pos, first && pos == 0, e) || tk_ids_push(&e->ids, x->id))
            return -1;
    return encode_pieces(t, norm->p + pos, norm->len - pos, first && pos == 0, e);
}

int kvq_tokenize(const kvq_tokenizer *tok, const char *text, size_t len, int add_bos, int32_t *ids, int max_ids) {
    if (!tok || (!text && len) || max_ids < 0 || (!ids && max_ids > 0)) {
        kvq_fail(KVQ_ERR_ARG, "kvq_tokenize: bad arguments");
        return -1;
    }
    tk_enc e = {0};
    int rc = 0;
    if (add_bos && tok->bos >= 0 && tk_ids_push(&e.ids, tok->bos)) rc = -1;
    size_t pos = 0, ms, me;
    for (const tk_added *x; !rc && (x = next_added(tok, 0, text, len, pos, &ms, &me)); pos = me)
        if (encode_segment(tok, text + pos, ms - pos, pos == 0, &e) || tk_ids_push(&e.ids, x->id)) rc = -1;
    if (!rc && encode_segment(tok, text + pos, len - pos, pos == 0, &e)) rc = -1;
    if (!rc && e.ids.n > INT_MAX) {
        kvq_fail(KVQ_ERR_ARG, "kvq_tokenize: text too long");
        rc = -1;
    }
    if (!rc) {
        size_t ncopy = e.ids.n < (size_t)max_ids ? e.ids.n : (size_t)max_ids;
        if (ncopy) memcpy(ids, e.ids.v, ncopy * sizeof *ids);
        rc = (int)e.ids.n;
    }
    tk_pre_scratch_free(&e.pre);
    tk_bpe_scratch_free(&e.bpe);
    free(e.ids.v);
    return rc;
}
