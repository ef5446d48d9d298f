/* Normalizers and pre-tokenizers of tokenizer.json: parsed into flat step lists
 * (a Sequence is just its members in order) and run on one text segment at a
 * time. Only the text matters here; HF's offset bookkeeping is not needed. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "util.h"

/* GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Whitespace pre-tokenizer: words and runs of other non-space characters. */
static const char WORDS_RE[] = "\\w+|[^\\w\\s]+";
/* Unicode punctuation plus ASCII symbols (Rust is_ascii_punctuation || is_punctuation). */
static const char PUNCT_RE[] = "[\\p{P}!-/:-@\\[-`{-~]";
static const char METASPACE[] = "\xe2\x96\x81"; /* U+2581 */

void tk_steps_free(tk_steps *st) {
    for (int i = 0; i < st->n; i++) {
        free(st->s[i].str);
        free(st->s[i].content);
        pcre2_code_free(st->s[i].re);
    }
    free(st->s);
    memset(st, 0, sizeof *st);
}

tk_step *tk_steps_add(tk_steps *st, int type) {
    if (st->n == st->cap) {
        int cap = st->cap ? st->cap * 2 : 8;
        tk_step *s = realloc(st->s, (size_t)cap * sizeof *s);
        if (!s) return NULL;
        st->s = s;
        st->cap = cap;
    }
    tk_step *s = &st->s[st->n++];
    memset(s, 0, sizeof *s);
    s->type = type;
    return s;
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *key, int dflt) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

static kvq_status set_str(const char *v, char **dst, size_t *len, const char *file) {
    *dst = strdup(v);
    *len = strlen(v);
    return *dst ? KVQ_OK : kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
}

/* {"String": "..."} is a literal, {"Regex": "..."} a regex (tokenizers' Pattern). */
static kvq_status set_pattern(tk_step *s, const cJSON *o, const char *what, const char *file) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *lit = jstr(p, "String"), *re = jstr(p, "Regex");
    if (lit) return set_str(lit, &s->str, &s->str_len, file);
    if (re) return (s->re = tk_regex_compile(re, strlen(re), file)) ? KVQ_OK : KVQ_ERR_UNSUPPORTED;
    return kvq_fail(KVQ_ERR_FORMAT, "%s: %s has no String or Regex pattern", file, what);
}

static kvq_status set_regex(tk_step *s, const char *re, const char *file) {
    return (s->re = tk_regex_compile(re, strlen(re), file)) ? KVQ_OK : KVQ_ERR_UNSUPPORTED;
}

static kvq_status need_type(const cJSON *j, const char *what, const char *file, const char **type) {
    *type = jstr(j, "type");
    if (!*type) return kvq_fail(KVQ_ERR_FORMAT, "%s: %s without a type", file, what);
    return KVQ_OK;
}

kvq_status tk_parse_normalizer(const cJSON *j, const char *file, tk_steps *st) {
    if (!j || cJSON_IsNull(j)) return KVQ_OK;
    const char *ty;
    kvq_status rc = need_type(j, "normalizer", file, &ty);
    if (rc) return rc;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(list)) return kvq_fail(KVQ_ERR_FORMAT, "%s: Sequence normalizer without a list", file);
        for (const cJSON *e = list->child; e; e = e->next)
            if ((rc = tk_parse_normalizer(e, file, st))) return rc;
        return KVQ_OK;
    }
    if (!strcmp(ty, "Precompiled")) {
        /* an empty charsmap is the identity; a real one is a SentencePiece table we do not run */
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "precompiled_charsmap");
        if (!m || cJSON_IsNull(m) || (cJSON_IsString(m) && !m->valuestring[0])) return KVQ_OK;
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: Precompiled normalizer is not supported", file);
    }
    static const struct { const char *name; int type; } simple[] = {
        {"NFC", TK_N_NFC}, {"NFD", TK_N_NFD}, {"NFKC", TK_N_NFKC}, {"NFKD", TK_N_NFKD},
        {"Lowercase", TK_N_LOWER}, {"StripAccents", TK_N_STRIP_ACCENTS}, {"Strip", TK_N_STRIP},
        {"Replace", TK_N_REPLACE}, {"Prepend", TK_N_PREPEND},
    };
    for (size_t i = 0; i < sizeof simple / sizeof *simple; i++) {
        if (strcmp(ty, simple[i].name)) continue;
        tk_step *s = tk_steps_add(st, simple[i].type);
        if (!s) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
        if (s->type == TK_N_STRIP) {
            s->flag_a = jbool(j, "strip_left", 1);
            s->flag_b = jbool(j, "strip_right", 1);
        } else if (s->type == TK_N_REPLACE) {
            const char *c = jstr(j, "content");
            if (!c) return kvq_fail(KVQ_ERR_FORMAT, "%s: Replace normalizer without content", file);
            if ((rc = set_pattern(s, j, "Replace normalizer", file))) return rc;
            return set_str(c, &s->content, &s->content_len, file);
        } else if (s->type == TK_N_PREPEND) {
            const char *p = jstr(j, "prepend");
            if (!p) return kvq_fail(KVQ_ERR_FORMAT, "%s: Prepend normalizer without prepend", file);
            return set_str(p, &s->str, &s->str_len, file);
        }
        return KVQ_OK;
    }
    return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: normalizer type \"%.60s\" is not supported", file, ty);
}

static int parse_behavior(const char *b) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (b && !strcmp(b, names[i])) return i;
    return -1;
}

/* Adds a regex split step (for the pre-tokenizers that are fixed regex splits). */
static kvq_status add_split(tk_steps *st, const char *re, int behavior, int invert, const char *file) {
    tk_step *s = tk_steps_add(st, TK_P_SPLIT);
    if (!s) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
    s->behavior = behavior;
    s->invert = invert;
    return set_regex(s, re, file);
}

kvq_status tk_parse_pretokenizer(const cJSON *j, const char *file, tk_steps *st) {
    if (!j || cJSON_IsNull(j)) return KVQ_OK;
    const char *ty;
    kvq_status rc = need_type(j, "pre_tokenizer", file, &ty);
    if (rc) return rc;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(list)) return kvq_fail(KVQ_ERR_FORMAT, "%s: Sequence pre_tokenizer without a list", file);
        for (const cJSON *e = list->child; e; e = e->next)
            if ((rc = tk_parse_pretokenizer(e, file, st))) return rc;
        return KVQ_OK;
    }
    if (!strcmp(ty, "Split")) {
        tk_step *s = tk_steps_add(st, TK_P_SPLIT);
        if (!s) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
        s->behavior = parse_behavior(jstr(j, "behavior"));
        if (s->behavior < 0) return kvq_fail(KVQ_ERR_FORMAT, "%s: Split pre_tokenizer has no valid behavior", file);
        s->invert = jbool(j, "invert", 0);
        return set_pattern(s, j, "Split pre_tokenizer", file);
    }
    if (!strcmp(ty, "ByteLevel")) {
        tk_step *s = tk_steps_add(st, TK_P_BYTELEVEL);
        if (!s) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
        s->flag_a = jbool(j, "add_prefix_space", 1);
        return jbool(j, "use_regex", 1) ? set_regex(s, GPT2_RE, file) : KVQ_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        tk_step *s = tk_steps_add(st, TK_P_METASPACE);
        if (!s) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
        const char *rep = jstr(j, "replacement"), *scheme = jstr(j, "prepend_scheme");
        if ((rc = set_str(rep && *rep ? rep : METASPACE, &s->str, &s->str_len, file))) return rc;
        /* older files say add_prefix_space instead of prepend_scheme */
        s->flag_a = jbool(j, "add_prefix_space", 1) ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        if (scheme && !strcmp(scheme, "first")) s->flag_a = TK_PREPEND_FIRST;
        else if (scheme && !strcmp(scheme, "never")) s->flag_a = TK_PREPEND_NEVER;
        else if (scheme && !strcmp(scheme, "always")) s->flag_a = TK_PREPEND_ALWAYS;
        else if (scheme) return kvq_fail(KVQ_ERR_FORMAT, "%s: unknown Metaspace prepend_scheme \"%.20s\"", file, scheme);
        s->flag_b = jbool(j, "split", 1);
        return KVQ_OK;
    }
    if (!strcmp(ty, "Whitespace")) return add_split(st, WORDS_RE, TK_SPLIT_REMOVED, 1, file);
    if (!strcmp(ty, "WhitespaceSplit")) return add_split(st, "\\s+", TK_SPLIT_REMOVED, 0, file);
    if (!strcmp(ty, "Digits"))
        return add_split(st, "\\p{N}", jbool(j, "individual_digits", 0) ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS, 0,
                         file);
    if (!strcmp(ty, "Punctuation")) {
        const char *b = jstr(j, "behavior");
        int beh = b ? parse_behavior(b) : TK_SPLIT_ISOLATED;
        if (beh < 0) return kvq_fail(KVQ_ERR_FORMAT, "%s: Punctuation pre_tokenizer has no valid behavior", file);
        return add_split(st, PUNCT_RE, beh, 0, file);
    }
    if (!strcmp(ty, "BertPreTokenizer")) {
        if ((rc = add_split(st, "\\s+", TK_SPLIT_REMOVED, 0, file))) return rc;
        return add_split(st, PUNCT_RE, TK_SPLIT_ISOLATED, 0, file);
    }
    if (!strcmp(ty, "CharDelimiterSplit")) {
        const char *d = jstr(j, "delimiter");
        if (!d || !*d) return kvq_fail(KVQ_ERR_FORMAT, "%s: CharDelimiterSplit without a delimiter", file);
        tk_step *s = tk_steps_add(st, TK_P_SPLIT);
        if (!s) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", file);
        s->behavior = TK_SPLIT_REMOVED;
        return set_str(d, &s->str, &s->str_len, file);
    }
    return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%.60s\" is not supported", file, ty);
}

/* ---- running them ------------------------------------------------------------------- */

int tk_pieces_add(tk_pieces *ps, const char *s, size_t n, int first) {
    if (!n) return 0; /* HF drops empty pieces */
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 64;
        tk_piece *p = realloc(ps->p, cap * sizeof *p);
        if (!p) return tk_nomem();
        ps->p = p;
        ps->cap = cap;
    }
    size_t off = ps->text.len;
    if (tk_buf_put(&ps->text, s, n)) return -1;
    ps->p[ps->n++] = (tk_piece){off, n, first};
    return 0;
}

void tk_pieces_free(tk_pieces *ps) {
    tk_buf_free(&ps->text);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

void tk_pre_scratch_free(tk_pre_scratch *sc) {
    tk_buf_free(&sc->a);
    tk_buf_free(&sc->b);
    tk_buf_free(&sc->t1);
    tk_buf_free(&sc->t2);
    tk_pieces_free(&sc->pa);
    tk_pieces_free(&sc->pb);
    free(sc->spans.se);
    free(sc->rg);
    pcre2_match_data_free(sc->md);
    memset(sc, 0, sizeof *sc);
}

static int ensure_md(tk_pre_scratch *sc) {
    if (!sc->md) sc->md = pcre2_match_data_create(1, NULL);
    return sc->md ? 0 : tk_nomem();
}

static int find(const tk_step *st, const char *lit, size_t litlen, const char *s, size_t n, tk_pre_scratch *sc) {
    if (st->re && ensure_md(sc)) return -1;
    return tk_find_all(st->re, lit, litlen, s, n, sc->md, &sc->spans);
}

/* Applies one normalizer step: s -> out. */
static int norm_step(const tk_step *st, const char *s, size_t n, tk_buf *out, tk_pre_scratch *sc) {
    out->len = 0;
    if (tk_buf_reserve(out, n)) return -1;
    out->p[0] = 0;
    switch (st->type) {
    case TK_N_NFC: case TK_N_NFD: case TK_N_NFKC: case TK_N_NFKD: {
        int opt = UTF8PROC_STABLE | (st->type == TK_N_NFC || st->type == TK_N_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                  (st->type >= TK_N_NFKC ? UTF8PROC_COMPAT : 0);
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = n ? utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt) : 0;
        if (r == UTF8PROC_ERROR_NOMEM) return tk_nomem();
        int rc = r < 0 ? tk_buf_put(out, s, n) /* invalid UTF-8: leave as is */ : tk_buf_put(out, dst, (size_t)r);
        free(dst);
        return rc;
    }
    case TK_N_LOWER: case TK_N_STRIP_ACCENTS:
        for (size_t i = 0; i < n;) {
            size_t adv;
            int32_t cp = tk_utf8_decode(s + i, n - i, &adv);
            if (cp < 0) {
                if (tk_buf_put(out, s + i, adv)) return -1;
            } else if (st->type == TK_N_LOWER) {
                char u[4];
                if (tk_buf_put(out, u, (size_t)tk_utf8_encode(utf8proc_tolower(cp), u))) return -1;
            } else if (utf8proc_category(cp) != UTF8PROC_CATEGORY_MN && tk_buf_put(out, s + i, adv)) {
                return -1;
            }
            i += adv;
        }
        return 0;
    case TK_N_STRIP: {
        size_t a = 0, b = n, adv;
        while (st->flag_a && a < b && tk_is_space(tk_utf8_decode(s + a, b - a, &adv))) a += adv;
        while (st->flag_b && b > a) {
            size_t k = b - 1;
            while (k > a && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
            if (!tk_is_space(tk_utf8_decode(s + k, b - k, &adv)) || k + adv != b) break;
            b = k;
        }
        return tk_buf_put(out, s + a, b - a);
    }
    case TK_N_REPLACE: {
        if (find(st, st->str, st->str_len, s, n, sc)) return -1;
        size_t prev = 0;
        for (size_t k = 0; k < sc->spans.n; k++) {
            size_t a = sc->spans.se[2 * k], b = sc->spans.se[2 * k + 1];
            if (tk_buf_put(out, s + prev, a - prev) || tk_buf_put(out, st->content, st->content_len)) return -1;
            prev = b;
        }
        return tk_buf_put(out, s + prev, n - prev);
    }
    case TK_N_PREPEND:
        if (n && tk_buf_put(out, st->str, st->str_len)) return -1;
        return tk_buf_put(out, s, n);
    }
    return tk_buf_put(out, s, n);
}

int tk_normalize(const kvq_tokenizer *t, const char *s, size_t n, tk_pre_scratch *sc, tk_buf **out) {
    tk_buf *cur = &sc->a, *nxt = &sc->b;
    cur->len = 0;
    if (tk_buf_put(cur, s, n)) return -1;
    for (int i = 0; i < t->norm.n; i++) {
        if (norm_step(&t->norm.s[i], cur->p, cur->len, nxt, sc)) return -1;
        tk_buf *x = cur;
        cur = nxt;
        nxt = x;
    }
    *out = cur;
    return 0;
}

static void range_add(tk_range *r, size_t *n, size_t a, size_t b, int match) {
    r[*n] = (tk_range){a, b, match};
    ++*n;
}

/* Cuts s into pieces at the match spans in sc->spans, per HF's SplitDelimiterBehavior. */
static int split_by_spans(const char *s, size_t n, int first, int behavior, int invert, tk_pre_scratch *sc,
                          tk_pieces *out) {
    /* the gaps and matches covering s, in order; match flags after invert */
    size_t need = 2 * sc->spans.n + 1, nr = 0, prev = 0;
    if (need > sc->rg_cap) {
        tk_range *r = realloc(sc->rg, need * sizeof *r);
        if (!r) return tk_nomem();
        sc->rg = r;
        sc->rg_cap = need;
    }
    tk_range *r = sc->rg;
    for (size_t k = 0; k <= sc->spans.n; k++) {
        size_t a = k < sc->spans.n ? sc->spans.se[2 * k] : n, b = k < sc->spans.n ? sc->spans.se[2 * k + 1] : n;
        if (a > prev) range_add(r, &nr, prev, a, invert);
        if (b > a) range_add(r, &nr, a, b, !invert);
        prev = b;
    }
    /* merge neighbours in place; .match then means "drop" (Removed only) */
    size_t lo = 0, hi = 0;
    if (behavior == TK_SPLIT_MERGED_NEXT) {
        /* backwards: a match joins the range after it unless that one is a match too */
        int prev_match = 0;
        lo = hi = nr;
        for (size_t i = nr; i-- > 0;) {
            int m = r[i].match;
            if (m && !prev_match && lo < nr) r[lo].a = r[i].a;
            else r[--lo] = (tk_range){r[i].a, r[i].b, 0};
            prev_match = m;
        }
    } else {
        int prev_match = 0;
        for (size_t i = 0; i < nr; i++) {
            int m = r[i].match, join = 0;
            if (behavior == TK_SPLIT_CONTIGUOUS) join = hi > 0 && m == prev_match;
            if (behavior == TK_SPLIT_MERGED_PREV) join = hi > 0 && m && !prev_match;
            if (join) r[hi - 1].b = r[i].b;
            else r[hi++] = (tk_range){r[i].a, r[i].b, behavior == TK_SPLIT_REMOVED && m};
            prev_match = m;
        }
    }
    for (size_t i = lo; i < hi; i++)
        if (!r[i].match && tk_pieces_add(out, s + r[i].a, r[i].b - r[i].a, first && r[i].a == 0)) return -1;
    return 0;
}

/* Adds s re-spelled in the byte-level alphabet (each byte one code point). */
static int add_bytelevel(const kvq_tokenizer *t, const char *s, size_t n, int first, tk_buf *m, tk_pieces *out) {
    m->len = 0;
    if (tk_buf_reserve(m, 2 * n)) return -1;
    for (size_t i = 0; i < n; i++) m->len += (size_t)tk_utf8_encode(t->byte_cp[(uint8_t)s[i]], m->p + m->len);
    return tk_pieces_add(out, m->p, m->len, first);
}

static int pretok_step(const kvq_tokenizer *t, const tk_step *st, const char *s, size_t n, int first,
                       tk_pre_scratch *sc, tk_pieces *out) {
    if (st->type == TK_P_SPLIT) {
        if (find(st, st->str, st->str_len, s, n, sc)) return -1;
        return split_by_spans(s, n, first, st->behavior, st->invert, sc, out);
    }
    tk_buf *tmp = &sc->t1;
    tmp->len = 0;
    if (st->type == TK_P_BYTELEVEL) {
        if (st->flag_a && (!n || s[0] != ' ') && tk_buf_put(tmp, " ", 1)) return -1;
        if (tk_buf_put(tmp, s, n)) return -1;
        if (!st->re) return add_bytelevel(t, tmp->p, tmp->len, first, &sc->t2, out);
        if (find(st, NULL, 0, tmp->p, tmp->len, sc)) return -1;
        size_t prev = 0; /* Isolated: the gaps between matches are pieces too */
        for (size_t k = 0; k < sc->spans.n; k++) {
            size_t a = sc->spans.se[2 * k], b = sc->spans.se[2 * k + 1];
            if ((a > prev && add_bytelevel(t, tmp->p + prev, a - prev, first && prev == 0, &sc->t2, out)) ||
                add_bytelevel(t, tmp->p + a, b - a, first && a == 0, &sc->t2, out))
                return -1;
            prev = b;
        }
        return add_bytelevel(t, tmp->p + prev, tmp->len - prev, first && prev == 0, &sc->t2, out);
    }
    /* Metaspace: spaces become the replacement, which may be prepended and split on */
    size_t prev = 0;
    for (const char *sp; (sp = memchr(s + prev, ' ', n - prev)); prev = (size_t)(sp - s) + 1)
        if (tk_buf_put(tmp, s + prev, (size_t)(sp - s) - prev) || tk_buf_put(tmp, st->str, st->str_len)) return -1;
    if (tk_buf_put(tmp, s + prev, n - prev)) return -1;
    int starts = tmp->len >= st->str_len && !memcmp(tmp->p, st->str, st->str_len);
    if (!starts && (st->flag_a == TK_PREPEND_ALWAYS || (st->flag_a == TK_PREPEND_FIRST && first))) {
        tk_buf *b = &sc->t2;
        b->len = 0;
        if (tk_buf_put(b, st->str, st->str_len) || tk_buf_put(b, tmp->p, tmp->len)) return -1;
        tmp = b;
    }
    if (!st->flag_b) return tk_pieces_add(out, tmp->p, tmp->len, first);
    if (tk_find_all(NULL, st->str, st->str_len, tmp->p, tmp->len, NULL, &sc->spans)) return -1;
    return split_by_spans(tmp->p, tmp->len, first, TK_SPLIT_MERGED_NEXT, 0, sc, out);
}

int tk_pretokenize(const kvq_tokenizer *t, const char *s, size_t n, int first, tk_pre_scratch *sc,
                   tk_pieces **res) {
    tk_pieces *cur = &sc->pa, *nxt = &sc->pb;
    cur->n = cur->text.len = 0;
    if (tk_pieces_add(cur, s, n, first)) return -1;
    for (int i = 0; i < t->pretok.n; i++) {
        nxt->n = nxt->text.len = 0;
        for (size_t k = 0; k < cur->n; k++) {
            tk_piece p = cur->p[k];
            if (pretok_step(t, &t->pretok.s[i], cur->text.p + p.off, p.len, p.first, sc, nxt)) return -1;
        }
        tk_pieces *x = cur;
        cur = nxt;
        nxt = x;
    }
    *res = cur;
    return 0;
}
