/* What the vocabulary mask (json_mask.c) needs of a byte-level matcher: JSON under a schema
 * (json_set.c) or a GBNF grammar (gbnf_match.c). A state is a flat block of `size` bytes;
 * copies take only the part in use. */
#ifndef KVQ_GRAMMAR_MATCHER_H
#define KVQ_GRAMMAR_MATCHER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    size_t size;
    void (*start)(void *st, const void *g);
    void (*copy)(void *dst, const void *src);
    void (*step)(const void *from, uint8_t b, void *to); /* from != to; to dead when refused */
    int (*alive)(const void *st);
    int (*can_end)(const void *st);   /* the text so far is complete */
    int (*is_done)(const void *st);   /* complete, and nothing may follow */
} gm_ops;

extern const gm_ops JS_OPS; /* json_set.c: js_set over a js_schema */
extern const gm_ops GB_OPS; /* gbnf_match.c: gb_state over a gb_grammar */

#endif
