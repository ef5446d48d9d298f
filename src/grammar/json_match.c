/* Incremental byte matcher for JSON under a compiled schema: a stack of open values (frames),
 * one byte at a time. A number or an enum value ends only when a byte that cannot extend it
 * comes; that byte is then handed to the enclosing value. The compact layout allows no blank
 * outside strings; the pretty one up to JS_MAX_WS bytes per gap; none after the complete value.
 * Where anyOf alternatives could all begin with a byte, the path takes the one st->pick names
 * and says in st->n_picks how many there were (json_set.c follows each of them). */
#include <string.h>

#include "grammar/json_schema.h"

enum { F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
/* object phases */
enum { O_START, O_KEY_NEXT, O_KEY, O_KEY_FREE, O_COLON, O_VALUE, O_AFTER };
/* array phases */
enum { A_START, A_NEXT, A_AFTER };
/* number phases; the *_OK ones may end the number */
enum { N_SIGN, N_ZERO_OK, N_INT_OK, N_DOT, N_FRAC_OK, N_E, N_ESIGN, N_EXP_OK };

static char *const lit_bool_v[] = {"true", "false"};
static const size_t lit_bool_l[] = {4, 5};
static char *const lit_null_v[] = {"null"};
static const size_t lit_null_l[] = {4};
static const js_node node_bool = {.kind = JS_LITERAL, .n_lits = 2, .lits = (char **)lit_bool_v, .lit_len = (size_t *)lit_bool_l};
static const js_node node_null = {.kind = JS_LITERAL, .n_lits = 1, .lits = (char **)lit_null_v, .lit_len = (size_t *)lit_null_l};
static const js_node node_any_obj = {.kind = JS_OBJECT, .free_keys = 1, .max_items = -1, .max_len = -1};
static const js_node node_any_arr = {.kind = JS_ARRAY, .max_items = -1, .max_len = -1};
static const js_node node_any_str = {.kind = JS_STRING, .max_items = -1, .max_len = -1};

void js_start(js_state *st, const js_schema *s) {
    memset(st, 0, offsetof(js_state, f)); /* every field a copy takes */
    st->s = s;
}

void js_copy(js_state *dst, const js_state *src) {
    memcpy(dst, src, offsetof(js_state, f) + sizeof src->f[0] * (size_t)src->depth);
    if (src->slen) memcpy(dst->sbuf, src->sbuf, src->slen);
}

static int is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }

/* One more whitespace byte in the current gap: at most JS_MAX_WS of them, one newline
 * (bit 7 of the count marks it), as a pretty-printer writes; -1 past that. */
static int take_ws(const js_state *st, uint8_t *count, uint8_t b) {
    if (!st->s->pretty) return -1;
    if (b == '\n') {
        if (*count & 0x80) return -1;
        *count |= 0x80;
    }
    return (++*count & 0x7F) > JS_MAX_WS ? -1 : 0;
}

static int lit_complete(const js_frame *f) {
    for (int i = 0; i < f->n->n_lits; i++)
        if ((f->alive >> i & 1) && f->n->lit_len[i] == f->pos) return 1;
    return 0;
}

static int lit_all_complete(const js_frame *f) {
    for (int i = 0; i < f->n->n_lits; i++)
        if ((f->alive >> i & 1) && f->n->lit_len[i] != f->pos) return 0;
    return 1;
}

/* The top value is complete: pop it and move its parent on. */
static void value_done(js_state *st) {
    st->depth--;
    if (!st->depth) {
        st->done = 1;
        return;
    }
    js_frame *p = &st->f[st->depth - 1];
    p->ws = 0;
    if (p->kind == F_OBJ) {
        p->phase = p->phase == O_KEY_FREE ? O_COLON : O_AFTER;
    } else if (p->kind == F_ARR) {
        p->count++;
        p->phase = A_AFTER;
    }
}

static js_frame *push(js_state *st, const js_node *n, int kind) {
    if (st->depth >= JS_MAX_DEPTH) return NULL;
    js_frame *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->n = n;
    f->kind = (uint8_t)kind;
    f->prop = -1;
    return f;
}

/* Whether a value of n may begin with byte b. */
static int can_start(const js_node *n, uint8_t b, int depth) {
    if (!n || depth > 64) return !n;
    switch (n->kind) {
    case JS_OBJECT: return b == '{';
    case JS_ARRAY: return b == '[';
    case JS_STRING: return b == '"';
    case JS_NUMBER: case JS_INTEGER: return b == '-' || (b >= '0' && b <= '9');
    case JS_BOOLEAN: return b == 't' || b == 'f';
    case JS_NULL: return b == 'n';
    case JS_LITERAL:
        for (int i = 0; i < n->n_lits; i++)
            if ((uint8_t)n->lits[i][0] == b) return 1;
        return 0;
    case JS_ANYOF:
        for (int i = 0; i < n->n_alts; i++)
            if (can_start(n->alts[i], b, depth + 1)) return 1;
        return 0;
    }
    return 1; /* any value: the byte decides below */
}

/* The anyOf leaves (alternatives that are not anyOf) a value starting with b can take, in
 * order; returns how many (at most JS_MAX_SET), out[] holding them. */
static int leaves(const js_node *n, uint8_t b, const js_node **out, int k, int depth) {
    if (depth > 64 || k >= JS_MAX_SET) return k;
    if (!n || n->kind != JS_ANYOF) {
        if (can_start(n, b, 0)) out[k++] = n;
        return k;
    }
    for (int i = 0; i < n->n_alts; i++) k = leaves(n->alts[i], b, out, k, depth + 1);
    return k;
}

/* The first byte b of a value of node n (not whitespace). */
static int start_value(js_state *st, const js_node *n, uint8_t b) {
    if (n && n->kind == JS_ANYOF) { /* the alternative b begins: the path's pick among them */
        const js_node *alts[JS_MAX_SET];
        int k = leaves(n, b, alts, 0, 0);
        st->n_picks = (uint8_t)k;
        if (st->pick >= k) return -1;
        n = alts[st->pick];
    }
    if (!n || n->kind == JS_ANY) {
        n = b == '{' ? &node_any_obj : b == '[' ? &node_any_arr : b == '"' ? &node_any_str
          : (b == 't' || b == 'f') ? &node_bool : b == 'n' ? &node_null : NULL;
        if (!n) {
            if (b != '-' && (b < '0' || b > '9')) return -1;
            static const js_node num = {.kind = JS_NUMBER};
            n = &num;
        }
    }
    js_frame *f;
    switch (n->kind) {
    case JS_OBJECT:
        if (b != '{' || !(f = push(st, n, F_OBJ))) return -1;
        f->phase = O_START;
        return 0;
    case JS_ARRAY:
        if (b != '[' || !(f = push(st, n, F_ARR))) return -1;
        f->phase = A_START;
        return 0;
    case JS_STRING:
        return b == '"' && push(st, n, F_STR) ? 0 : -1;
    case JS_NUMBER: case JS_INTEGER:
        if ((b != '-' && (b < '0' || b > '9')) || !(f = push(st, n, F_NUM))) return -1;
        f->phase = b == '-' ? N_SIGN : b == '0' ? N_ZERO_OK : N_INT_OK;
        f->pos = 1;
        f->esc = b == '-';
        f->seen = b == '-' ? 0 : (uint64_t)(b - '0');
        return js_num_feasible(f) ? 0 : -1;
    case JS_BOOLEAN: case JS_NULL:
        n = n->kind == JS_BOOLEAN ? &node_bool : &node_null;
        /* fall through */
    case JS_LITERAL: {
        uint64_t alive = 0;
        for (int i = 0; i < n->n_lits; i++)
            if ((uint8_t)n->lits[i][0] == b) alive |= 1ull << i;
        if (!alive || !(f = push(st, n, F_LIT))) return -1;
        f->alive = alive;
        f->pos = 1;
        if (lit_all_complete(f)) value_done(st);
        return 0;
    }
    }
    return -1;
}

static int hexval(uint8_t b) {
    return b >= '0' && b <= '9' ? b - '0' : b >= 'a' && b <= 'f' ? b - 'a' + 10 : b >= 'A' && b <= 'F' ? b - 'A' + 10 : -1;
}

/* Appends code point cp (UTF-8) to the decoded text of a checked string; -1 when full. */
static int put_cp(js_state *st, uint32_t cp) {
    uint8_t u[4];
    int k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (k == 1) u[0] = (uint8_t)cp;
    else {
        for (int i = k - 1; i > 0; i--, cp >>= 6) u[i] = (uint8_t)(0x80 | (cp & 0x3F));
        u[0] = (uint8_t)((k == 2 ? 0xC0 : k == 3 ? 0xE0 : 0xF0) | cp);
    }
    if (st->slen + k > JS_MAX_PAT) return -1;
    memcpy(st->sbuf + st->slen, u, (size_t)k);
    st->slen = (uint16_t)(st->slen + k);
    return 0;
}

/* A whole character was added to a checked string: its text can still match. */
static int char_done(js_state *st, const js_node *n) {
    return js_pat_partial(n, st->sbuf, st->slen) ? 0 : -1;
}

/* Part of a character is in a checked string's text (`need` UTF-8 bytes still due): some
 * character it can become keeps the text matchable. Tries every next byte, and the deeper
 * ones at two values (a yes is always right; a no may miss a rare character, which only
 * narrows what is written). Without this a token holding a lead byte could lead nowhere. */
static int can_complete(js_state *st, const js_node *n, int need) {
    uint16_t len = st->slen;
    if (len + need > JS_MAX_PAT) return 0;
    int ok = 0;
    for (int b = 0x80; b <= 0xBF && !ok; b++) {
        st->sbuf[len] = (uint8_t)b;
        for (int k = 1; k < need; k++) st->sbuf[len + k] = 0x80;
        ok = js_pat_partial(n, st->sbuf, len + (size_t)need);
        if (!ok && need > 1) {
            for (int k = 1; k < need; k++) st->sbuf[len + k] = 0xBF;
            ok = js_pat_partial(n, st->sbuf, len + (size_t)need);
        }
    }
    return ok ? 0 : -1;
}

/* After a backslash in a checked string: some escape keeps the text matchable. */
static int escape_possible(js_state *st, const js_node *n) {
    static const char dec[] = "\"\\\b\f\n\r\t/";
    for (size_t i = 0; i < sizeof dec - 1 - !st->s->pretty; i++) {
        if (st->slen >= JS_MAX_PAT) return -1;
        st->sbuf[st->slen] = (uint8_t)dec[i];
        if (js_pat_partial(n, st->sbuf, st->slen + 1u)) return 0;
    }
    return -1;
}

/* The compact layout writes strings as JSON.stringify does: no "\/", \u only below 0x20. */
static int escape_ok(const js_state *st, uint8_t b) {
    return st->s->pretty ? strchr("\"\\/bfnrtu", b) != NULL : strchr("\"\\bfnrtu", b) != NULL;
}

/* A byte inside a string (after the opening quote). The frame: esc (escape bytes due), phase
 * (UTF-8 continuation bytes due), count (code points), alive (\u digits so far), seen (a high
 * surrogate waiting for its low half). */
static int feed_string(js_state *st, js_frame *f, uint8_t b) {
    const js_node *n = f->n;
    int checked = n && (n->re[0] || n->re[1]);
    if (f->phase) { /* UTF-8 continuation bytes due */
        if ((b & 0xC0) != 0x80) return -1;
        f->phase--;
        if (checked && (st->slen >= JS_MAX_PAT || (st->sbuf[st->slen++] = b, 0))) return -1;
        if (!checked) return 0;
        return f->phase ? can_complete(st, n, f->phase) : char_done(st, n);
    }
    if (f->esc == 1) { /* after a backslash */
        if (!b || !escape_ok(st, b) || (f->seen && b != 'u') || (checked && b == 'u')) return -1;
        f->esc = b == 'u' ? 5 : 0;
        f->alive = 0;
        if (b == 'u' || !checked) return 0;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        return put_cp(st, (uint8_t)to[strchr(from, b) - from]) ? -1 : char_done(st, n);
    }
    if (f->esc > 1) {
        int h = hexval(b);
        if (h < 0) return -1;
        f->alive = f->alive << 4 | (uint64_t)h;
        if (--f->esc > 1) {
            /* compact: \u only for control characters, as 00XX */
            if (!st->s->pretty && !f->seen && f->esc >= 3 && h) return -1;
            if (!st->s->pretty && !f->seen && f->esc == 2 && h > 1) return -1;
            return 0;
        }
        f->esc = 0;
        uint32_t cp = (uint32_t)f->alive;
        if (f->seen) { /* the low half of a pair */
            if (cp < 0xDC00 || cp > 0xDFFF) return -1;
            cp = 0x10000 + (((uint32_t)f->seen - 0xD800) << 10) + (cp - 0xDC00);
            f->seen = 0;
        } else if (cp >= 0xD800 && cp <= 0xDBFF) {
            f->seen = cp; /* a second \u must follow */
            return 0;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) return -1; /* a lone low half */
        return checked ? (put_cp(st, cp) ? -1 : char_done(st, n)) : 0;
    }
    if (f->seen) return b == '\\' ? (f->esc = 1, 0) : -1;
    if (b == '"') {
        if (n && (long)f->count < n->min_len) return -1;
        if (checked && !js_pat_full(n, st->sbuf, st->slen)) return -1;
        st->slen = 0;
        value_done(st);
        return 0;
    }
    if (b < 0x20 || b == 0x7F || (b >= 0x80 && b < 0xC2) || b > 0xF4) return -1;
    if (n && n->max_len >= 0 && (long)f->count >= n->max_len) return -1; /* a character more */
    f->count++;
    if (b == '\\') f->esc = 1;
    else if (b >= 0xC2) f->phase = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
    if (checked && b == '\\') return escape_possible(st, n);
    if (checked) {
        if (st->slen >= JS_MAX_PAT) return -1;
        st->sbuf[st->slen++] = b;
        return b < 0x80 ? char_done(st, n) : can_complete(st, n, f->phase);
    }
    return 0;
}

static int num_final(const js_frame *f) {
    return f->phase == N_ZERO_OK || f->phase == N_INT_OK || f->phase == N_FRAC_OK || f->phase == N_EXP_OK;
}

/* A bounded number's digit (json_number.c): recorded, and refused when no value in the bounds
 * can follow it. */
static int bounded_digit(js_frame *f, int next, uint8_t b) {
    const js_node *n = f->n;
    int d = b - '0';
    if (next == N_ZERO_OK || next == N_INT_OK) {
        if (f->pos - f->esc > JS_NUM_DIGITS + (n->kind == JS_INTEGER)) return -1;
        f->seen = f->seen * 10 + (uint64_t)d;
    } else {
        int cap = n->mult_digits >= 0 && n->mult_digits < JS_NUM_DIGITS ? n->mult_digits : JS_NUM_DIGITS;
        if ((int)f->count >= cap) return -1;
        f->alive = f->alive * 10 + (uint64_t)d;
        f->count++;
        f->phase = (uint8_t)next;
        if ((int)f->count == cap && !js_num_final_ok(f)) return -1; /* no digit can follow */
    }
    f->phase = (uint8_t)next;
    return js_num_feasible(f) ? 0 : -1;
}

/* A byte that extends the number: 1; a byte it cannot take: 0 (ok to end) or -1. */
static int feed_number(js_frame *f, uint8_t b) {
    int digit = b >= '0' && b <= '9', integer = f->n->kind == JS_INTEGER, next = -1;
    if (f->n->bounded && (b == 'e' || b == 'E')) return num_final(f) && js_num_final_ok(f) ? 0 : -1;
    switch (f->phase) {
    case N_SIGN: next = b == '0' ? N_ZERO_OK : digit ? N_INT_OK : -1; break;
    case N_ZERO_OK: next = (b == '.' && !integer) ? N_DOT : ((b == 'e' || b == 'E') && !integer) ? N_E : -1; break;
    case N_INT_OK: next = digit ? N_INT_OK : (b == '.' && !integer) ? N_DOT : ((b == 'e' || b == 'E') && !integer) ? N_E : -1; break;
    case N_DOT: next = digit ? N_FRAC_OK : -1; break;
    case N_FRAC_OK: next = digit ? N_FRAC_OK : (b == 'e' || b == 'E') ? N_E : -1; break;
    case N_E: next = (b == '+' || b == '-') ? N_ESIGN : digit ? N_EXP_OK : -1; break;
    case N_ESIGN: case N_EXP_OK: next = digit ? N_EXP_OK : -1; break;
    }
    if (next >= 0) {
        int final = next == N_ZERO_OK || next == N_INT_OK || next == N_FRAC_OK || next == N_EXP_OK;
        /* a '.', 'e' or sign needs a digit after it: no room for one is a dead end, refused here */
        if (++f->pos > JS_MAX_NUM || (!final && f->pos >= JS_MAX_NUM)) return -1;
        if (f->n->bounded) {
            if (digit) return bounded_digit(f, next, b) ? -1 : 1;
            f->phase = (uint8_t)next; /* '.' */
            return js_num_feasible(f) ? 1 : -1;
        }
        f->phase = (uint8_t)next;
        return 1;
    }
    return num_final(f) && js_num_final_ok(f) ? 0 : -1;
}

/* A byte of an enum / const / true / false / null: 1 taken, 0 ends it, -1 rejected. */
static int feed_literal(js_state *st, js_frame *f, uint8_t b) {
    uint64_t alive = 0;
    for (int i = 0; i < f->n->n_lits; i++)
        if ((f->alive >> i & 1) && f->n->lit_len[i] > f->pos && (uint8_t)f->n->lits[i][f->pos] == b) alive |= 1ull << i;
    if (!alive) return lit_complete(f) ? 0 : -1;
    f->alive = alive;
    f->pos++;
    if (lit_all_complete(f)) value_done(st);
    return 1;
}

/* Listed keys: which of the properties not yet written the key text can still become. */
static int feed_key(js_frame *f, uint8_t b) {
    const js_node *n = f->n;
    uint64_t alive = 0;
    for (int i = 0; i < n->n_props; i++)
        if ((f->alive >> i & 1) && n->key_len[i] > f->pos && (uint8_t)n->keys[i][f->pos] == b) alive |= 1ull << i;
    if (!alive) return -1;
    f->alive = alive;
    f->pos++;
    for (int i = 0; i < n->n_props; i++)
        if ((alive >> i & 1) && n->key_len[i] == f->pos) { /* the closing quote: one key */
            f->prop = (int16_t)i;
            f->seen |= 1ull << i;
            f->phase = O_COLON;
            f->ws = 0;
        }
    return 0;
}

static uint64_t all_props(const js_node *n) { return n->n_props >= 64 ? ~0ull : (1ull << n->n_props) - 1; }

static int feed_object(js_state *st, js_frame *f, uint8_t b) {
    const js_node *n = f->n;
    switch (f->phase) {
    case O_START: case O_KEY_NEXT:
        if (is_ws(b)) return take_ws(st, &f->ws, b);
        if (b == '}' && f->phase == O_START) {
            if (n->required) return -1;
            value_done(st);
            return 0;
        }
        if (b != '"') return -1;
        f->ws = 0;
        if (n->free_keys) {
            f->phase = O_KEY_FREE;
            return push(st, &node_any_str, F_STR) ? 0 : -1;
        }
        f->alive = all_props(n) & ~f->seen;
        if (!f->alive) return -1;
        f->phase = O_KEY;
        f->pos = 1;
        return 0;
    case O_KEY:
        return feed_key(f, b);
    case O_COLON:
        if (is_ws(b)) return take_ws(st, &f->ws, b);
        if (b != ':') return -1;
        f->phase = O_VALUE;
        f->ws = 0;
        return 0;
    case O_VALUE:
        if (is_ws(b)) return take_ws(st, &f->ws, b);
        return start_value(st, f->prop >= 0 ? n->props[f->prop] : n->extra, b);
    case O_AFTER:
        if (is_ws(b)) return take_ws(st, &f->ws, b);
        if (b == ',') {
            if (!n->free_keys && !(all_props(n) & ~f->seen)) return -1;
            f->phase = O_KEY_NEXT;
            f->ws = 0;
            return 0;
        }
        if (b != '}' || (n->required & ~f->seen)) return -1;
        value_done(st);
        return 0;
    }
    return -1;
}

static int feed_array(js_state *st, js_frame *f, uint8_t b) {
    const js_node *n = f->n;
    if (is_ws(b)) return take_ws(st, &f->ws, b);
    switch (f->phase) {
    case A_START:
        if (b == ']') {
            if (n->min_items > 0) return -1;
            value_done(st);
            return 0;
        }
        /* fall through */
    case A_NEXT:
        if (n->max_items >= 0 && (long)f->count >= n->max_items) return -1;
        return start_value(st, n->items, b);
    case A_AFTER:
        if (b == ',') {
            if (n->max_items >= 0 && (long)f->count >= n->max_items) return -1;
            f->phase = A_NEXT;
            f->ws = 0;
            return 0;
        }
        if (b != ']' || (long)f->count < n->min_items) return -1;
        value_done(st);
        return 0;
    }
    return -1;
}

static int feed(js_state *st, uint8_t b) {
    for (;;) {
        if (!st->depth) {
            if (st->done) return -1;
            if (is_ws(b)) return take_ws(st, &st->ws, b);
            return start_value(st, st->s->root, b);
        }
        js_frame *f = &st->f[st->depth - 1];
        int r;
        switch (f->kind) {
        case F_STR: return feed_string(st, f, b);
        case F_OBJ: return feed_object(st, f, b);
        case F_ARR: return feed_array(st, f, b);
        case F_NUM:
            if ((r = feed_number(f, b)) != 0) return r > 0 ? 0 : -1;
            value_done(st); /* the number ended before b: b belongs to the enclosing value */
            break;
        default:
            if ((r = feed_literal(st, f, b)) != 0) return r > 0 ? 0 : -1;
            value_done(st);
            break;
        }
    }
}

int js_feed(js_state *st, uint8_t b) {
    if (st->failed) return -1;
    if (feed(st, b)) {
        st->failed = 1;
        return -1;
    }
    return 0;
}

int js_can_end(const js_state *st) {
    if (st->failed) return 0;
    if (!st->depth) return st->done;
    if (st->depth > 1) return 0;
    const js_frame *f = &st->f[0];
    if (f->kind == F_NUM) return num_final(f) && js_num_final_ok(f);
    return f->kind == F_LIT && lit_complete(f);
}

int js_is_done(const js_state *st) { return !st->failed && !st->depth && st->done; }
