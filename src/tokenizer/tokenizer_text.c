/* Text helpers for the tokenizer: growable buffers, UTF-8, the GPT-2 byte
 * alphabet, and regex / literal matching through PCRE2. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- buffers ---------------------------------------------------------------- */

int tk_nomem(void) {
    kvq_fail(KVQ_ERR_NOMEM, "tokenizer: out of memory");
    return -1;
}

int tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) return tk_nomem();
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return tk_nomem();
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk_buf_put(tk_buf *b, const void *s, size_t n) {
    if (tk_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

void tk_buf_free(tk_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- UTF-8 --------------------------------------------------------------------- */

/* Valid range of the second byte for each lead byte (Unicode Table 3-7); the
 * remaining continuation bytes are always 80..BF. need = total sequence length. */
static int utf8_lead(uint8_t c, int *need, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) { *need = 1; return 1; }
    if (c < 0xC2) return 0;
    if (c < 0xE0) { *need = 2; return 1; }
    if (c < 0xF0) {
        *need = 3;
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 1;
    }
    if (c < 0xF5) {
        *need = 4;
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 1;
    }
    return 0;
}

/* Length of the valid sequence at s (0 if invalid or truncated). */
static size_t utf8_valid_len(const uint8_t *s, size_t n) {
    int need;
    uint8_t lo, hi;
    if (!n || !utf8_lead(s[0], &need, &lo, &hi)) return 0;
    if ((size_t)need > n) return 0;
    for (int k = 1; k < need; k++) {
        uint8_t c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
    }
    return (size_t)need;
}

size_t tk_utf8_len(const char *s, size_t n) {
    size_t l = utf8_valid_len((const uint8_t *)s, n);
    return l ? l : 1;
}

int32_t tk_utf8_decode(const char *s, size_t n, size_t *adv) {
    const uint8_t *u = (const uint8_t *)s;
    size_t l = utf8_valid_len(u, n);
    *adv = l ? l : 1;
    switch (l) {
    case 1: return u[0];
    case 2: return (int32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    case 3: return (int32_t)(u[0] & 0x0F) << 12 | (int32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    case 4:
        return (int32_t)(u[0] & 0x07) << 18 | (int32_t)(u[1] & 0x3F) << 12 | (int32_t)(u[2] & 0x3F) << 6 |
               (u[3] & 0x3F);
    }
    return -1;
}

int tk_utf8_encode(int32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int tk_is_space(int32_t cp) {
    if (cp >= 9 && cp <= 13) return 1;
    switch (cp) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
        return 1;
    }
    return cp >= 0x2000 && cp <= 0x200A;
}

long tk_utf8_lossy(const uint8_t *in, size_t n, int final, tk_buf *out) {
    static const char repl[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && in[run] < 0x80) run++; /* ASCII fast path */
        if (run > i) {
            if (tk_buf_put(out, in + i, run - i)) return -1;
            i = run;
            continue;
        }
        int need;
        uint8_t lo, hi;
        if (!utf8_lead(in[i], &need, &lo, &hi)) {
            if (tk_buf_put(out, repl, 3)) return -1;
            i++;
            continue;
        }
        size_t k = 1;
        while (k < (size_t)need && i + k < n) {
            uint8_t c = in[i + k];
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
            k++;
        }
        if (k == (size_t)need) {
            if (tk_buf_put(out, in + i, k)) return -1;
        } else if (i + k == n && !final) {
            break; /* may still complete */
        } else if (tk_buf_put(out, repl, 3)) {
            return -1;
        }
        i += k;
    }
    return (long)i;
}

/* ---- GPT-2 byte alphabet ----------------------------------------------------------- */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes take the code
 * points 256.. in byte order, so every byte has a visible, non-space character. */
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

int32_t tk_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    int k = 0;
    for (int x = 0; x < b; x++) k += !byte_is_printable(x);
    return 256 + k;
}

/* ---- matching ------------------------------------------------------------------- */

pcre2_code *tk_regex_compile(const char *pat, size_t len, const char *file) {
    int err;
    PCRE2_SIZE off;
    /* MATCH_INVALID_UTF: user text may hold invalid UTF-8; those bytes simply never match. */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                                   &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: cannot compile regex /%.*s/ at offset %zu: %s", file,
                 (int)(len > 200 ? 200 : len), pat, (size_t)off, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up; the interpreter still works */
    return re;
}

static int spans_add(tk_spans *sp, size_t s, size_t e) {
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 64;
        size_t *p = realloc(sp->se, cap * 2 * sizeof *p);
        if (!p) return tk_nomem();
        sp->se = p;
        sp->cap = cap;
    }
    sp->se[2 * sp->n] = s;
    sp->se[2 * sp->n + 1] = e;
    sp->n++;
    return 0;
}

int tk_find_all(const pcre2_code *re, const char *lit, size_t litlen, const char *s, size_t n,
                pcre2_match_data *md, tk_spans *out) {
    out->n = 0;
    if (!re) {
        if (!litlen) return 0;
        size_t i = 0;
        while (i + litlen <= n) {
            const char *hit = memmem(s + i, n - i, lit, litlen);
            if (!hit) break;
            size_t at = (size_t)(hit - s);
            if (spans_add(out, at, at + litlen)) return -1;
            i = at + litlen;
        }
        return 0;
    }
    size_t start = 0;
    while (start <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            kvq_fail(KVQ_ERR_BACKEND, "tokenizer regex match failed: %s", (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            if (spans_add(out, ov[0], ov[1])) return -1;
            start = ov[1];
        } else {
            /* empty match: skip one character (HF drops empty pieces anyway) */
            if (ov[1] >= n) break;
            start = ov[1] + tk_utf8_len(s + ov[1], n - ov[1]);
        }
    }
    return 0;
}
