/* Private tokenizer internals shared by src/tokenizer*.c.
 *
 * The tokenizer follows HF `tokenizers` (tokenizer.json): added tokens are cut
 * out of the raw text, the rest is normalized, pre-tokenized into pieces and
 * each piece BPE-encoded. Decoding runs the decoder chain as a stream of text
 * items so that the streaming and the one-shot decoders share one code path. */
#ifndef KVQ_TOKENIZER_H
#define KVQ_TOKENIZER_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvq.h"

/* ---- growable buffers (tokenizer_text.c) ---------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} tk_buf;

/* Allocation failures record "out of memory" (tk_nomem) so every -1 carries a message. */
int tk_nomem(void); /* sets the message, returns -1 */
int tk_buf_reserve(tk_buf *b, size_t extra); /* 0 ok, -1 out of memory */
int tk_buf_put(tk_buf *b, const void *s, size_t n);
void tk_buf_free(tk_buf *b);

/* Length of the UTF-8 sequence starting at s[0] (1 for invalid bytes), never past n. */
size_t tk_utf8_len(const char *s, size_t n);
/* Decodes one code point (-1 when s does not start with a valid sequence); *adv = bytes used. */
int tk_byte_token(const char *s, size_t n); /* "<0xNN>" -> NN, else -1 (ByteFallback) */
int32_t tk_utf8_decode(const char *s, size_t n, size_t *adv);
int tk_utf8_encode(int32_t cp, char *out); /* bytes written (1..4) */
int tk_is_space(int32_t cp);                /* Unicode White_Space, like Rust char::is_whitespace */

/* Appends bytes to out decoding them as UTF-8 with every maximal invalid subpart
 * replaced by U+FFFD (Python errors="replace", Rust from_utf8_lossy). Unless final,
 * a trailing incomplete but so-far valid sequence is left unconsumed. Returns the
 * number of input bytes consumed, or -1 when out of memory. */
long tk_utf8_lossy(const uint8_t *in, size_t n, int final, tk_buf *out);

/* GPT-2 byte-level alphabet: each byte <-> one printable code point (slow; fill tables). */
int32_t tk_byte_to_cp(uint8_t b);

/* ---- pattern matching (tokenizer_text.c) ------------------------------------ */

/* Compiles an Oniguruma-style tokenizer.json regex with PCRE2 (UTF, UCP, JIT).
 * Returns NULL and records the error (naming file) on failure. */
pcre2_code *tk_regex_compile(const char *pat, size_t len, const char *file);

typedef struct {
    size_t *se; /* start, end pairs */
    size_t n, cap;
} tk_spans;

/* Non-empty, non-overlapping matches of a regex (re) or a literal (lit, litlen)
 * in s[0..n). md is scratch match data. Returns 0, or -1 on error (message set). */
int tk_find_all(const pcre2_code *re, const char *lit, size_t litlen, const char *s, size_t n,
                pcre2_match_data *md, tk_spans *out);

/* ---- pipeline steps (normalizers, pre-tokenizers, decoders) ------------------ */

enum {
    /* normalizers */
    TK_N_NFC, TK_N_NFD, TK_N_NFKC, TK_N_NFKD, TK_N_LOWER, TK_N_STRIP, TK_N_REPLACE,
    TK_N_PREPEND, TK_N_STRIP_ACCENTS,
    /* pre-tokenizers */
    TK_P_SPLIT, TK_P_BYTELEVEL, TK_P_METASPACE,
    /* decoders */
    TK_D_REPLACE, TK_D_BYTEFALLBACK, TK_D_FUSE, TK_D_STRIP, TK_D_BYTELEVEL, TK_D_METASPACE,
    TK_D_JOIN, /* no decoder: tokens joined with " " */
};

/* Split behaviors, as HF SplitDelimiterBehavior. */
enum { TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_MERGED_PREV, TK_SPLIT_MERGED_NEXT, TK_SPLIT_CONTIGUOUS };

/* Metaspace prepend schemes. */
enum { TK_PREPEND_NEVER, TK_PREPEND_FIRST, TK_PREPEND_ALWAYS };

typedef struct {
    int type;
    char *str;        /* literal pattern / prepend / replacement char */
    size_t str_len;
    char *content;    /* replacement text (Replace) */
    size_t content_len;
    pcre2_code *re;   /* regex pattern (Split, Replace, ByteLevel use_regex) */
    int behavior;     /* Split */
    int invert;       /* Split */
    int flag_a;       /* Strip: left / start count; ByteLevel: add_prefix_space; Metaspace: prepend scheme */
    int flag_b;       /* Strip: right / stop count; Metaspace: split */
    int32_t ch;       /* Strip decoder content / Metaspace replacement code point */
} tk_step;

typedef struct {
    tk_step *s;
    int n, cap;
} tk_steps;

void tk_steps_free(tk_steps *st);
/* Appends a zeroed step of the given type; NULL when out of memory. */
tk_step *tk_steps_add(tk_steps *st, int type);

/* Parsers append to st; j may be NULL/null (nothing added). Errors name file. */
kvq_status tk_parse_normalizer(const cJSON *j, const char *file, tk_steps *st);
kvq_status tk_parse_pretokenizer(const cJSON *j, const char *file, tk_steps *st);
kvq_status tk_parse_decoder(const cJSON *j, const char *file, tk_steps *st);

/* ---- the tokenizer ------------------------------------------------------------ */

enum { TK_ATTR_SPECIAL = 1, TK_ATTR_ADDED = 2, TK_ATTR_EOG = 4 };

typedef struct {
    uint32_t off, len; /* content in the arena (normalized content for normalized tokens) */
    int32_t id;
    int16_t first;     /* first byte of the content, -1 if empty */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tk_added;

/* A table another module builds from a tokenizer (the JSON constraint's, src/grammar/json_vocab.c)
 * and keeps with it: freed by kvq_tokenizer_free through its own function, so the tokenizer
 * needs nothing of that module. */
typedef struct tk_cache {
    void (*free)(struct tk_cache *c);
} tk_cache;

struct kvq_tokenizer {
    char file[1024]; /* tokenizer.json path, for messages */
    _Atomic(tk_cache *) json_vocab; /* built on first use (json_vocab.c); NULL until then */
    int32_t n_vocab;

    tk_buf arena;           /* all token strings */
    uint32_t *model_off;    /* model piece per id (model_len UINT32_MAX: none) */
    uint32_t *model_len;
    uint32_t *text_off;     /* decode text per id: added content or model piece */
    uint32_t *text_len;
    uint8_t *attr;          /* TK_ATTR_* per id */

    /* model-vocab hash: piece -> id (slot holds id + 1, 0 empty) */
    uint32_t *vocab_slot;
    uint32_t vocab_mask;

    /* merges: (left id, right id) -> rank, merged id */
    uint64_t *merge_key;    /* UINT64_MAX: empty */
    uint32_t *merge_rank;
    int32_t *merge_new;
    uint32_t merge_mask;
    size_t n_merges;

    int32_t unk_id;
    int byte_fallback, fuse_unk, ignore_merges;
    char *cont_prefix, *eow_suffix; /* continuing_subword_prefix, end_of_word_suffix */
    int32_t byte_id[256];           /* <0xNN> pieces, -1 if absent */
    /* bit per code point: part of some multi-character piece (tokenizer_bpe.c cuts long
     * words at the other characters); NULL when cutting is not safe */
    uint8_t *joinable;

    tk_added *added;        /* sorted: normalized flag, first byte, longer first */
    int n_added;
    int added_first[2][257]; /* [normalized][byte] -> index range start (byte+1: end) */

    tk_steps norm, pretok, dec;
    int32_t byte_cp[256];  /* byte-level alphabet, both directions */
    int16_t cp_byte[324];  /* -1: not in the alphabet */

    int32_t bos;
};

/* tokenizer_vocab.c: model section of tokenizer.json. */
kvq_status tk_load_model(kvq_tokenizer *t, const cJSON *model, const cJSON *added);
/* Normalizes normalized added tokens and builds the first-byte index (after the normalizer is parsed). */
kvq_status tk_index_added(kvq_tokenizer *t);
int32_t tk_vocab_find(const kvq_tokenizer *t, const char *s, size_t n);
/* Looks up a merge; returns 1 and fills rank/new id when (a, b) merges. */
int tk_merge_find(const kvq_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id);
/* Text an id decodes from (added content or model piece); NULL when the id is unknown. */
const char *tk_id_text(const kvq_tokenizer *t, int32_t id, size_t *len);

/* tokenizer_bpe.c: encodes one pre-tokenized piece, appending ids. */
typedef struct {
    struct tk_sym *sym;
    size_t sym_cap;
    struct tk_pair *heap;
    size_t heap_n, heap_cap;
    tk_buf tmp;
} tk_bpe_scratch;

typedef struct {
    int32_t *v;
    size_t n, cap;
} tk_ids;

int tk_ids_push(tk_ids *ids, int32_t id);
int tk_bpe_encode(const kvq_tokenizer *t, const char *s, size_t n, tk_bpe_scratch *sc, tk_ids *out);
void tk_bpe_scratch_free(tk_bpe_scratch *sc);

/* tokenizer_pretok.c: runs the normalizer / pre-tokenizer steps. */
typedef struct {
    size_t off, len;
    int first; /* starts at offset 0 of the input text (Metaspace prepend_scheme "first") */
} tk_piece;

typedef struct {
    tk_buf text;
    tk_piece *p;
    size_t n, cap;
} tk_pieces;

int tk_pieces_add(tk_pieces *ps, const char *s, size_t n, int first);
void tk_pieces_free(tk_pieces *ps);

typedef struct {
    size_t a, b;
    int match;
} tk_range;

typedef struct {
    tk_buf a, b;   /* normalizer ping-pong */
    tk_buf t1, t2; /* pre-tokenizer temporaries */
    tk_pieces pa, pb;
    tk_spans spans;
    tk_range *rg; /* split ranges */
    size_t rg_cap;
    pcre2_match_data *md;
} tk_pre_scratch;

/* Normalizes s into out (uses sc->a/b as scratch; out may be one of them). 0 or -1. */
int tk_normalize(const kvq_tokenizer *t, const char *s, size_t n, tk_pre_scratch *sc, tk_buf **out);
/* Pre-tokenizes one normalized segment; result in *res (points into sc). 0 or -1. */
int tk_pretokenize(const kvq_tokenizer *t, const char *s, size_t n, int first, tk_pre_scratch *sc,
                   tk_pieces **res);
void tk_pre_scratch_free(tk_pre_scratch *sc);

#endif
