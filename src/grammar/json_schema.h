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

typedef struct {
    const js_schema *s;
    int depth;    /* frames in use; 0 with done set: the value is complete */
    int done, failed;
    uint8_t ws;   /* leading whitespace at the top */
    js_frame f[JS_MAX_DEPTH];
} js_state;

void js_start(js_state *st, const js_schema *s);
/* Copies the frames in use only (states are copied once per byte when masking). */
void js_copy(js_state *dst, const js_state *src);
/* Feeds one byte: 0 accepted, -1 rejected (the state is then failed for good). */
int js_feed(js_state *st, uint8_t b);
/* The value read so far is a complete value (end of text is allowed here). */
int js_can_end(const js_state *st);
/* Complete, and no byte may follow. */
int js_is_done(const js_state *st);

#endif
