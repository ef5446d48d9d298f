#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static _Thread_local char g_err[1024];

const char *kvq_last_error(void) { return g_err; }
void kvq_clear_error(void) { g_err[0] = 0; }

kvq_status kvq_fail(kvq_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    /* keep it one line */
    for (char *p = g_err; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return s;
}

const char *kvq_status_str(kvq_status s) {
    switch (s) {
    case KVQ_OK: return "ok";
    case KVQ_ERR_IO: return "i/o error";
    case KVQ_ERR_FORMAT: return "bad format";
    case KVQ_ERR_UNSUPPORTED: return "unsupported";
    case KVQ_ERR_NOMEM: return "out of memory";
    case KVQ_ERR_ARG: return "bad argument";
    case KVQ_ERR_BACKEND: return "backend error";
    }
    return "unknown error";
}

float kvq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kvq_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exp: still correct */
    return (uint16_t)(sign | h);
}

/* Arrays of 2 MB and more (repacked weights, KV cache, scratch) start on a
 * 2 MB boundary and ask for transparent huge pages over their whole 2 MB
 * spans: one page fault per 2 MB instead of 512 (faults are dear under a
 * hypervisor: a 7B load spent most of its time in them) and one TLB entry
 * per 2 MB for kernels that stream the weights. The tail past the last whole
 * span keeps small pages, so nothing is made resident that is not used. */
#define KVQ_HUGE ((size_t)2 << 20)

void *kvq_alloc_aligned(size_t bytes) {
    if (bytes == 0) bytes = 64;
    size_t r = (bytes + 63) & ~(size_t)63;
    if (r < bytes) return NULL;
    if (r < KVQ_HUGE) return aligned_alloc(64, r);
    void *p = NULL;
    if (posix_memalign(&p, KVQ_HUGE, r) != 0) return NULL; /* aligned_alloc wants r a multiple of 2 MB */
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, r & ~(KVQ_HUGE - 1), MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    return p;
}

void kvq_free_aligned(void *p) { free(p); }

/* For a read-only file mapping this only drops the pages from this process;
 * the file and the page cache keep the data. */
void kvq_mmap_release(const void *p, size_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) / (uintptr_t)pg * (uintptr_t)pg,
              b = ((uintptr_t)p + n) / (uintptr_t)pg * (uintptr_t)pg;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* One madvise maps a whole range of a file mapping instead of a page fault
 * per few pages as it is read (each fault is dear under a hypervisor).
 * Advice only: kernels before 5.14 refuse it and the reads fault as before. */
void kvq_mmap_populate(const void *p, size_t n) {
#ifdef MADV_POPULATE_READ
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || n == 0) return;
    uintptr_t a = (uintptr_t)p / (uintptr_t)pg * (uintptr_t)pg, b = (uintptr_t)p + n;
    (void)madvise((void *)a, b - a, MADV_POPULATE_READ);
#else
    (void)p, (void)n;
#endif
}

kvq_status kvq_mmap_open(const char *path, kvq_mmap *m) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvq_fail(KVQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kvq_fail(KVQ_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return kvq_fail(KVQ_ERR_FORMAT, "%s: file is empty", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return kvq_fail(KVQ_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    m->data = p;
    m->size = (size_t)st.st_size;
    return KVQ_OK;
}

void kvq_mmap_close(kvq_mmap *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

kvq_status kvq_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kvq_fail(KVQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory reading file", path);
    if (err) { free(buf); return kvq_fail(KVQ_ERR_IO, "%s: read error", path); }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return KVQ_OK;
}

const char *kvq_path_join(char *buf, size_t size, const char *dir, const char *name) {
    snprintf(buf, size, "%s/%s", dir, name);
    return buf;
}

int kvq_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
