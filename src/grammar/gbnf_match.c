/* GBNF matcher: the text so far as a set of stacks of element positions (gbnf.h), each stack
 * one way the grammar can have read it, its top the character element it waits on (an empty
 * stack: the root is complete). A code point pops the tops that take it and expands what
 * follows through rule references (a reference at an alternative's end replaces its caller:
 * repetitions stay flat). Bytes are decoded from UTF-8; a partial character is kept while some
 * waiting class holds a code point it can still become. */
#include <string.h>

#include "grammar/gbnf.h"
#include "grammar/matcher.h"

static int class_has(const gb_grammar *g, const gb_elem *e, uint32_t cp) {
    int in = 0;
    for (int i = 0; i < e->n_ranges && !in; i++) in = cp >= g->rg[e->arg + i].lo && cp <= g->rg[e->arg + i].hi;
    return in != e->neg;
}

/* Some code point in [lo, hi] is in the class (a negated class: unless one range covers all). */
static int class_meets(const gb_grammar *g, const gb_elem *e, uint32_t lo, uint32_t hi) {
    for (int i = 0; i < e->n_ranges; i++) {
        const gb_range *r = &g->rg[e->arg + i];
        if (e->neg && r->lo <= lo && r->hi >= hi) return 0;
        if (!e->neg && r->lo <= hi && r->hi >= lo) return 1;
    }
    return e->neg;
}

static void add_stack(gb_state *st, const uint16_t *s, int len) {
    for (int i = 0; i < st->n; i++) /* kept once */
        if (st->off[i + 1] - st->off[i] == len && !memcmp(st->pool + st->off[i], s, sizeof *s * (size_t)len)) return;
    if (st->n >= GB_MAX_STACKS || st->used + len > GB_POOL) return;
    memcpy(st->pool + st->used, s, sizeof *s * (size_t)len);
    st->used = (uint16_t)(st->used + len);
    st->off[++st->n] = st->used;
}

/* Expansions one character may cost: nullable rules nested in sequence could otherwise
 * multiply the ways to the same stacks without bound (past it, paths are dropped). */
#define GB_EXPAND_BUDGET 20000

/* Adds the stacks s[0..len) leads to whose tops wait on a character (or that are empty). */
static void expand(gb_state *st, const uint16_t *s, int len, int depth, int *budget) {
    const gb_grammar *g = st->g;
    if (depth > 2 * GB_MAX_DEPTH || --*budget < 0) return;
    if (!len) {
        add_stack(st, s, 0);
        return;
    }
    const gb_elem *e = &g->el[s[len - 1]];
    if (e->kind == GB_CHAR) {
        add_stack(st, s, len);
        return;
    }
    if (e->kind == GB_END) { /* the rule is read: back to its caller's next element */
        expand(st, s, len - 1, depth + 1, budget);
        return;
    }
    uint16_t buf[GB_MAX_DEPTH];
    int base = len - 1;
    memcpy(buf, s, sizeof *s * (size_t)base);
    if (g->el[s[len - 1] + 1].kind != GB_END) buf[base++] = (uint16_t)(s[len - 1] + 1); /* where to return */
    if (base >= GB_MAX_DEPTH) return;
    const gb_rule *r = &g->rules[e->arg];
    for (int a = 0; a < r->n_alts; a++) {
        uint16_t one[GB_MAX_DEPTH];
        memcpy(one, buf, sizeof *buf * (size_t)base);
        one[base] = (uint16_t)r->alts[a];
        expand(st, one, base + 1, depth + 1, budget);
    }
}

static void gb_start(void *v, const void *gv) {
    gb_state *st = v;
    const gb_grammar *g = gv;
    st->g = g;
    st->n = st->used = 0;
    st->off[0] = 0;
    st->need = st->dead = st->clen = 0;
    st->cp = 0;
    const gb_rule *r = &g->rules[g->root];
    int budget = GB_EXPAND_BUDGET;
    for (int a = 0; a < r->n_alts; a++) {
        uint16_t s = (uint16_t)r->alts[a];
        expand(st, &s, 1, 0, &budget);
    }
}

static void gb_copy(void *d, const void *s) {
    const gb_state *src = s;
    memcpy(d, s, offsetof(gb_state, pool) + sizeof src->pool[0] * src->used);
}

static void advance(const gb_state *from, uint32_t cp, gb_state *to) {
    const gb_grammar *g = from->g;
    to->n = to->used = 0;
    to->need = 0;
    int budget = GB_EXPAND_BUDGET;
    for (int i = 0; i < from->n; i++) {
        int len = from->off[i + 1] - from->off[i];
        const uint16_t *s = from->pool + from->off[i];
        if (!len || !class_has(g, &g->el[s[len - 1]], cp)) continue;
        uint16_t buf[GB_MAX_DEPTH];
        memcpy(buf, s, sizeof *s * (size_t)len);
        buf[len - 1]++; /* past the character */
        expand(to, buf, len, 0, &budget);
    }
}

/* A partial character: some waiting class holds a code point in [lo, hi]. */
static int partial_ok(const gb_state *st, uint32_t lo, uint32_t hi) {
    for (int i = 0; i < st->n; i++) {
        int len = st->off[i + 1] - st->off[i];
        if (len && class_meets(st->g, &st->g->el[st->pool[st->off[i + 1] - 1]], lo, hi)) return 1;
    }
    return 0;
}

static void gb_step(const void *fv, uint8_t b, void *tv) {
    const gb_state *from = fv;
    gb_state *to = tv;
    to->g = from->g;
    to->dead = 1;
    to->n = to->used = 0;
    to->off[0] = 0;
    if (from->dead) return;
    static const uint32_t MIN_CP[] = {0, 0, 0x80, 0x800, 0x10000}; /* shorter is overlong */
    uint32_t cp;
    int need, clen;
    if (from->need) {
        if ((b & 0xC0) != 0x80) return;
        cp = from->cp << 6 | (b & 0x3F);
        need = from->need - 1;
        clen = from->clen;
    } else if (b < 0x80) {
        cp = b, need = 0, clen = 1;
    } else {
        need = b >= 0xF0 && b <= 0xF4 ? 3 : b >= 0xE0 && b < 0xF0 ? 2 : b >= 0xC2 && b < 0xE0 ? 1 : -1;
        if (need < 0) return;
        cp = b & (0x3F >> need);
        clen = need + 1;
    }
    if (need) { /* wait for the rest, while some class can take what it may become */
        uint32_t lo = cp << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
        if (lo < MIN_CP[clen]) lo = MIN_CP[clen];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi || !partial_ok(from, lo, hi)) return;
        gb_copy(to, from);
        to->need = (uint8_t)need;
        to->clen = (uint8_t)clen;
        to->cp = cp;
        to->dead = 0;
        return;
    }
    if (cp < MIN_CP[clen] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return;
    advance(from, cp, to);
    to->dead = to->n == 0;
}

static int gb_alive(const void *v) { return !((const gb_state *)v)->dead; }

static int gb_can_end(const void *v) {
    const gb_state *st = v;
    if (st->dead || st->need) return 0;
    for (int i = 0; i < st->n; i++)
        if (st->off[i + 1] == st->off[i]) return 1;
    return 0;
}

static int gb_is_done(const void *v) {
    const gb_state *st = v;
    return gb_can_end(v) && st->n == 1;
}

const gm_ops GB_OPS = {sizeof(gb_state), gb_start, gb_copy, gb_step, gb_alive, gb_can_end, gb_is_done};
