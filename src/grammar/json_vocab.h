/* A tokenizer's vocabulary as the JSON constraint (json_mask.c) reads it: each token's bytes
 * as the decoder writes them in the middle of a text, and the ids sorted by those bytes so that
 * tokens sharing a prefix share the matcher's work. Built once per tokenizer, on first use, and
 * shared by every constraint on it (read-only once built). */
#ifndef KVQ_GRAMMAR_JSON_VOCAB_H
#define KVQ_GRAMMAR_JSON_VOCAB_H

#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct {
    tk_cache base;       /* first: the tokenizer frees the table with itself */
    int n_vocab;
    uint8_t *bytes;      /* token bytes, all ids */
    uint32_t *off, *len; /* len 0: never generated (special, or empty) */
    uint8_t *eog;
    int32_t *order;  /* ids with bytes, sorted by them */
    uint16_t *lcp;   /* bytes order[i] shares with order[i-1] */
    int n_order, max_len;
} js_vocab;

/* The tokenizer's table, built on the first call (thread-safe); NULL when out of memory. */
const js_vocab *js_vocab_get(const kvq_tokenizer *t);
/* A table of one's own (not cached), for measuring the build; free with js_vocab_free. */
js_vocab *js_vocab_build(const kvq_tokenizer *t);
void js_vocab_free(tk_cache *c);

#endif
