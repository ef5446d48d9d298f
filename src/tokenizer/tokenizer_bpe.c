/* BPE on one pre-tokenized piece, as HF `tokenizers` BPE::merge_word does it:
 * characters (or byte-fallback bytes, or unk) become a linked list of symbols,
 * and a min-heap of candidate pairs (rank, then leftmost position) drives the
 * merges. Stale heap entries are checked against the current list and dropped,
 * so each merge costs O(log n) and long inputs (whole SentencePiece lines with
 * no pre-tokenizer) stay fast. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

struct tk_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint32_t len;       /* bytes covered; 0 once merged into its left neighbour */
};

/* Heap entries are rank << 32 | left position, so one integer compare orders them
 * by rank and then leftmost. The merged id is looked up again when popped: a pair
 * of pieces has one rank, and an entry whose pair changed since is stale. */
struct tk_pair {
    uint64_t key;
};

int tk_ids_push(tk_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 256;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return tk_nomem();
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

void tk_bpe_scratch_free(tk_bpe_scratch *sc) {
    free(sc->sym);
    free(sc->heap);
    tk_buf_free(&sc->tmp);
    memset(sc, 0, sizeof *sc);
}

static int pair_less(const struct tk_pair *a, const struct tk_pair *b) { return a->key < b->key; }

static void heap_push(tk_bpe_scratch *sc, struct tk_pair p) {
    size_t i = sc->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_less(&p, &sc->heap[up])) break;
        sc->heap[i] = sc->heap[up];
        i = up;
    }
    sc->heap[i] = p;
}

/* Moves p down from slot i to its place among the first n entries. */
static void sift_down(struct tk_pair *h, size_t n, size_t i, struct tk_pair p) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_less(&h[c + 1], &h[c])) c++;
        if (!pair_less(&h[c], &p)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = p;
}

static struct tk_pair heap_pop(tk_bpe_scratch *sc) {
    struct tk_pair top = sc->heap[0];
    sc->heap_n--;
    if (sc->heap_n) sift_down(sc->heap, sc->heap_n, 0, sc->heap[sc->heap_n]);
    return top;
}

static void push_pair(const kvq_tokenizer *t, tk_bpe_scratch *sc, int32_t left) {
    int32_t right = sc->sym[left].next;
    uint32_t rank;
    int32_t nid;
    if (right >= 0 && tk_merge_find(t, sc->sym[left].id, sc->sym[right].id, &rank, &nid))
        heap_push(sc, (struct tk_pair){(uint64_t)rank << 32 | (uint32_t)left});
}

/* Vocab id of one character, with the continuing-subword prefix / end-of-word suffix. */
static int32_t char_id(const kvq_tokenizer *t, const char *c, size_t cl, int first, int last, tk_buf *tmp) {
    if ((first || !t->cont_prefix) && (!last || !t->eow_suffix)) return tk_vocab_find(t, c, cl);
    tmp->len = 0;
    if ((!first && t->cont_prefix && tk_buf_put(tmp, t->cont_prefix, strlen(t->cont_prefix))) ||
        tk_buf_put(tmp, c, cl) || (last && t->eow_suffix && tk_buf_put(tmp, t->eow_suffix, strlen(t->eow_suffix))))
        return -2;
    return tk_vocab_find(t, tmp->p, tmp->len);
}

static int grow(tk_bpe_scratch *sc, size_t n) {
    if (n > sc->sym_cap) {
        struct tk_sym *s = realloc(sc->sym, n * sizeof *s);
        if (!s) return tk_nomem();
        sc->sym = s;
        sc->sym_cap = n;
    }
    /* every merge pushes at most two pairs: 3n bounds the heap */
    if (3 * n > sc->heap_cap) {
        struct tk_pair *h = realloc(sc->heap, 3 * n * sizeof *h);
        if (!h) return tk_nomem();
        sc->heap = h;
        sc->heap_cap = 3 * n;
    }
    return 0;
}

/* The merge loop proper, on one word (or one independent chunk of it). */
static int merge_word(const kvq_tokenizer *t, const char *s, size_t n, tk_bpe_scratch *sc, tk_ids *out) {
    if (!n) return 0;
    if (n > INT32_MAX) { /* positions are 32-bit in the heap keys */
        kvq_fail(KVQ_ERR_ARG, "%s: a single word of %zu bytes is too long to encode", t->file, n);
        return -1;
    }
    if (grow(sc, n)) goto nomem;

    size_t nsym = 0;
    int last_unk = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = tk_utf8_len(s + i, n - i);
        int32_t id = char_id(t, s + i, cl, i == 0, i + cl == n, &sc->tmp);
        if (id == -2) goto nomem;
        if (id < 0 && t->byte_fallback) {
            size_t k = 0;
            while (k < cl && t->byte_id[(uint8_t)s[i + k]] >= 0) k++;
            if (k == cl) {
                for (k = 0; k < cl; k++) sc->sym[nsym++] = (struct tk_sym){t->byte_id[(uint8_t)s[i + k]], 0, 0, 1};
                last_unk = 0;
                i += cl;
                continue;
            }
        }
        if (id < 0) {
            if (t->unk_id < 0) {
                kvq_fail(KVQ_ERR_ARG, "%s: text has a character the vocabulary cannot encode and there is no unk token",
                         t->file);
                return -1;
            }
            if (t->fuse_unk && last_unk) {
                sc->sym[nsym - 1].len += (uint32_t)cl;
                i += cl;
                continue;
            }
            id = t->unk_id;
            last_unk = 1;
        } else {
            last_unk = 0;
        }
        sc->sym[nsym++] = (struct tk_sym){id, 0, 0, (uint32_t)cl};
        i += cl;
    }
    for (size_t i = 0; i < nsym; i++) {
        sc->sym[i].prev = (int32_t)i - 1;
        sc->sym[i].next = i + 1 < nsym ? (int32_t)i + 1 : -1;
    }

    /* all initial pairs, then heapify in O(n) */
    sc->heap_n = 0;
    for (size_t i = 0; i + 1 < nsym; i++) {
        uint32_t rank;
        int32_t nid;
        if (tk_merge_find(t, sc->sym[i].id, sc->sym[i + 1].id, &rank, &nid))
            sc->heap[sc->heap_n++] = (struct tk_pair){(uint64_t)rank << 32 | (uint32_t)i};
    }
    for (size_t i = sc->heap_n / 2; i-- > 0;) sift_down(sc->heap, sc->heap_n, i, sc->heap[i]);
    while (sc->heap_n) {
        struct tk_pair top = heap_pop(sc);
        int32_t pos = (int32_t)(uint32_t)top.key;
        struct tk_sym *l = &sc->sym[pos];
        if (!l->len || l->next < 0) continue;
        struct tk_sym *r = &sc->sym[l->next];
        uint32_t rank;
        int32_t nid;
        /* HF applies an entry when the current pair still merges into the same piece; as
         * pieces are distinct strings, that is the same as the rank still matching */
        if (!tk_merge_find(t, l->id, r->id, &rank, &nid) || rank != (uint32_t)(top.key >> 32)) continue;
        l->id = nid;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sc->sym[r->next].prev = pos;
        if (l->prev >= 0) push_pair(t, sc, l->prev);
        push_pair(t, sc, pos);
    }
    for (int32_t i = 0; i >= 0; i = sc->sym[i].next)
        if (tk_ids_push(out, sc->sym[i].id)) goto nomem;
    return 0;
nomem:
    return -1; /* message already set */
}

/* A character no multi-character piece contains, and that encodes without unk
 * (so nothing fuses with it): no merge can cross its edges, which makes the text
 * on either side independent. Cutting long words there keeps the heap small and
 * local; SentencePiece-style tokenizers otherwise see a whole text as one word. */
static int is_breaker(const kvq_tokenizer *t, const char *c, size_t cl, int32_t cp) {
    if (cp < 0 || (t->joinable[cp >> 3] >> (cp & 7) & 1)) return 0;
    if (tk_vocab_find(t, c, cl) >= 0) return 1;
    if (!t->byte_fallback) return 0;
    for (size_t k = 0; k < cl; k++)
        if (t->byte_id[(uint8_t)c[k]] < 0) return 0;
    return 1;
}

int tk_bpe_encode(const kvq_tokenizer *t, const char *s, size_t n, tk_bpe_scratch *sc, tk_ids *out) {
    if (!n) return 0;
    if (t->ignore_merges) {
        int32_t id = tk_vocab_find(t, s, n);
        if (id >= 0) return tk_ids_push(out, id);
    }
    if (!t->joinable || n < 256) return merge_word(t, s, n, sc, out);
    size_t start = 0, adv;
    for (size_t i = 0; i < n; i += adv) {
        int32_t cp = tk_utf8_decode(s + i, n - i, &adv);
        if (!is_breaker(t, s + i, adv, cp)) continue;
        if (merge_word(t, s + start, i - start, sc, out) || merge_word(t, s + i, adv, sc, out)) return -1;
        start = i + adv;
    }
    return merge_word(t, s + start, n - start, sc, out);
}
