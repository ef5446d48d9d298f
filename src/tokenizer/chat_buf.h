/* The growable string the chat template renderers write into, and Python's str.strip(). */
#ifndef KVQ_CHAT_BUF_H
#define KVQ_CHAT_BUF_H
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static inline void put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static inline void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Python str.strip(): Unicode White_Space plus the ASCII separators 0x1c-0x1f. */
static inline size_t ws_len(const unsigned char *s, size_t n) {
    if (!n) return 0;
    unsigned c = s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c == 0xc2 && n >= 2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (c == 0xe1 && n >= 3 && s[1] == 0x9a && s[2] == 0x80) return 3; /* U+1680 */
    if (c == 0xe2 && n >= 3 && s[1] == 0x80 && (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf)) return 3;
    if (c == 0xe2 && n >= 3 && s[1] == 0x81 && s[2] == 0x9f) return 3; /* U+205F */
    if (c == 0xe3 && n >= 3 && s[1] == 0x80 && s[2] == 0x80) return 3; /* U+3000 */
    return 0;
}
/* Length of the whitespace sequence ending at s[n-1]. */
static inline size_t ws_len_back(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (ws_len(s + n - k, k) == k) return k;
    return 0;
}
static inline void put_strip(sbuf *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), k;
    while (n && (k = ws_len(u, n))) u += k, n -= k;
    while (n && (k = ws_len_back(u, n))) n -= k;
    put(b, (const char *)u, n);
}

#endif
