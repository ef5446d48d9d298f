/* String keywords checked by PCRE2: `pattern`, and `format` through built-in patterns. The
 * matcher keeps the string's decoded text (escapes resolved) and asks PCRE2 after each whole
 * character whether the text can still grow into a match (PCRE2_PARTIAL_HARD: a complete or a
 * partial match both say yes), and at the closing quote whether it matches.
 * A pattern is tried from the string's start only (PCRE2_ANCHORED): a value matching there
 * matches the unanchored pattern too, and the model gets guidance from its first character.
 * The formats are narrower than RFC 3339 / 5321 / 1123 / 4291 allow (no leap seconds, no
 * February 29th, ASCII e-mail, IPv6 without embedded IPv4), so every value written is valid. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "grammar/json_schema.h"

#define D2 "[0-9]{2}"
#define MONTH_DAY "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
#define DATE "[0-9]{4}-" MONTH_DAY
#define TIME "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define N "[0-9]{1,4}"
#define DUR_DATE "(?:" N "Y(?:" N "M)?(?:" N "D)?|" N "M(?:" N "D)?|" N "D)"
#define DUR_TIME "T(?:" N "H(?:" N "M)?(?:" N "S)?|" N "M(?:" N "S)?|" N "S)"
#define LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?"
#define OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define H4 "[0-9a-f]{1,4}"
#define HEX(k) "[0-9a-f]{" #k "}"

static const struct { const char *name, *re; } FORMATS[] = {
    {"date", "^" DATE "$"},
    {"time", "^" TIME "$"},
    {"date-time", "^" DATE "T" TIME "$"},
    {"duration", "^P(?:" DUR_DATE "(?:" DUR_TIME ")?|" DUR_TIME "|" N "W)$"},
    {"email", "^[A-Za-z0-9_+-]{1,32}(?:\\.[A-Za-z0-9_+-]{1,32}){0,3}@" LABEL "(?:\\." LABEL "){0,3}\\.[A-Za-z]{2,12}$"},
    {"hostname", "^" LABEL "(?:\\." LABEL "){0,5}$"},
    {"ipv4", "^" OCTET "(?:\\." OCTET "){3}$"},
    {"ipv6", "^(?:(?:" H4 ":){7}" H4 "|(?:" H4 ":){1,6}:" H4 "|::" H4 "|::)$"},
    {"uuid", "^" HEX(8) "-" HEX(4) "-" HEX(4) "-" HEX(4) "-" HEX(12) "$"},
};

static pcre2_code *compile_re(const char *re, int anchored, char *err, size_t errsz, const char *what) {
    int code;
    PCRE2_SIZE at;
    /* UTF (the text is UTF-8); $ only at the very end, as in JavaScript */
    uint32_t opt = PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | (anchored ? PCRE2_ANCHORED : 0);
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, opt, &code, &at, NULL);
    if (!c) {
        char msg[120];
        pcre2_get_error_message(code, (PCRE2_UCHAR *)msg, sizeof msg);
        snprintf(err, errsz, "%s does not compile at offset %zu: %s", what, (size_t)at, msg);
        return NULL;
    }
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD); /* faster when JIT exists */
    return c;
}

static void add_ignored(char *ignored, size_t sz, const char *name) {
    char kw[64];
    snprintf(kw, sizeof kw, "%s", name);
    for (char *p = kw; *p; p++) /* the list stays one line, its commas separators */
        if ((unsigned char)*p < 0x20 || *p == ',') *p = '?';
    size_t n = strlen(ignored);
    if (strstr(ignored, kw)) return;
    snprintf(ignored + n, sz - n, "%s%s", n ? "," : "", kw);
}

int js_pat_compile(js_node *n, const cJSON *j, int strict, char *err, size_t errsz, char *ignored, size_t ign_sz) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (p) {
        if (!cJSON_IsString(p)) return snprintf(err, errsz, "'pattern' must be a string"), -1;
        if (!(n->re[0] = compile_re(p->valuestring, 1, err, errsz, "'pattern'"))) return -1;
    }
    if (f) {
        if (!cJSON_IsString(f)) return snprintf(err, errsz, "'format' must be a string"), -1;
        const char *re = NULL;
        for (size_t i = 0; i < sizeof FORMATS / sizeof *FORMATS; i++)
            if (!strcmp(FORMATS[i].name, f->valuestring)) re = FORMATS[i].re;
        if (!re) {
            if (strict)
                return snprintf(err, errsz,
                                "format \"%.40s\" is not supported in a strict schema (date-time, time, date, duration, "
                                "email, hostname, ipv4, ipv6, uuid are)",
                                f->valuestring),
                       -1;
            char kw[64];
            snprintf(kw, sizeof kw, "format:%.40s", f->valuestring);
            add_ignored(ignored, ign_sz, kw);
        } else if (!(n->re[1] = compile_re(re, 1, err, errsz, "format"))) return -1;
    }
    if ((n->re[0] || n->re[1]) && !(n->md = pcre2_match_data_create(1, NULL)))
        return snprintf(err, errsz, "out of memory"), -1;
    return 0;
}

static int run(const js_node *n, int i, const uint8_t *s, size_t len, uint32_t opt) {
    int r = pcre2_match((pcre2_code *)n->re[i], s, len, 0, opt, (pcre2_match_data *)n->md, NULL);
    return r >= 0 || (r == PCRE2_ERROR_PARTIAL && (opt & PCRE2_PARTIAL_HARD));
}

int js_pat_partial(const js_node *n, const uint8_t *s, size_t len) {
    for (int i = 0; i < 2; i++)
        if (n->re[i] && !run(n, i, s, len, PCRE2_PARTIAL_HARD)) return 0;
    return 1;
}

int js_pat_full(const js_node *n, const uint8_t *s, size_t len) {
    for (int i = 0; i < 2; i++)
        if (n->re[i] && !run(n, i, s, len, 0)) return 0;
    return 1;
}

void js_pat_free(js_node *n) {
    for (int i = 0; i < 2; i++) pcre2_code_free((pcre2_code *)n->re[i]);
    pcre2_match_data_free((pcre2_match_data *)n->md);
}
