/* GBNF grammars (llama.cpp's format) as a constraint: gbnf_parse.c compiles the text into
 * rules of flat element sequences; gbnf_match.c follows the text generated so far as a set of
 * stacks of positions in them, a code point at a time, UTF-8 decoded from bytes. */
#ifndef KVQ_GRAMMAR_GBNF_H
#define KVQ_GRAMMAR_GBNF_H

#include <stddef.h>
#include <stdint.h>

enum { GB_END, GB_CHAR, GB_RULE };

typedef struct {
    uint8_t kind, neg; /* GB_CHAR: neg, a negated class ([^...], or "." with no ranges) */
    uint16_t n_ranges;
    uint32_t arg; /* GB_CHAR: first range in rg; GB_RULE: the rule */
} gb_elem;

typedef struct {
    uint32_t lo, hi;
} gb_range;

typedef struct {
    char *name;
    int *alts; /* each alternative's first element; an alternative ends at a GB_END */
    int n_alts, cap_alts;
    int defined, line, col; /* where it was first named (for errors) */
} gb_rule;

typedef struct gb_grammar {
    gb_elem *el;
    int n_el, cap_el;
    gb_range *rg;
    int n_rg, cap_rg;
    gb_rule *rules;
    int n_rules, cap_rules, root;
} gb_grammar;

#define GB_MAX_STACKS 32 /* paths followed at once (more are dropped: narrower, never wider) */
#define GB_MAX_DEPTH 64  /* positions in one stack (nesting of rules being written) */
#define GB_POOL 1024     /* positions in all stacks */

typedef struct {
    const gb_grammar *g;
    uint16_t n, used; /* stacks; positions in the pool */
    uint8_t need;     /* UTF-8 continuation bytes still due */
    uint8_t clen;     /* bytes of the character being read */
    uint8_t dead;
    uint32_t cp;      /* the code point's bits so far */
    uint16_t off[GB_MAX_STACKS + 1];
    uint16_t pool[GB_POOL]; /* stack i: pool[off[i]..off[i+1]), its top last */
} gb_state;

/* NULL with "rule 'r', line L column C: why" in err when the grammar does not compile. */
gb_grammar *gb_compile(const char *text, char *err, size_t errsz);
void gb_free(gb_grammar *g);

#endif
