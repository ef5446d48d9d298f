/* Number keywords: minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf.
 * A bounded number is written without exponent, "-0" or more than JS_NUM_DIGITS digits on
 * either side of the point (narrower than JSON allows, so every value written still holds).
 * Its frame keeps the sign (esc), the integer part (seen), the fraction digits (alive) and
 * their count (count). A prefix is refused at the byte after which no value it can grow into
 * lies in the bounds: exactly for integers (64-bit arithmetic, multipleOf included), through
 * doubles for numbers (the complete number is then checked exactly as a validator parses it). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema.h"

/* Integers stay within a double's exact range, as a JSON parser in JavaScript reads them. */
#define INT_LIMIT 9007199254740991LL /* 2^53 - 1 */

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12,
                               1e13, 1e14, 1e15, 1e16, 1e17, 1e18};

/* ---- integers ---- */

/* Some multiple of m (0: any integer) lies in [a, b]. */
static int has_multiple(int64_t a, int64_t b, int64_t m) {
    if (a > b) return 0;
    if (m <= 1) return 1;
    int64_t r = a % m; /* first multiple >= a */
    if (r < 0) r += m;
    int64_t first = r ? a + (m - r) : a;
    return first <= b;
}

/* Magnitudes [a, b] (written with sign neg) meet the node's integer bounds. */
static int int_meets(const js_node *n, int neg, int64_t a, int64_t b) {
    int64_t lo = neg ? -b : a, hi = neg ? -a : b;
    if (lo < n->ilo) lo = n->ilo;
    if (hi > n->ihi) hi = n->ihi;
    return has_multiple(lo, hi, n->imult);
}

static int int_feasible(const js_frame *f) {
    const js_node *n = f->n;
    int neg = f->esc;
    if (f->pos == 1 && neg) return int_meets(n, 1, 1, INT_LIMIT); /* "-": some negative value */
    int64_t v = (int64_t)f->seen;
    int digits = f->pos - neg;
    if (neg && v == 0) return 0; /* "-0" */
    if (int_meets(n, neg, v, v)) return 1;
    if (v == 0) return 0; /* "0" takes no more digits */
    /* v followed by j more digits: [v*10^j, v*10^j + 10^j - 1] */
    int64_t p = 1;
    for (int j = 1; digits + j <= JS_NUM_DIGITS + 1; j++) {
        p *= 10;
        if (v > INT_LIMIT / p) break;
        int64_t a = v * p, b = a + p - 1;
        if (a > INT_LIMIT) break;
        if (b > INT_LIMIT) b = INT_LIMIT;
        if (int_meets(n, neg, a, b)) return 1;
    }
    return 0;
}

/* ---- numbers ---- */

/* Values from L to R (ends included when Lin / Rin) meet the node's bounds. */
static int span_meets(const js_node *n, double L, int Lin, double R, int Rin) {
    if (n->has_lo) {
        if (n->lo > L) L = n->lo, Lin = !n->lo_excl;
        else if (n->lo == L) Lin = Lin && !n->lo_excl;
    }
    if (n->has_hi) {
        if (n->hi < R) R = n->hi, Rin = !n->hi_excl;
        else if (n->hi == R) Rin = Rin && !n->hi_excl;
    }
    return L < R || (L == R && Lin && Rin);
}

/* Magnitudes [a, b) written with sign neg. */
static int mag_meets(const js_node *n, int neg, double a, double b) {
    return neg ? span_meets(n, -b, 0, -a, 1) : span_meets(n, a, 1, b, 0);
}

/* The number's text, rebuilt from its frame (the end check parses it as a validator would). */
static double frame_value(const js_frame *f) {
    char t[64];
    if (f->phase == 4 /* N_FRAC_OK */ && f->count)
        snprintf(t, sizeof t, "%s%llu.%0*llu", f->esc ? "-" : "", (unsigned long long)f->seen, (int)f->count,
                 (unsigned long long)f->alive);
    else snprintf(t, sizeof t, "%s%llu", f->esc ? "-" : "", (unsigned long long)f->seen);
    return strtod(t, NULL);
}

static int num_feasible(const js_frame *f) {
    const js_node *n = f->n;
    int neg = f->esc;
    if (f->pos == 1 && neg) return mag_meets(n, 1, 0, INFINITY) && span_meets(n, -INFINITY, 0, 0, 0);
    double v = (double)f->seen;
    if (f->phase == 3 /* N_DOT */ || f->phase == 4 /* N_FRAC_OK */) {
        double unit = 1 / POW10[f->count];
        double a = v + (double)f->alive * unit;
        if (neg && v == 0 && f->alive == 0 && f->count == JS_NUM_DIGITS) return 0; /* -0.000... */
        return mag_meets(n, neg, a, a + unit);
    }
    int digits = f->pos - neg;
    if (mag_meets(n, neg, v, v + 1)) return 1; /* this integer part, any fraction */
    if (v == 0) return 0;
    for (int j = 1; digits + j <= JS_NUM_DIGITS; j++)
        if (mag_meets(n, neg, v * POW10[j], (v + 1) * POW10[j])) return 1;
    return 0;
}

static int final_check(const js_node *n, double x, int neg);

/* A multipleOf with few decimals: some fraction digits still allowed make a value that holds
 * (at most 10^3 candidates; with more decimals the end check alone decides). */
static int mult_reachable(const js_frame *f) {
    const js_node *n = f->n;
    int count = f->phase == 3 || f->phase == 4 ? (int)f->count : 0, r = n->mult_digits - count;
    if (f->phase == 4 && r < 0) return 0;
    if (r > 3 || r < 0) return 1;
    long lim = r == 0 ? 1 : r == 1 ? 10 : r == 2 ? 100 : 1000;
    for (long t = 0; t < lim; t++) {
        char s[64];
        if (count + r)
            snprintf(s, sizeof s, "%llu.%0*llu%0*ld", (unsigned long long)f->seen, count, (unsigned long long)f->alive, r, t);
        else snprintf(s, sizeof s, "%llu", (unsigned long long)f->seen);
        if (final_check(n, f->esc ? -strtod(s, NULL) : strtod(s, NULL), f->esc)) return 1;
    }
    /* the integer part may still grow */
    return (f->phase == 1 || f->phase == 2) && f->seen && f->pos - f->esc < JS_NUM_DIGITS;
}

int js_num_feasible(const js_frame *f) {
    if (!f->n->bounded) return 1;
    if (f->n->kind == JS_INTEGER) return int_feasible(f);
    if (!num_feasible(f)) return 0;
    return !f->n->mult || f->pos == (uint16_t)f->esc || mult_reachable(f);
}

/* multipleOf as a JavaScript validator checks it: value / m is an integer below 1e21. */
static int js_multiple(double x, double m) {
    double q = x / m;
    return isfinite(q) && fabs(q) < 1e21 && q == trunc(q);
}

static int final_check(const js_node *n, double x, int neg) {
    if (neg && x == 0) return 0;
    if (!span_meets(n, x, 1, x, 1)) return 0;
    return !n->mult || js_multiple(x, n->mult);
}

int js_num_final_ok(const js_frame *f) {
    const js_node *n = f->n;
    if (!n->bounded) return 1;
    if (n->kind == JS_INTEGER) {
        int64_t v = (int64_t)f->seen;
        if (f->esc) {
            if (!v) return 0;
            v = -v;
        }
        return v >= n->ilo && v <= n->ihi && (n->imult <= 1 || v % n->imult == 0);
    }
    return final_check(n, frame_value(f), f->esc);
}

/* ---- compiling ---- */

static int bound(const cJSON *j, const char *key, double *out, char *err, size_t errsz) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        snprintf(err, errsz, "'%s' must be a number", key);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

int js_num_compile(js_node *n, const cJSON *j, char *err, size_t errsz) {
    double mn = 0, mx = 0, xmn = 0, xmx = 0, m = 0;
    int h_mn = bound(j, "minimum", &mn, err, errsz), h_mx = bound(j, "maximum", &mx, err, errsz);
    int h_xmn = bound(j, "exclusiveMinimum", &xmn, err, errsz), h_xmx = bound(j, "exclusiveMaximum", &xmx, err, errsz);
    int h_m = bound(j, "multipleOf", &m, err, errsz);
    if (h_mn < 0 || h_mx < 0 || h_xmn < 0 || h_xmx < 0 || h_m < 0) return -1;
    if (h_m && m <= 0) {
        snprintf(err, errsz, "'multipleOf' must be greater than 0");
        return -1;
    }
    if (!h_mn && !h_mx && !h_xmn && !h_xmx && !h_m) return 0;
    n->bounded = 1;
    /* the tighter of the inclusive and the exclusive bound on each side */
    if (h_mn) n->has_lo = 1, n->lo = mn;
    if (h_xmn && (!h_mn || xmn >= mn)) n->has_lo = 1, n->lo = xmn, n->lo_excl = 1;
    if (h_mx) n->has_hi = 1, n->hi = mx;
    if (h_xmx && (!h_mx || xmx <= mx)) n->has_hi = 1, n->hi = xmx, n->hi_excl = 1;
    /* a whole multipleOf makes every value an integer: written as one */
    if (h_m && m == floor(m) && m <= (double)INT_LIMIT) n->kind = JS_INTEGER, n->imult = (int64_t)m;
    if (n->kind == JS_INTEGER) {
        double lo = -(double)INT_LIMIT, hi = (double)INT_LIMIT;
        if (n->has_lo) lo = n->lo_excl ? floor(n->lo) + 1 : ceil(n->lo);
        if (n->has_hi) hi = n->hi_excl ? ceil(n->hi) - 1 : floor(n->hi);
        if (lo < -(double)INT_LIMIT) lo = -(double)INT_LIMIT;
        if (hi > (double)INT_LIMIT) hi = (double)INT_LIMIT;
        n->ilo = (int64_t)lo, n->ihi = (int64_t)hi;
        if (lo > hi || !has_multiple(n->ilo, n->ihi, n->imult)) {
            snprintf(err, errsz, "no integer (within +-2^53) satisfies the bounds and multipleOf");
            return -1;
        }
        return 0;
    }
    if (h_m) { /* decimals of m: the fraction digits past them cannot help */
        n->mult = m;
        char t[40], *e;
        snprintf(t, sizeof t, "%.15g", m);
        const char *dot = strchr(t, '.');
        long ex = (e = strpbrk(t, "eE")) ? strtol(e + 1, NULL, 10) : 0;
        long frac = dot ? (long)((e ? e : t + strlen(t)) - dot - 1) : 0;
        long d = frac - ex;
        n->mult_digits = d < 0 ? 0 : d <= JS_NUM_DIGITS ? (int)d : -1;
    } else n->mult_digits = -1;
    if (!span_meets(n, -INFINITY, 0, INFINITY, 0) || (n->has_lo && n->has_hi && n->lo == n->hi && (n->lo_excl || n->hi_excl))) {
        snprintf(err, errsz, "no number satisfies the bounds");
        return -1;
    }
    return 0;
}
