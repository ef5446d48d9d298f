/* Small shared helpers: error reporting, half/bfloat conversion, files. */
#ifndef KVQ_UTIL_H
#define KVQ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "kvq.h"

/* Records a one-line error for kvq_last_error() and returns s. */
kvq_status kvq_fail(kvq_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Forgets the last error (after a fallback made it moot). */
void kvq_clear_error(void);

/* IEEE half <-> float (exact for all halfs; round-to-nearest-even on the way down). */
float kvq_f16_to_f32(uint16_t h);
uint16_t kvq_f32_to_f16(float f);
static inline float kvq_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Unaligned little-endian loads from mapped files. */
static inline uint16_t kvq_rd_u16(const void *p, size_t i) {
    uint16_t v;
    memcpy(&v, (const char *)p + 2 * i, 2);
    return v;
}
static inline float kvq_rd_f32(const void *p, size_t i) {
    float v;
    memcpy(&v, (const char *)p + 4 * i, 4);
    return v;
}

/* 64-byte aligned allocation (free with kvq_free_aligned); NULL on failure or overflow. */
void *kvq_alloc_aligned(size_t bytes);
void kvq_free_aligned(void *p);
/* The whole pages inside [p, p + n) of a read-only file mapping are not
 * needed any more (a copy was made): they leave this process's memory. */
void kvq_mmap_release(const void *p, size_t n);
/* Maps the pages of [p, p + n) of a file mapping now, in one call (advice only). */
void kvq_mmap_populate(const void *p, size_t n);

/* Read-only memory map of a whole file. */
typedef struct {
    const uint8_t *data;
    size_t size;
} kvq_mmap;
kvq_status kvq_mmap_open(const char *path, kvq_mmap *m);
void kvq_mmap_close(kvq_mmap *m);

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer. */
kvq_status kvq_read_file(const char *path, char **out, size_t *len);
/* dir + "/" + name into buf; returns buf (truncation is reported as an error by callers opening it). */
const char *kvq_path_join(char *buf, size_t size, const char *dir, const char *name);
int kvq_file_exists(const char *path);

/* Overflow-checked size arithmetic: returns 0 on overflow. */
static inline int kvq_mul_ok(size_t a, size_t b, size_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* FNV-1a, 64 bits, over 8-byte words (then the tail bytes), continued from h (start from
 * KVQ_FNV_SEED): identities and checksums of files kvq writes itself; words, not bytes, so
 * a multi-GB session file is checked at memory speed. Not a defence against a forger. */
#define KVQ_FNV_SEED 0xcbf29ce484222325ull
static inline uint64_t kvq_fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#endif
