/* JSON schema -> js_node graph. The subset: type (one or a list), properties, required,
 * additionalProperties, enum, const, items, minItems/maxItems, minLength/maxLength, pattern,
 * format (json_pattern.c), minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf (json_number.c), anyOf /
 * oneOf (alternatives followed side by side, json_set.c), $ref to #, #/$defs/ or
 * #/definitions/. Objects are written with their listed properties only (any order, no
 * duplicates), which is valid whatever additionalProperties says. Keywords outside the subset
 * fail a strict schema with the reason; a non-strict one ignores them and lists them in
 * s->ignored (they are not enforced). */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema.h"

typedef struct {
    js_schema *s;
    const cJSON *doc;
    int strict, failed;
    char *err;
    size_t errsz;
    /* $ref targets: path -> node, compiled once (so recursion closes on itself) */
    char **ref_path;
    js_node **ref_node;
    int n_refs;
} cctx;

static int fail(cctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(cctx *c, const char *fmt, ...) {
    if (!c->failed && c->err && c->errsz) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errsz, fmt, ap);
        va_end(ap);
        /* names from the schema may hold control bytes: the error stays one line */
        for (char *p = c->err; *p; p++)
            if ((unsigned char)*p < 0x20) *p = ' ';
    }
    c->failed = 1;
    return -1;
}

static js_node *new_node(cctx *c, int kind) {
    js_schema *s = c->s;
    if (s->n_all == s->cap_all) {
        int cap = s->cap_all ? 2 * s->cap_all : 16;
        js_node **a = realloc(s->all, sizeof *a * (size_t)cap);
        if (!a) return fail(c, "out of memory"), NULL;
        s->all = a;
        s->cap_all = cap;
    }
    js_node *n = calloc(1, sizeof *n);
    if (!n) return fail(c, "out of memory"), NULL;
    n->kind = kind;
    n->max_items = n->max_len = -1;
    s->all[s->n_all++] = n;
    return n;
}

void js_free(js_schema *s) {
    if (!s) return;
    for (int i = 0; i < s->n_all; i++) {
        js_node *n = s->all[i];
        for (int k = 0; k < n->n_props; k++) free(n->keys[k]);
        for (int k = 0; k < n->n_lits; k++) free(n->lits[k]);
        free(n->keys);
        free(n->key_len);
        free(n->props);
        free(n->lits);
        free(n->lit_len);
        free(n->alts);
        js_pat_free(n);
        free(n);
    }
    free(s->all);
    free(s);
}

static int compile_into(cctx *c, js_node *n, const cJSON *j, int depth);

static js_node *compile(cctx *c, const cJSON *j, int depth) {
    js_node *n = new_node(c, JS_ANY);
    if (n && compile_into(c, n, j, depth)) return NULL;
    return n;
}

/* "#", "#/$defs/NAME" or "#/definitions/NAME" (NAME with ~0 / ~1 escapes) */
static const cJSON *resolve(cctx *c, const char *ref) {
    if (!strcmp(ref, "#")) return c->doc;
    const char *name = NULL, *group = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) group = "$defs", name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) group = "definitions", name = ref + 14;
    if (!name || !*name || strchr(name, '/')) return NULL;
    char key[256];
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof key; p++) {
        if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
            key[k++] = p[1] == '0' ? '~' : '/';
            p++;
        } else key[k++] = *p;
    }
    key[k] = 0;
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->doc, group), key);
}

static js_node *compile_ref(cctx *c, const char *ref, int depth) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->ref_path[i], ref)) return c->ref_node[i];
    const cJSON *t = resolve(c, ref);
    if (!t) return fail(c, "$ref \"%.80s\" does not name a schema in #/$defs or #/definitions", ref), NULL;
    char **p = realloc(c->ref_path, sizeof *p * (size_t)(c->n_refs + 1));
    if (p) c->ref_path = p;
    js_node **q = realloc(c->ref_node, sizeof *q * (size_t)(c->n_refs + 1));
    if (q) c->ref_node = q;
    js_node *n = p && q ? new_node(c, JS_ANY) : NULL;
    char *dup = n ? strdup(ref) : NULL;
    if (!dup) return fail(c, "out of memory"), NULL;
    c->ref_path[c->n_refs] = dup;
    c->ref_node[c->n_refs++] = n;
    return compile_into(c, n, t, depth) ? NULL : n;
}

/* Keywords that only annotate, and those the subset enforces. */
static int known_keyword(const char *k) {
    static const char *ok[] = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
                               "minItems", "maxItems", "minLength", "maxLength", "anyOf", "oneOf", "$ref", "$defs",
                               "definitions", "title", "description", "default", "examples", "$schema", "$id",
                               "$comment", "strict", "name", "deprecated", "readOnly", "writeOnly", "pattern",
                               "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (!strcmp(k, ok[i])) return 1;
    return 0;
}

/* Why a strict schema refuses a keyword: OpenAI's strict mode refuses these too. */
static const char *refusal(const char *k) {
    static const struct { const char *kw, *why; } r[] = {
        {"allOf", "composition other than anyOf"}, {"not", "composition other than anyOf"},
        {"if", "conditional schemas"}, {"then", "conditional schemas"}, {"else", "conditional schemas"},
        {"dependentRequired", "conditional schemas"}, {"dependentSchemas", "conditional schemas"},
        {"patternProperties", "keys other than the listed properties"},
        {"propertyNames", "keys other than the listed properties"},
        {"unevaluatedProperties", "keys other than the listed properties"},
        {"minProperties", "object size limits"}, {"maxProperties", "object size limits"},
        {"uniqueItems", "comparing array items"}, {"contains", "comparing array items"},
        {"minContains", "comparing array items"}, {"maxContains", "comparing array items"},
        {"unevaluatedItems", "tuple arrays"}, {"prefixItems", "tuple arrays"},
        {"contentEncoding", "content keywords"}, {"contentMediaType", "content keywords"}};
    for (size_t i = 0; i < sizeof r / sizeof *r; i++)
        if (!strcmp(k, r[i].kw)) return r[i].why;
    return NULL;
}

static void note_ignored(cctx *c, const char *name) {
    char kw[64], *ig = c->s->ignored;
    snprintf(kw, sizeof kw, "%s", name);
    for (char *p = kw; *p; p++) /* the list stays one line, its commas separators */
        if ((unsigned char)*p < 0x20 || *p == ',') *p = '?';
    if (!kw[0]) snprintf(kw, sizeof kw, "\"\""); /* an empty key, named so */
    size_t n = strlen(ig), k = strlen(kw);
    for (const char *p = ig; (p = strstr(p, kw)); p += k) /* listed once */
        if ((p == ig || p[-1] == ',') && (p[k] == ',' || !p[k])) return;
    if (n + k + 2 < sizeof c->s->ignored) snprintf(ig + n, sizeof c->s->ignored - n, "%s%s", n ? "," : "", kw);
}

static int get_count(cctx *c, const cJSON *j, const char *key, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (double)(long)v->valuedouble)
        return fail(c, "'%s' must be a non-negative integer", key);
    *out = (long)v->valuedouble;
    return 0;
}

static int add_literal(cctx *c, js_node *n, const cJSON *v) {
    if (n->n_lits >= JS_MAX_LITS) return fail(c, "an enum has more than %d values", JS_MAX_LITS);
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return fail(c, "out of memory");
    char **l = realloc(n->lits, sizeof *l * (size_t)(n->n_lits + 1));
    if (l) n->lits = l;
    size_t *ll = realloc(n->lit_len, sizeof *ll * (size_t)(n->n_lits + 1));
    if (ll) n->lit_len = ll;
    if (!l || !ll) {
        free(t);
        return fail(c, "out of memory");
    }
    n->lits[n->n_lits] = t;
    n->lit_len[n->n_lits++] = strlen(t);
    return 0;
}

static int type_kind(const char *t) {
    static const struct { const char *name; int kind; } k[] = {
        {"object", JS_OBJECT}, {"array", JS_ARRAY}, {"string", JS_STRING}, {"number", JS_NUMBER},
        {"integer", JS_INTEGER}, {"boolean", JS_BOOLEAN}, {"null", JS_NULL}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!strcmp(t, k[i].name)) return k[i].kind;
    return -1;
}

static int compile_object(cctx *c, js_node *n, const cJSON *j, int depth) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(j, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(j, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(j, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, "'properties' must be an object");
    int np = props ? cJSON_GetArraySize(props) : 0;
    if (np > JS_MAX_PROPS) return fail(c, "an object lists %d properties; at most %d are supported", np, JS_MAX_PROPS);
    if (np) {
        n->keys = calloc((size_t)np, sizeof *n->keys);
        n->key_len = calloc((size_t)np, sizeof *n->key_len);
        n->props = calloc((size_t)np, sizeof *n->props);
        if (!n->keys || !n->key_len || !n->props) return fail(c, "out of memory");
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            cJSON *k = cJSON_CreateString(p->string);
            char *t = k ? cJSON_PrintUnformatted(k) : NULL;
            cJSON_Delete(k);
            if (!t) return fail(c, "out of memory");
            for (int i = 0; i < n->n_props; i++)
                if (!strcmp(n->keys[i], t)) {
                    free(t);
                    return fail(c, "property \"%.60s\" is listed twice", p->string);
                }
            n->keys[n->n_props] = t;
            n->key_len[n->n_props++] = strlen(t);
            if (!(n->props[n->n_props - 1] = compile(c, p, depth + 1))) return -1;
        }
    }
    if (req) {
        if (!cJSON_IsArray(req)) return fail(c, "'required' must be an array of property names");
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_IsString(r)) return fail(c, "'required' must be an array of property names");
            int found = -1;
            const cJSON *p;
            int i = 0;
            cJSON_ArrayForEach(p, props) {
                if (props && !strcmp(p->string, r->valuestring)) found = i;
                i++;
            }
            if (found < 0) return fail(c, "required property \"%.60s\" is not in 'properties'", r->valuestring);
            n->required |= 1ull << found;
        }
    }
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add)) return fail(c, "'additionalProperties' must be a boolean or a schema");
    if (!np && !cJSON_IsFalse(add)) {
        n->free_keys = 1;
        if (cJSON_IsObject(add) && !(n->extra = compile(c, add, depth + 1))) return -1;
    }
    return 0;
}

static int compile_typed(cctx *c, js_node *n, const cJSON *j, int kind, int depth) {
    n->kind = kind;
    if (kind == JS_OBJECT) return compile_object(c, n, j, depth);
    if (kind == JS_ARRAY) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, "items");
        if (it && !cJSON_IsTrue(it) && !(n->items = compile(c, it, depth + 1))) return -1;
        if (get_count(c, j, "minItems", &n->min_items) || get_count(c, j, "maxItems", &n->max_items)) return -1;
        if (n->max_items >= 0 && n->max_items < n->min_items) return fail(c, "'maxItems' is below 'minItems'");
    }
    if (kind == JS_STRING) {
        if (get_count(c, j, "minLength", &n->min_len) || get_count(c, j, "maxLength", &n->max_len)) return -1;
        if (n->max_len >= 0 && n->max_len < n->min_len) return fail(c, "'maxLength' is below 'minLength'");
        char e[200] = "";
        if (js_pat_compile(n, j, c->strict, e, sizeof e, c->s->ignored, sizeof c->s->ignored)) return fail(c, "%s", e);
    }
    if (kind == JS_NUMBER || kind == JS_INTEGER) {
        char e[200] = "";
        if (js_num_compile(n, j, e, sizeof e)) return fail(c, "%s", e);
    }
    return 0;
}

static int compile_into(cctx *c, js_node *n, const cJSON *j, int depth) {
    if (depth > 64) return fail(c, "the schema nests deeper than 64 levels");
    if (cJSON_IsTrue(j)) return 0; /* any value */
    if (!cJSON_IsObject(j)) return fail(c, "a schema must be an object (or true)");
    const cJSON *k;
    cJSON_ArrayForEach(k, j) {
        if (known_keyword(k->string)) continue;
        const char *why = refusal(k->string);
        if (c->strict && why)
            return fail(c, "keyword '%.60s' is not supported in a strict schema (%s: OpenAI's strict mode refuses it too)",
                        k->string, why);
        if (c->strict) return fail(c, "keyword '%.60s' is not supported in a strict schema", k->string);
        note_ignored(c, k->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(j, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, "'$ref' must be a string");
        js_node *t = compile_ref(c, ref->valuestring, depth + 1);
        if (!t) return -1;
        /* an alias: a one-way anyOf, resolved at match time */
        n->kind = JS_ANYOF;
        n->alts = malloc(sizeof *n->alts);
        if (!n->alts) return fail(c, "out of memory");
        n->alts[0] = t;
        n->n_alts = 1;
        return 0;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(j, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(j, "const");
    if (en || cn) {
        n->kind = JS_LITERAL;
        if (cn) return add_literal(c, n, cn);
        if (!cJSON_IsArray(en) || !cJSON_GetArraySize(en)) return fail(c, "'enum' must be a non-empty array");
        const cJSON *v;
        cJSON_ArrayForEach(v, en) if (add_literal(c, n, v)) return -1;
        return 0;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(j, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(j, "oneOf");
    if (any) {
        int na = cJSON_GetArraySize(any);
        if (!cJSON_IsArray(any) || na <= 0) return fail(c, "'anyOf' must be a non-empty array of schemas");
        n->kind = JS_ANYOF;
        if (!(n->alts = calloc((size_t)na, sizeof *n->alts))) return fail(c, "out of memory");
        const cJSON *a;
        cJSON_ArrayForEach(a, any) {
            if (!(n->alts[n->n_alts++] = compile(c, a, depth + 1))) return -1;
        }
        return 0;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!ty) /* no type: an object when it lists properties, else any value */
        return cJSON_GetObjectItemCaseSensitive(j, "properties") ? compile_typed(c, n, j, JS_OBJECT, depth) : 0;
    if (cJSON_IsString(ty)) {
        int kind = type_kind(ty->valuestring);
        if (kind < 0) return fail(c, "type \"%.40s\" is not a JSON schema type", ty->valuestring);
        return compile_typed(c, n, j, kind, depth);
    }
    if (!cJSON_IsArray(ty) || !cJSON_GetArraySize(ty)) return fail(c, "'type' must be a type name or an array of them");
    n->kind = JS_ANYOF;
    if (!(n->alts = calloc((size_t)cJSON_GetArraySize(ty), sizeof *n->alts))) return fail(c, "out of memory");
    const cJSON *t;
    cJSON_ArrayForEach(t, ty) {
        int kind = cJSON_IsString(t) ? type_kind(t->valuestring) : -1;
        if (kind < 0) return fail(c, "'type' lists something that is not a JSON schema type");
        js_node *a = new_node(c, kind);
        if (!a || compile_typed(c, a, j, kind, depth + 1)) return -1;
        n->alts[n->n_alts++] = a;
    }
    return 0;
}

/* A chain of $ref aliases that leads back to itself has no value. */
static int check_aliases(cctx *c) {
    for (int i = 0; i < c->s->n_all; i++) {
        const js_node *n = c->s->all[i];
        for (int hops = 0; n->kind == JS_ANYOF && n->n_alts == 1; hops++) {
            if (hops > c->s->n_all) return fail(c, "a $ref refers to itself without a value in between");
            n = n->alts[0];
        }
    }
    return 0;
}

js_schema *js_compile(const char *schema, size_t len, char *err, size_t errsz, int strict) {
    if (err && errsz) err[0] = 0;
    cctx c = {.strict = strict, .err = err, .errsz = errsz};
    if (!(c.s = calloc(1, sizeof *c.s))) {
        fail(&c, "out of memory");
        return NULL;
    }
    cJSON *doc = NULL;
    if (!schema || !len) { /* json_object: any object */
        if ((c.s->root = new_node(&c, JS_OBJECT))) c.s->root->free_keys = 1;
    } else if (!(doc = cJSON_ParseWithLength(schema, len))) {
        fail(&c, "the schema is not valid JSON");
    } else {
        c.doc = doc;
        /* the root is registered as "#" so that a recursive schema refers back to it */
        js_node *root = new_node(&c, JS_ANY);
        c.ref_path = malloc(sizeof *c.ref_path);
        c.ref_node = malloc(sizeof *c.ref_node);
        if (root && c.ref_path && c.ref_node && (c.ref_path[0] = strdup("#"))) {
            c.ref_node[0] = root;
            c.n_refs = 1;
            if (!compile_into(&c, root, doc, 0)) c.s->root = root;
        } else fail(&c, "out of memory");
    }
    if (!c.failed) check_aliases(&c);
    for (int i = 0; i < c.n_refs; i++) free(c.ref_path[i]);
    free(c.ref_path);
    free(c.ref_node);
    cJSON_Delete(doc);
    if (c.failed || !c.s->root) {
        js_free(c.s);
        return NULL;
    }
    return c.s;
}
