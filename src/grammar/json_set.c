/* anyOf alternatives that begin alike (two objects, string enums sharing a prefix, null beside
 * an object...) are followed side by side: a set of matcher paths, each byte fed to every one,
 * a path forking where a value could start as several alternatives, dying where its
 * alternative refuses the byte. Paths that end up equal are kept once, so a set stays small
 * (at most JS_MAX_SET; past that the later forks are dropped, which narrows but never widens
 * what is accepted). With no such anyOf a set is one path and costs what a path costs. */
#include <string.h>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"

void js_set_start(js_set *set, const js_schema *s) {
    set->n = 1;
    js_start(&set->s[0], s);
}

void js_set_copy(js_set *dst, const js_set *src) {
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) js_copy(&dst->s[i], &src->s[i]);
}

static int same(const js_state *a, const js_state *b) {
    return a->depth == b->depth && a->done == b->done && a->ws == b->ws && a->slen == b->slen &&
           !memcmp(a->f, b->f, sizeof a->f[0] * (size_t)a->depth) && !memcmp(a->sbuf, b->sbuf, a->slen);
}

void js_set_step(const js_set *from, uint8_t b, js_set *to) {
    to->n = 0;
    for (int i = 0; i < from->n; i++) {
        for (int k = 0; k < JS_MAX_SET && to->n < JS_MAX_SET; k++) {
            js_state *t = &to->s[to->n];
            js_copy(t, &from->s[i]);
            t->pick = (uint8_t)k;
            t->n_picks = 0;
            int ok = !js_feed(t, b);
            int more = k + 1 < t->n_picks;
            t->pick = t->n_picks = 0;
            if (ok) {
                int dup = 0;
                for (int j = 0; j < to->n && !dup; j++) dup = same(&to->s[j], t);
                if (!dup) to->n++;
            }
            if (!more) break;
        }
    }
}

int js_set_can_end(const js_set *set) {
    for (int i = 0; i < set->n; i++)
        if (js_can_end(&set->s[i])) return 1;
    return 0;
}

int js_set_is_done(const js_set *set) {
    for (int i = 0; i < set->n; i++)
        if (js_is_done(&set->s[i])) return 1;
    return 0;
}

static void ops_start(void *st, const void *g) { js_set_start(st, g); }
static void ops_copy(void *d, const void *s) { js_set_copy(d, s); }
static void ops_step(const void *f, uint8_t b, void *t) { js_set_step(f, b, t); }
static int ops_alive(const void *st) { return ((const js_set *)st)->n > 0; }
static int ops_can_end(const void *st) { return js_set_can_end(st); }
static int ops_is_done(const void *st) { return js_set_is_done(st); }

const gm_ops JS_OPS = {sizeof(js_set), ops_start, ops_copy, ops_step, ops_alive, ops_can_end, ops_is_done};
