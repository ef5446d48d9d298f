/* kvq-server's disk prefix cache (--prefix-cache MIB with --slot-save-path DIR): a slot's KV
 * cache goes to DIR/prefix-*.kvqs (kvq_context_save) when a new request is about to drop most
 * of it, and a later request whose prompt shares a long prefix with no slot but with such a
 * file starts from the file (kvq_context_restore) and evaluates only the rest. The files are
 * bounded by size, least recently used first out; a new process indexes the ones it finds. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common.h"
#include "server_sched.h"

#define PFX_MIN 32 /* tokens: a shorter prefix is cheaper to evaluate again than to read */

typedef struct {
    char name[64];
    int32_t *ids;
    int n;
    size_t bytes;
    double used;
} pfx_file;

struct srv_prefix {
    char dir[4096];
    size_t limit, total;
    pfx_file *f;
    int n, cap;
    unsigned long seq;
};

static void path_of(const struct srv_prefix *p, const char *name, char *out, size_t size) {
    snprintf(out, size, "%s/%s", p->dir, name);
}

/* The index is the scheduler thread's alone; the metrics are read under the lock. */
static void count(srv_server *s, int hits, int tokens, int saves) {
    pthread_mutex_lock(&s->mu);
    s->met.prefix_hits += (unsigned long)hits;
    s->met.prefix_tokens += (unsigned long)tokens;
    s->met.prefix_saves += (unsigned long)saves;
    s->met.prefix_files = (unsigned long)s->prefix->n;
    s->met.prefix_bytes = (unsigned long)s->prefix->total;
    pthread_mutex_unlock(&s->mu);
}

/* Drops entry i from the index; deletes its file too when `unlink_it`. */
static void drop(srv_server *s, int i, int unlink_it) {
    struct srv_prefix *p = s->prefix;
    if (unlink_it) {
        char path[4200];
        path_of(p, p->f[i].name, path, sizeof path);
        remove(path);
    }
    p->total -= p->f[i].bytes;
    free(p->f[i].ids);
    p->f[i] = p->f[--p->n];
}

static pfx_file *add(struct srv_prefix *p) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        pfx_file *f = realloc(p->f, sizeof *f * (size_t)cap);
        if (!f) return NULL;
        p->f = f;
        p->cap = cap;
    }
    pfx_file *e = &p->f[p->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static uint32_t le32(const unsigned char *b) { return b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24; }

/* The tokens of a session file, from its header (src/session.c: "KVQS", version 1, n_past at
 * byte 40, the tokens from byte 64); the restore checks the rest. */
static int read_tokens(const char *path, pfx_file *e) {
    FILE *f = fopen(path, "rb");
    unsigned char h[64];
    int ok = f && fread(h, 1, 64, f) == 64 && !memcmp(h, "KVQS", 4) && le32(h + 4) == 1;
    uint32_t n = ok ? le32(h + 40) : 0;
    ok = ok && n > 0 && n <= (1u << 24) && (e->ids = malloc(sizeof *e->ids * n));
    for (uint32_t i = 0; ok && i < n; i++) {
        unsigned char b[4];
        ok = fread(b, 1, 4, f) == 4;
        e->ids[i] = (int32_t)le32(b);
    }
    if (f) fclose(f);
    e->n = (int)n;
    return ok ? 0 : -1;
}

/* Least recently used first, until the files fit the limit (the newest may go too, alone). */
static void trim(srv_server *s) {
    struct srv_prefix *p = s->prefix;
    while (p->total > p->limit && p->n) {
        int old = 0;
        for (int i = 1; i < p->n; i++)
            if (p->f[i].used < p->f[old].used) old = i;
        drop(s, old, 1);
    }
}

int srv_prefix_open(srv_server *s, const srv_opts *o) {
    if (!o->prefix_mib || !o->slot_save_path) return 0;
    struct srv_prefix *p = calloc(1, sizeof *p);
    if (!p) return kvq_tool_die(SRV_PROG, "out of memory");
    s->prefix = p;
    snprintf(p->dir, sizeof p->dir, "%s", o->slot_save_path);
    p->limit = (size_t)o->prefix_mib << 20;
    p->seq = (unsigned long)time(NULL) << 16;
    DIR *d = opendir(p->dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (strncmp(de->d_name, "prefix-", 7) || l < 12 || l >= sizeof p->f->name || strcmp(de->d_name + l - 5, ".kvqs")) continue;
        char path[4200];
        path_of(p, de->d_name, path, sizeof path);
        struct stat st;
        pfx_file *e = stat(path, &st) == 0 ? add(p) : NULL;
        if (!e) continue;
        memcpy(e->name, de->d_name, l + 1); /* l < sizeof e->name: checked above */
        e->bytes = (size_t)st.st_size;
        e->used = (double)st.st_mtime;
        p->total += e->bytes;
        if (read_tokens(path, e)) drop(s, p->n - 1, 0); /* not ours to judge: left alone */
    }
    if (d) closedir(d);
    trim(s);
    count(s, 0, 0, 0);
    return 0;
}

void srv_prefix_free(srv_server *s) {
    struct srv_prefix *p = s->prefix;
    if (!p) return;
    for (int i = 0; i < p->n; i++) free(p->f[i].ids);
    free(p->f);
    free(p);
    s->prefix = NULL;
}

static int shared(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

void srv_prefix_evict(srv_server *s, slot *sl, int keep) {
    struct srv_prefix *p = s->prefix;
    if (!p || sl->n_ids < PFX_MIN || sl->n_ids - keep < PFX_MIN) return;
    for (int i = 0; i < p->n; i++) {
        pfx_file *e = &p->f[i];
        int m = shared(e->ids, e->n, sl->ids, sl->n_ids);
        if (m == sl->n_ids) { /* a file holds all of it already */
            e->used = kvq_tool_now();
            count(s, 0, 0, 0);
            return;
        }
        if (m == e->n) drop(s, i--, 1); /* this one's tokens are a prefix of the new file's */
    }
    pfx_file *e = add(p);
    if (!e || !(e->ids = malloc(sizeof *e->ids * (size_t)sl->n_ids))) {
        if (e) p->n--;
        count(s, 0, 0, 0);
        return;
    }
    snprintf(e->name, sizeof e->name, "prefix-%lx.kvqs", p->seq++);
    char path[4200];
    path_of(p, e->name, path, sizeof path);
    struct stat st;
    if (kvq_context_save(sl->c, path, sl->ids, sl->n_ids) != KVQ_OK || stat(path, &st) != 0) {
        fprintf(stderr, "%s: prefix cache: %s\n", SRV_PROG, kvq_last_error());
        free(e->ids);
        p->n--;
        count(s, 0, 0, 0);
        return;
    }
    memcpy(e->ids, sl->ids, sizeof *e->ids * (size_t)sl->n_ids);
    e->n = sl->n_ids;
    e->bytes = (size_t)st.st_size;
    e->used = kvq_tool_now();
    p->total += e->bytes;
    trim(s);
    count(s, 0, 0, 1);
}

int srv_prefix_restore(srv_server *s, slot *sl, srv_req *r, int common) {
    struct srv_prefix *p = s->prefix;
    if (!p) return common;
    int best = -1, best_m = common > PFX_MIN - 1 ? common : PFX_MIN - 1;
    for (int i = 0; i < p->n; i++) {
        int m = shared(p->f[i].ids, p->f[i].n, r->prompt, r->n_prompt);
        if (m > best_m) best = i, best_m = m;
    }
    if (best < 0) return common;
    int32_t *ids = malloc(sizeof *ids * (size_t)(s->n_ctx + 1));
    int n = 0;
    char path[4200];
    path_of(p, p->f[best].name, path, sizeof path);
    kvq_status st = ids ? kvq_context_restore(sl->c, path, ids, s->n_ctx + 1, &n) : KVQ_ERR_NOMEM;
    if (st != KVQ_OK) { /* gone, damaged, or another model's: forget it; the slot is as it was, or empty */
        fprintf(stderr, "%s: prefix cache: %s\n", SRV_PROG, kvq_last_error());
        free(ids);
        drop(s, best, 0);
        count(s, 0, 0, 0);
        if (kvq_n_past(sl->c) < sl->n_ids) sl->n_ids = kvq_n_past(sl->c);
        return common < sl->n_ids ? common : sl->n_ids;
    }
    memcpy(sl->ids, ids, sizeof *ids * (size_t)n);
    free(ids);
    sl->n_ids = n;
    sl->n_saved = 0; /* no logits came with it */
    p->f[best].used = kvq_tool_now();
    int m = shared(sl->ids, n, r->prompt, r->n_prompt);
    r->n_disk = m < r->n_prompt ? m : r->n_prompt - 1;
    count(s, 1, r->n_disk, 0);
    return m;
}
