/* Structured output: a JSON schema compiled into a graph of nodes (json_schema.c) and an
 * incremental byte matcher over it (json_match.c). json_mask.c puts the two to work on a
 * tokenizer's vocabulary. */
#ifndef KVQ_GRAMMAR_JSON_SCHEMA_H
#define KVQ_GRAMMAR_JSON_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

/* Node kinds. JS_ANY is any JSON value (json_object mode's values, schemas without "type"). */
enum { JS_ANY, JS_OBJECT, JS_ARRAY, JS_STRING, JS_NUMBER, JS_INTEGER, JS_BOOLEAN, JS_NULL, JS_LITERAL, JS_ANYOF };

#define JS_MAX_PROPS 64   /* properties of one object (a bit mask tracks which were written) */
#define JS_MAX_LITS 64    /* enum values */
#define JS_MAX_DEPTH 32   /* nesting of the generated value (frames of the matcher) */
#define JS_MAX_WS 16      /* whitespace bytes between two tokens of JSON (one newline among them):
                            bounded, so the model cannot loop on blanks */
#define JS_MAX_NUM 24     /* characters of one number */
#define JS_MAX_PAT 256    /* decoded bytes of a string checked by a pattern or format */
#define JS_MAX_SET 8      /* anyOf alternatives followed side by side */
#define JS_NUM_DIGITS 15  /* digits of a bounded number's integer part, and of its fraction:
                            within a double's exact range, so the end check is exact */

typedef struct js_node js_node;
struct js_node {
    int kind;
    /* JS_OBJECT: listed properties (keys as their JSON text, quotes included), required mask;
     * free_keys: no properties listed, any key with values of `extra` (any value when NULL) */
    int n_props, free_keys;
    char **keys;
    size_t *key_len;
    js_node **props;
    uint64_t required;
    js_node *extra;
    /* JS_ARRAY */
    js_node *items; /* NULL: any value */
    long min_items, max_items; /* max -1: none */
    /* JS_STRING */
    long min_len, max_len; /* characters; max -1: none */
    void *re[2];           /* pcre2 codes: pattern and format (NULL: none) */
    void *md;              /* their match data */
    /* JS_NUMBER / JS_INTEGER: bounds (json_number.c). bounded: some keyword holds, so the
     * number is written without exponent or "-0" and its digits are tracked */
    int bounded, has_lo, has_hi, lo_excl, hi_excl;
    double lo, hi;         /* numbers */
    int64_t ilo, ihi;      /* integers: inclusive bounds, exact */
    int64_t imult;         /* integer multipleOf (0: none) */
    double mult;           /* multipleOf of a number that is not an integer (0: none) */
    int mult_digits;       /* its decimals: fraction digits past them are refused (-1: any) */
    /* JS_LITERAL (enum / const / true / false / null): compact JSON texts */
    int n_lits;
    char **lits;
    size_t *lit_len;
    /* JS_ANYOF: alternatives, told apart by their value's first byte */
    int n_alts;
    js_node **alts;
    js_node *ref_target; /* $ref being resolved (compile time only) */
};

typedef struct js_schema {
    js_node *root;
    int pretty;    /* layout: 0 compact (no blank outside strings), 1 blanks allowed between tokens */
    char ignored[256]; /* keywords a non-strict schema holds that are not enforced, comma-separated */
    js_node **all; /* every node, for freeing (refs may make cycles) */
    int n_all, cap_all;
} js_schema;

/* Compiles a schema (JSON text, len bytes); NULL or "" compiles json_object mode (any
 * object). strict: keywords outside the subset are errors (else ignored). On failure
 * returns NULL with a one-line reason in err. */
js_schema *js_compile(const char *schema, size_t len, char *err, size_t errsz, int strict);
void js_free(js_schema *s);

/* One open value of the matcher. */
typedef struct {
    const js_node *n;
    uint8_t kind, phase, ws;
    uint8_t esc;     /* string: bytes of an escape still due (\uXXXX: 4); UTF-8 continuation bytes */
    uint16_t pos;    /* literal / key byte position, number length */
    int16_t prop;    /* object: the property being written, -1 free key */
    uint32_t count;  /* array items, string characters */
    uint64_t seen;   /* object: properties written */
    uint64_t alive;  /* literal / key: alternatives still matching */
} js_frame;

/* One path through the schema. The decoded text of a pattern-checked string lives after the
 * frames, so a copy takes the frames in use and the slen bytes only. */
typedef struct {
    const js_schema *s;
    int depth;    /* frames in use; 0 with done set: the value is complete */
    int done, failed;
    uint8_t ws;   /* leading whitespace at the top */
    uint8_t pick, n_picks; /* anyOf: the alternative to take at this byte; how many could */
    uint16_t slen;
    js_frame f[JS_MAX_DEPTH];
    uint8_t sbuf[JS_MAX_PAT + 4];
} js_state;

/* anyOf alternatives that begin alike: every path still alive, side by side (json_set.c). */
typedef struct {
    int n;
    js_state s[JS_MAX_SET];
} js_set;

void js_start(js_state *st, const js_schema *s);
/* Copies the frames in use only (states are copied once per byte when masking). */
void js_copy(js_state *dst, const js_state *src);
/* Feeds one byte: 0 accepted, -1 rejected (the state is then failed for good). */
int js_feed(js_state *st, uint8_t b);
/* The value read so far is a complete value (end of text is allowed here). */
int js_can_end(const js_state *st);
/* Complete, and no byte may follow. */
int js_is_done(const js_state *st);

/* json_set.c: the same over a set of paths. js_set_step writes into `to` what `from` becomes
 * after byte b (to->n 0: refused); from and to must differ. */
void js_set_start(js_set *set, const js_schema *s);
void js_set_copy(js_set *dst, const js_set *src);
void js_set_step(const js_set *from, uint8_t b, js_set *to);
int js_set_can_end(const js_set *set);
int js_set_is_done(const js_set *set);

/* json_number.c: a number's digits so far (frame of kind number) can still become a value in
 * its node's bounds; and the complete number is one. */
int js_num_feasible(const js_frame *f);
int js_num_final_ok(const js_frame *f);
/* json_number.c: the bounds keywords of j into n (kind set); -1 with a reason in err. */
struct cJSON;
int js_num_compile(js_node *n, const struct cJSON *j, char *err, size_t errsz);

/* json_pattern.c: pattern / format of j into n; the decoded text can still match (partial),
 * or matches as a whole. */
int js_pat_compile(js_node *n, const struct cJSON *j, int strict, char *err, size_t errsz, char *ignored,
                   size_t ign_sz);
int js_pat_partial(const js_node *n, const uint8_t *s, size_t len);
int js_pat_full(const js_node *n, const uint8_t *s, size_t len);
void js_pat_free(js_node *n);

#endif
