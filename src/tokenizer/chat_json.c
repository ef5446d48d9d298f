/* Python json.dumps formatting over cJSON values. cJSON keeps numbers as doubles, so an
 * integral value prints as an integer (a float written 2.0 in the request comes out 2);
 * others print as Python's repr does (the shortest text that reads back the same). */
#include "chat_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} jbuf;

static void add(jbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 128;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void adds(jbuf *b, const char *s) { add(b, s, strlen(s)); }

static void quote(jbuf *b, const char *s) {
    adds(b, "\"");
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        char e[8];
        switch (*u) {
        case '"': adds(b, "\\\""); break;
        case '\\': adds(b, "\\\\"); break;
        case '\n': adds(b, "\\n"); break;
        case '\r': adds(b, "\\r"); break;
        case '\t': adds(b, "\\t"); break;
        case '\b': adds(b, "\\b"); break;
        case '\f': adds(b, "\\f"); break;
        default:
            if (*u < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", *u);
                adds(b, e);
            } else {
                add(b, (const char *)u, 1);
            }
        }
    }
    adds(b, "\"");
}

static void number(jbuf *b, double v) {
    char s[40];
    if (isnan(v) || isinf(v)) snprintf(s, sizeof s, "%s", isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
    else if (v == floor(v) && fabs(v) < 1e16) snprintf(s, sizeof s, "%.0f", v);
    else {
        for (int prec = 1; prec <= 17; prec++) { /* repr: the shortest that reads back */
            snprintf(s, sizeof s, "%.*g", prec, v);
            if (strtod(s, NULL) == v) break;
        }
        /* %g writes 1e-05 as Python does; a mantissa without '.' or 'e' needs ".0" */
        if (!strpbrk(s, ".eninf")) strcat(s, ".0");
    }
    adds(b, s);
}

static void newline(jbuf *b, int indent, int depth) {
    adds(b, "\n");
    for (int i = 0; i < indent * depth; i++) adds(b, " ");
}

static void dump(jbuf *b, const cJSON *v, int indent, int depth) {
    if (cJSON_IsString(v)) quote(b, v->valuestring);
    else if (cJSON_IsNumber(v)) number(b, v->valuedouble);
    else if (cJSON_IsTrue(v)) adds(b, "true");
    else if (cJSON_IsFalse(v)) adds(b, "false");
    else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        adds(b, obj ? "{" : "[");
        if (!v->child) { /* json.dumps writes {} and [] even when indenting */
            adds(b, obj ? "}" : "]");
            return;
        }
        for (const cJSON *c = v->child; c; c = c->next) {
            if (indent >= 0) newline(b, indent, depth + 1);
            if (obj) {
                quote(b, c->string ? c->string : "");
                adds(b, ": ");
            }
            dump(b, c, indent, depth + 1);
            if (c->next) adds(b, indent >= 0 ? "," : ", ");
        }
        if (indent >= 0) newline(b, indent, depth);
        adds(b, obj ? "}" : "]");
    } else adds(b, "null");
}

char *chat_json_dump(const cJSON *v, int indent) {
    jbuf b = {0};
    dump(&b, v, indent, 0);
    if (b.oom) free(b.p);
    return b.oom ? NULL : b.p;
}

char *chat_json_quote(const char *s) {
    jbuf b = {0};
    quote(&b, s);
    if (b.oom) free(b.p);
    return b.oom ? NULL : b.p;
}
