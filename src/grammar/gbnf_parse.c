/* GBNF text -> gb_grammar, as llama.cpp's grammar format is written: `name ::= alternatives`,
 * one rule a line (a rule goes on past line ends inside parentheses, after `::=` and after
 * `|`), `#` comments, literals "..." and classes [...] / [^...] with ranges and escapes
 * (\n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH), `.` for any character, groups (...) and
 * the postfix operators * + ? {m} {m,} {m,n}. Groups and repetitions become rules of their
 * own (x* is R ::= x R | empty), so the matcher only knows characters, rule references and
 * ends. Errors name the rule being defined, the line and the column. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gbnf.h"

#define GB_MAX_ELEMS 65536 /* positions are 16-bit in the matcher */
#define GB_MAX_REPEAT 256

typedef struct {
    gb_grammar *g;
    const char *src, *p;
    const char *cur; /* the rule being defined, for errors */
    size_t cur_len;
    int failed;
    char *err;
    size_t errsz;
} pctx;

typedef struct {
    gb_elem *e;
    int n, cap;
} seq;

static void where(const pctx *c, const char *at, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *q = c->src; q < at && *q; q++) {
        if (*q == '\n') (*line)++, *col = 1;
        else if (((unsigned char)*q & 0xC0) != 0x80) (*col)++;
    }
}

static int perr(pctx *c, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(pctx *c, const char *at, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    int line, col;
    where(c, at, &line, &col);
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->cur) snprintf(c->err, c->errsz, "rule '%.*s', line %d column %d: %s", (int)(c->cur_len > 60 ? 60 : c->cur_len), c->cur, line, col, msg);
    else snprintf(c->err, c->errsz, "line %d column %d: %s", line, col, msg);
    for (char *q = c->err; *q; q++) /* one line, whatever the text held */
        if ((unsigned char)*q < 0x20) *q = ' ';
    return -1;
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap * 2 : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, elem * (size_t)n);
    if (!q) return -1;
    *p = q, *cap = n;
    return 0;
}

static int seq_push(pctx *c, seq *s, gb_elem e) {
    if (s->n >= GB_MAX_ELEMS || grow((void **)&s->e, &s->cap, s->n + 1, sizeof *s->e))
        return perr(c, c->p, "the grammar is too large");
    s->e[s->n++] = e;
    return 0;
}

static int new_rule(pctx *c, const char *name, size_t len, const char *at) {
    gb_grammar *g = c->g;
    if (grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) return perr(c, at, "out of memory");
    gb_rule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    if (!(r->name = malloc(len + 1))) return perr(c, at, "out of memory");
    memcpy(r->name, name, len);
    r->name[len] = 0;
    where(c, at, &r->line, &r->col);
    return g->n_rules++;
}

/* A rule made for a group or a repetition: defined here, and named so that no reference finds it. */
static int new_anon(pctx *c, const char *at) {
    char name[80];
    int n = snprintf(name, sizeof name, "%.*s~", (int)(c->cur_len > 60 ? 60 : c->cur_len), c->cur ? c->cur : "");
    int r = new_rule(c, name, (size_t)n, at);
    if (r >= 0) c->g->rules[r].defined = 1;
    return r;
}

static int rule_named(pctx *c, const char *name, size_t len, const char *at) {
    for (int i = 0; i < c->g->n_rules; i++)
        if (strlen(c->g->rules[i].name) == len && !memcmp(c->g->rules[i].name, name, len)) return i;
    return new_rule(c, name, len, at);
}

/* An alternative of rule r: the elements, then an end. */
static int add_alt(pctx *c, int r, const gb_elem *e, int n) {
    gb_grammar *g = c->g;
    if (g->n_el + n + 1 > GB_MAX_ELEMS) return perr(c, c->p, "the grammar is too large");
    if (grow((void **)&g->el, &g->cap_el, g->n_el + n + 1, sizeof *g->el)) return perr(c, c->p, "out of memory");
    gb_rule *ru = &g->rules[r];
    if (grow((void **)&ru->alts, &ru->cap_alts, ru->n_alts + 1, sizeof *ru->alts)) return perr(c, c->p, "out of memory");
    ru->alts[ru->n_alts++] = g->n_el;
    if (n) memcpy(g->el + g->n_el, e, sizeof *e * (size_t)n);
    g->n_el += n;
    g->el[g->n_el++] = (gb_elem){.kind = GB_END};
    return 0;
}

static int add_range(pctx *c, uint32_t lo, uint32_t hi) {
    gb_grammar *g = c->g;
    if (grow((void **)&g->rg, &g->cap_rg, g->n_rg + 1, sizeof *g->rg)) return perr(c, c->p, "out of memory");
    g->rg[g->n_rg++] = (gb_range){lo, hi};
    return 0;
}

static const char *skip_space(const char *p, int nested) {
    for (;;) {
        if (*p == ' ' || *p == '\t' || (nested && (*p == '\n' || *p == '\r'))) p++;
        else if (*p == '#') {
            while (*p && *p != '\n') p++;
        } else return p;
    }
}

static int is_name(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_'; }

static int hexval(char h) {
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

/* One character of a literal or class (escape or UTF-8) at c->p: its code point, or -1. */
static long read_char(pctx *c) {
    const unsigned char *p = (const unsigned char *)c->p;
    if (*p == '\\') {
        int digits = 0;
        switch (p[1]) {
        case 'n': c->p += 2; return '\n';
        case 'r': c->p += 2; return '\r';
        case 't': c->p += 2; return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': c->p += 2; return p[1];
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: return perr(c, c->p, "unknown escape '\\%c'", p[1] ? p[1] : ' ');
        }
        long v = 0;
        for (int i = 0; i < digits; i++) {
            int h = hexval((char)p[2 + i]);
            if (h < 0) return perr(c, c->p, "\\%c wants %d hex digits", p[1], digits);
            v = v * 16 + h;
        }
        if (v > 0x10FFFF) return perr(c, c->p, "escape beyond U+10FFFF");
        c->p += 2 + digits;
        return v;
    }
    if (*p < 0x80) {
        if (!*p) return perr(c, c->p, "the text ends inside a literal or class");
        c->p++;
        return *p;
    }
    int k = *p >= 0xF0 && *p <= 0xF4 ? 3 : *p >= 0xE0 ? 2 : *p >= 0xC2 && *p < 0xE0 ? 1 : -1;
    if (k < 0) return perr(c, c->p, "invalid UTF-8");
    long v = *p & (0x3F >> k);
    for (int i = 1; i <= k; i++) {
        if ((p[i] & 0xC0) != 0x80) return perr(c, c->p, "invalid UTF-8");
        v = v << 6 | (p[i] & 0x3F);
    }
    c->p += k + 1;
    return v;
}

static int parse_alternates(pctx *c, int rule, int nested);

/* x{min,max} (max -1: no limit) in place of the item s[last..n). */
static int repeat(pctx *c, seq *s, int last, long min, long max) {
    int n = s->n - last;
    gb_elem *item = malloc(sizeof *item * (size_t)n + 1);
    if (!item) return perr(c, c->p, "out of memory");
    memcpy(item, s->e + last, sizeof *item * (size_t)n);
    s->n = last;
    int r = 0;
    for (long i = 0; i < min && !r; i++)
        for (int k = 0; k < n && !r; k++) r = seq_push(c, s, item[k]);
    if (!r && max < 0) { /* R ::= item R | empty */
        int R = new_anon(c, c->p);
        seq alt = {0};
        for (int k = 0; k < n && R >= 0 && !r; k++) r = seq_push(c, &alt, item[k]);
        if (R < 0 || r || seq_push(c, &alt, (gb_elem){.kind = GB_RULE, .arg = (uint32_t)R}) || add_alt(c, R, alt.e, alt.n) ||
            add_alt(c, R, NULL, 0))
            r = -1;
        free(alt.e);
        if (!r) r = seq_push(c, s, (gb_elem){.kind = GB_RULE, .arg = (uint32_t)R});
    } else if (!r && max > min) { /* R1 ::= item | empty; Rk ::= item R(k-1) | empty */
        int prev = -1;
        for (long j = 0; j < max - min && !r; j++) {
            int R = new_anon(c, c->p);
            seq alt = {0};
            for (int k = 0; k < n && R >= 0 && !r; k++) r = seq_push(c, &alt, item[k]);
            if (!r && prev >= 0) r = seq_push(c, &alt, (gb_elem){.kind = GB_RULE, .arg = (uint32_t)prev});
            if (R < 0 || r || add_alt(c, R, alt.e, alt.n) || add_alt(c, R, NULL, 0)) r = -1;
            free(alt.e);
            prev = R;
        }
        if (!r) r = seq_push(c, s, (gb_elem){.kind = GB_RULE, .arg = (uint32_t)prev});
    }
    free(item);
    return r;
}

static int parse_repeat(pctx *c, seq *s, int last) {
    char op = *c->p;
    if (last < 0) return perr(c, c->p, "'%c' follows nothing it could repeat", op);
    if (op != '{') {
        c->p++;
        return repeat(c, s, last, op == '+', op == '?' ? 1 : -1);
    }
    char *end;
    const char *at = c->p;
    long min = strtol(c->p + 1, &end, 10), max;
    if (end == c->p + 1 || min < 0 || min > GB_MAX_REPEAT) return perr(c, at, "{m,n} wants a count from 0 to %d", GB_MAX_REPEAT);
    c->p = end;
    if (*c->p == '}') max = min;
    else if (*c->p == ',' && c->p[1] == '}') max = -1, c->p++;
    else if (*c->p == ',') {
        max = strtol(c->p + 1, &end, 10);
        if (end == c->p + 1 || max < min || max > GB_MAX_REPEAT) return perr(c, at, "{m,n} wants m <= n <= %d", GB_MAX_REPEAT);
        c->p = end;
    } else return perr(c, c->p, "a '{' repetition is {m}, {m,} or {m,n}");
    if (*c->p != '}') return perr(c, c->p, "'}' expected");
    c->p++;
    return repeat(c, s, last, min, max);
}

static int parse_sequence(pctx *c, seq *s, int nested) {
    int last = -1;
    for (;;) {
        c->p = skip_space(c->p, nested);
        char ch = *c->p;
        if (ch == '"') {
            last = s->n;
            c->p++;
            while (*c->p != '"') {
                long cp = read_char(c);
                if (cp < 0) return -1;
                if (add_range(c, (uint32_t)cp, (uint32_t)cp) ||
                    seq_push(c, s, (gb_elem){.kind = GB_CHAR, .n_ranges = 1, .arg = (uint32_t)c->g->n_rg - 1}))
                    return -1;
            }
            c->p++;
            if (s->n == last) last = -1; /* "" is nothing */
        } else if (ch == '[') {
            const char *at = c->p++;
            gb_elem e = {.kind = GB_CHAR, .arg = (uint32_t)c->g->n_rg};
            if (*c->p == '^') e.neg = 1, c->p++;
            while (*c->p != ']') {
                long lo = read_char(c), hi = lo;
                if (lo < 0) return -1;
                if (*c->p == '-' && c->p[1] != ']') {
                    c->p++;
                    if ((hi = read_char(c)) < 0) return -1;
                    if (hi < lo) return perr(c, at, "a class range goes backwards");
                }
                if (add_range(c, (uint32_t)lo, (uint32_t)hi)) return -1;
                if (++e.n_ranges > 4096) return perr(c, at, "a class with too many ranges");
            }
            c->p++;
            last = s->n;
            if (seq_push(c, s, e)) return -1;
        } else if (ch == '.') {
            c->p++;
            last = s->n;
            if (seq_push(c, s, (gb_elem){.kind = GB_CHAR, .neg = 1, .arg = (uint32_t)c->g->n_rg})) return -1;
        } else if (ch == '(') {
            const char *at = c->p++;
            int grp = new_anon(c, at);
            if (grp < 0 || parse_alternates(c, grp, 1)) return -1;
            c->p = skip_space(c->p, 1);
            if (*c->p != ')') {
                int l, col;
                where(c, at, &l, &col);
                return perr(c, c->p, "')' expected for the group opened at line %d column %d", l, col);
            }
            c->p++;
            last = s->n;
            if (seq_push(c, s, (gb_elem){.kind = GB_RULE, .arg = (uint32_t)grp})) return -1;
        } else if (is_name(ch)) {
            const char *name = c->p;
            while (is_name(*c->p)) c->p++;
            int R = rule_named(c, name, (size_t)(c->p - name), name);
            if (R < 0) return -1;
            last = s->n;
            if (seq_push(c, s, (gb_elem){.kind = GB_RULE, .arg = (uint32_t)R})) return -1;
        } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
            if (parse_repeat(c, s, last)) return -1;
        } else return 0;
    }
}

static int parse_alternates(pctx *c, int rule, int nested) {
    for (;;) {
        seq s = {0};
        int r = parse_sequence(c, &s, nested);
        if (!r) r = add_alt(c, rule, s.e, s.n);
        free(s.e);
        if (r) return -1;
        c->p = skip_space(c->p, nested);
        if (*c->p != '|') return 0;
        c->p = skip_space(c->p + 1, 1);
    }
}

/* Rules that can match without reading a character. */
static void find_nullable(const gb_grammar *g, uint8_t *nul) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            if (nul[r]) continue;
            for (int a = 0; a < g->rules[r].n_alts && !nul[r]; a++) {
                int i = g->rules[r].alts[a];
                while (g->el[i].kind == GB_RULE && nul[g->el[i].arg]) i++;
                if (g->el[i].kind == GB_END) nul[r] = changed = 1;
            }
        }
    }
}

/* Depth-first over "r can begin with rule b": a cycle is left recursion, which the matcher
 * would expand for ever. 1 grey, 2 done. */
static int left_cycle(const gb_grammar *g, const uint8_t *nul, uint8_t *mark, int r) {
    if (mark[r] == 2) return -1;
    if (mark[r] == 1) return r;
    mark[r] = 1;
    for (int a = 0; a < g->rules[r].n_alts; a++)
        for (int i = g->rules[r].alts[a]; g->el[i].kind == GB_RULE; i++) {
            int hit = left_cycle(g, nul, mark, (int)g->el[i].arg);
            if (hit >= 0) return hit;
            if (!nul[g->el[i].arg]) break;
        }
    mark[r] = 2;
    return -1;
}

static int check(pctx *c) {
    gb_grammar *g = c->g;
    c->cur = NULL;
    for (int r = 0; r < g->n_rules; r++) {
        gb_rule *ru = &g->rules[r];
        if (!ru->defined) {
            c->failed = 1;
            snprintf(c->err, c->errsz, "rule '%.60s', line %d column %d: used but not defined", ru->name, ru->line, ru->col);
            return -1;
        }
    }
    g->root = -1;
    for (int r = 0; r < g->n_rules; r++)
        if (!strcmp(g->rules[r].name, "root")) g->root = r;
    if (g->root < 0) return perr(c, c->p, "no rule named 'root'");
    uint8_t *nul = calloc((size_t)g->n_rules, 1), *mark = calloc((size_t)g->n_rules, 1);
    int bad = -1;
    if (!nul || !mark) perr(c, c->p, "out of memory");
    else {
        find_nullable(g, nul);
        for (int r = 0; r < g->n_rules && bad < 0; r++) bad = left_cycle(g, nul, mark, r);
    }
    free(nul);
    free(mark);
    if (bad >= 0) {
        c->failed = 1;
        const gb_rule *ru = &g->rules[bad];
        snprintf(c->err, c->errsz, "rule '%.*s', line %d column %d: left-recursive (it can reach itself before reading a character)",
                 (int)strcspn(ru->name, "~"), ru->name, ru->line, ru->col);
    }
    return c->failed ? -1 : 0;
}

void gb_free(gb_grammar *g) {
    if (!g) return;
    for (int r = 0; r < g->n_rules; r++) {
        free(g->rules[r].name);
        free(g->rules[r].alts);
    }
    free(g->rules);
    free(g->el);
    free(g->rg);
    free(g);
}

gb_grammar *gb_compile(const char *text, char *err, size_t errsz) {
    char dummy[8];
    pctx c = {.src = text, .p = text, .err = err && errsz ? err : dummy, .errsz = err && errsz ? errsz : sizeof dummy};
    c.err[0] = 0;
    if (!(c.g = calloc(1, sizeof *c.g))) {
        snprintf(c.err, c.errsz, "out of memory");
        return NULL;
    }
    for (;;) {
        c.cur = NULL;
        c.p = skip_space(c.p, 1);
        if (!*c.p) break;
        const char *name = c.p;
        while (is_name(*c.p)) c.p++;
        if (c.p == name) {
            perr(&c, c.p, "a rule name expected");
            break;
        }
        c.cur = name, c.cur_len = (size_t)(c.p - name);
        int r = rule_named(&c, name, c.cur_len, name);
        if (r < 0) break;
        if (c.g->rules[r].defined) {
            perr(&c, name, "defined twice");
            break;
        }
        c.g->rules[r].defined = 1;
        where(&c, name, &c.g->rules[r].line, &c.g->rules[r].col);
        c.p = skip_space(c.p, 0);
        if (strncmp(c.p, "::=", 3)) {
            perr(&c, c.p, "'::=' expected after the rule name");
            break;
        }
        c.p = skip_space(c.p + 3, 1);
        if (parse_alternates(&c, r, 0)) break;
        if (*c.p && *c.p != '\n' && *c.p != '\r') {
            perr(&c, c.p, "unexpected '%c'", *c.p);
            break;
        }
    }
    if (!c.failed) check(&c);
    if (c.failed) {
        gb_free(c.g);
        return NULL;
    }
    return c.g;
}
