/* One file from the hub into the cache: HEAD for its blob name and size, then a locked,
 * resumable download to blobs/<etag>.incomplete, checked, renamed and linked. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "hub/hub_fetch.h"

static void url_encode(const char *s, char *out, size_t size) {
    size_t o = 0;
    for (; *s && o + 4 < size; s++) {
        unsigned char ch = (unsigned char)*s;
        if (isalnum(ch) || strchr("._~/-", ch)) out[o++] = (char)ch;
        else o += (size_t)snprintf(out + o, size - o, "%%%02X", ch);
    }
    out[o] = 0;
}

void kvq_hub_resolve_url(const kvq_hub_ctx *c, const char *file, char *buf, size_t size) {
    char f[1024];
    url_encode(file, f, sizeof f);
    snprintf(buf, size, "%s/%s/resolve/%s/%s", c->endpoint, c->n->repo, c->commit[0] ? c->commit : c->n->rev, f);
}

kvq_status kvq_hub_status_error(const kvq_hub_ctx *c, long st, const char *code, const char *what) {
    const kvq_hub_name *n = c->n;
    /* the hub answers 401 for a repository that does not exist, to hide private ones */
    if (!strcmp(code, "RepoNotFound") || (st == 404 && !strcmp(code, "RevisionNotFound")))
        return kvq_fail(KVQ_ERR_IO, "%s: not found (HTTP %ld): no model %s with revision '%s' on %s%s (and no directory of that name)", n->repo, st,
                        n->repo, n->rev, c->endpoint, st == 401 && !c->token[0] ? " (if it is private, set HF_TOKEN)" : "");
    if (st == 401 || st == 403)
        return kvq_fail(KVQ_ERR_IO, "%s: access denied (HTTP %ld) to %s: the model is gated or private; accept the license at %s/%s and set HF_TOKEN%s",
                        n->repo, st, what, c->endpoint, n->repo, c->token[0] ? " (a token was sent: does it have access?)" : "");
    if (st == 404)
        return kvq_fail(KVQ_ERR_IO, "%s: not found (HTTP 404): %s at revision '%s' on %s", n->repo, what, n->rev, c->endpoint);
    return kvq_fail(KVQ_ERR_IO, "%s: the hub answered HTTP %ld for %s", n->repo, st, what);
}

/* An ETag as a blob name: quotes and W/ dropped; letters, digits, '-' and '_' only. */
static int clean_etag(const char *in, char *out, size_t size) {
    if (!strncmp(in, "W/", 2)) in += 2;
    size_t o = 0;
    for (; *in; in++) {
        if (*in == '"') continue;
        if (!isalnum((unsigned char)*in) && *in != '-' && *in != '_') return 0;
        if (o + 1 >= size) return 0;
        out[o++] = *in;
    }
    out[o] = 0;
    return o > 0;
}

static int is_sha256(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n])) return 0;
    return n == 64;
}

kvq_status kvq_hub_head(const kvq_hub_ctx *c, const char *file, int optional, kvq_hub_meta *m) {
    memset(m, 0, sizeof *m);
    m->size = -1;
    char url[2048];
    kvq_hub_resolve_url(c, file, url, sizeof url);
    kvq_http_req rq = {.head = 1, .range_to = -1, .token = c->token};
    kvq_http_resp r;
    kvq_status s = kvq_http_request(url, &rq, &r);
    kvq_http_resp_free(&r);
    if (s == KVQ_OK && r.status >= 300 && r.status <= 399 && !r.linked_etag[0] && !r.etag[0]) {
        /* a redirect that is not the CDN's (a renamed repository): follow it for the headers */
        rq.follow = 1;
        s = kvq_http_request(url, &rq, &r);
        kvq_http_resp_free(&r);
    }
    if (s != KVQ_OK) return s;
    if (r.status == 404 && optional) {
        m->absent = 1;
        return KVQ_OK;
    }
    if (r.status != 200 && (r.status < 300 || r.status > 399)) return kvq_hub_status_error(c, r.status, r.error_code, file);
    const char *tag = r.linked_etag[0] ? r.linked_etag : r.etag;
    if (!clean_etag(tag, m->etag, sizeof m->etag))
        return kvq_fail(KVQ_ERR_FORMAT, "%s: the hub gave %s no usable ETag ('%.80s')", c->n->repo, file, tag);
    m->lfs = r.linked_etag[0] && is_sha256(m->etag);
    m->size = r.linked_size >= 0 ? r.linked_size : r.status == 200 ? r.content_length : -1;
    return KVQ_OK;
}

static void blob_path(const kvq_hub_ctx *c, const kvq_hub_meta *m, const char *suffix, char *buf, size_t size) {
    snprintf(buf, size, "%s/blobs/%s%s", c->repo_dir, m->etag, suffix);
}

int kvq_hub_blob_present(const kvq_hub_ctx *c, const kvq_hub_meta *m) {
    char p[KVQ_HUB_PATH + 200];
    struct stat st;
    blob_path(c, m, "", p, sizeof p);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && (m->size < 0 || st.st_size == m->size);
}

int64_t kvq_hub_disk_free(const char *path) {
    /* KVQ_HUB_DISK_FREE (bytes) stands in for the file system's answer, for tests */
    const char *e = getenv("KVQ_HUB_DISK_FREE");
    if (e && *e) return strtoll(e, NULL, 10);
    struct statvfs v;
    if (statvfs(path, &v)) return -1;
    return (int64_t)v.f_bavail * (int64_t)v.f_frsize;
}

/* Exclusive flock on the lock file huggingface_hub uses for this blob; -1 on failure. */
static int lock_blob(const kvq_hub_ctx *c, const kvq_hub_meta *m, const char *file) {
    char root[KVQ_HUB_PATH], dir[KVQ_HUB_PATH + 200], p[KVQ_HUB_PATH + 400];
    if (kvq_hub_cache_root(root, sizeof root)) return -1;
    int n = snprintf(dir, sizeof dir, "%s/.locks/models--%s--%s", root, c->n->org, c->n->name);
    if (n < 0 || (size_t)n >= sizeof dir || kvq_hub_mkdirs(dir)) return -1;
    n = snprintf(p, sizeof p, "%s/%s.lock", dir, m->etag);
    if (n < 0 || (size_t)n >= sizeof p) return -1;
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    if (c->o->prog) fprintf(stderr, "%s: %s: another process is downloading it; waiting\n", c->o->prog, file);
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    return fd;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Appends the rest of the file to part (have bytes already there); a few tries when cut. */
static kvq_status download(const kvq_hub_ctx *c, const char *file, const kvq_hub_meta *m, const char *part, int64_t have) {
    const char *prog = c->o->prog;
    char url[2048], a[32], b[32];
    kvq_hub_resolve_url(c, file, url, sizeof url);
    for (int attempt = 0;; attempt++) {
        if (m->size >= 0 && have >= m->size) return KVQ_OK;
        FILE *f = fopen(part, have ? "ab" : "wb");
        if (!f) return kvq_fail(KVQ_ERR_IO, "%s: cannot write: %s", part, strerror(errno));
        if (have && prog) fprintf(stderr, "%s: %s: resuming at %s of %s\n", prog, file, kvq_hub_bytes((double)have, a, sizeof a),
                                  m->size >= 0 ? kvq_hub_bytes((double)m->size, b, sizeof b) : "?");
        kvq_http_req rq = {.follow = 1, .range_from = have, .range_to = -1, .out = f, .out_max = m->size >= 0 ? m->size - have : 0,
                           .token = c->token, .prog = prog, .label = file, .total = m->size};
        kvq_http_resp r;
        kvq_status s = kvq_http_request(url, &rq, &r);
        kvq_http_resp_free(&r);
        int werr = fclose(f) ? errno : 0;
        if (s == KVQ_OK && r.status == 416 && m->size >= 0 && have == m->size) return KVQ_OK;
        if (s == KVQ_OK && r.status == 200 && have) {
            /* the server sent the whole file again: keep only that copy */
            if (truncate(part, 0) == 0) {
                have = 0;
                if (attempt < 3) continue;
            }
            return kvq_fail(KVQ_ERR_IO, "%s: the server ignored the resume request", file);
        }
        if (s == KVQ_OK && r.status != 200 && r.status != 206) return kvq_hub_status_error(c, r.status, r.error_code, file);
        if (r.write_errno == ENOSPC || werr == ENOSPC) {
            return kvq_fail(KVQ_ERR_IO, "%s: disk full while writing %s (%s kept; free space and run again to resume)", c->n->repo, file, part);
        }
        if (r.write_errno == EOVERFLOW) {
            unlink(part);
            return kvq_fail(KVQ_ERR_FORMAT, "%s: the server sent more of %s than the %lld bytes it announced; the partial file was removed", c->n->repo,
                            file, (long long)m->size);
        }
        if (s != KVQ_OK && !r.cut) return s;
        have += r.written;
        if (s == KVQ_OK && (m->size < 0 || have == m->size)) return KVQ_OK;
        if (s == KVQ_OK && have > m->size)
            return kvq_fail(KVQ_ERR_FORMAT, "%s: %s: received %lld bytes, more than the %lld announced", c->n->repo, file, (long long)have,
                            (long long)m->size);
        /* cut, or ended short: try again from where it stopped while it makes progress */
        if (attempt >= 2 || r.written == 0)
            return kvq_fail(KVQ_ERR_IO, "%s: the download of %s was cut at %s of %s (kept in %s; run again to resume)", c->n->repo, file,
                            kvq_hub_bytes((double)have, a, sizeof a), kvq_hub_bytes((double)m->size, b, sizeof b), part);
        if (prog) fprintf(stderr, "%s: %s: connection cut at %s; retrying\n", prog, file, kvq_hub_bytes((double)have, a, sizeof a));
    }
}

static kvq_status fetch_locked(const kvq_hub_ctx *c, const char *file, const kvq_hub_meta *m) {
    char blob[KVQ_HUB_PATH + 200], part[KVQ_HUB_PATH + 220], a[32], b[32];
    blob_path(c, m, "", blob, sizeof blob);
    blob_path(c, m, ".incomplete", part, sizeof part);
    if (kvq_hub_blob_present(c, m)) return KVQ_OK; /* another process finished it while this one waited */
    struct stat st;
    int64_t have = stat(part, &st) == 0 ? (int64_t)st.st_size : 0;
    if (m->size >= 0 && have > m->size) {
        unlink(part);
        have = 0;
    }
    int64_t need = m->size >= 0 ? m->size - have : 0, avail = kvq_hub_disk_free(c->repo_dir);
    if (avail >= 0 && need > avail)
        return kvq_fail(KVQ_ERR_IO, "%s: not enough disk space for %s: needs %s, %s free in %s", c->n->repo, file,
                        kvq_hub_bytes((double)need, a, sizeof a), kvq_hub_bytes((double)avail, b, sizeof b), c->repo_dir);
    double t0 = now_s();
    kvq_status s = download(c, file, m, part, have);
    if (s != KVQ_OK) return s;
    if (stat(part, &st) || (m->size >= 0 && st.st_size != m->size)) {
        unlink(part);
        return kvq_fail(KVQ_ERR_IO, "%s: %s has the wrong size after download; the partial file was removed, run again to retry", c->n->repo, file);
    }
    if (m->lfs) {
        char got[65];
        if (kvq_sha256_file(part, got)) return kvq_fail(KVQ_ERR_IO, "%s: cannot read: %s", part, strerror(errno));
        if (strcasecmp(got, m->etag)) {
            unlink(part);
            return kvq_fail(KVQ_ERR_IO, "%s: checksum mismatch for %s (sha256 %s, expected %s): the file was removed, run again to retry",
                            c->n->repo, file, got, m->etag);
        }
    }
    if (rename(part, blob)) return kvq_fail(KVQ_ERR_IO, "%s: cannot rename to %s: %s", part, blob, strerror(errno));
    if (c->o->prog) {
        double t = now_s() - t0;
        fprintf(stderr, "%s: %s: %s in %.1f s (%s/s)%s\n", c->o->prog, file, kvq_hub_bytes((double)st.st_size - (double)have, a, sizeof a), t,
                kvq_hub_bytes(((double)st.st_size - (double)have) / (t > 1e-3 ? t : 1e-3), b, sizeof b), m->lfs ? ", sha256 checked" : "");
    }
    return KVQ_OK;
}

kvq_status kvq_hub_fetch_file(const kvq_hub_ctx *c, const char *file, const kvq_hub_meta *m) {
    char blobs[KVQ_HUB_PATH + 16];
    snprintf(blobs, sizeof blobs, "%s/blobs", c->repo_dir);
    if (kvq_hub_mkdirs(blobs)) return kvq_fail(KVQ_ERR_IO, "%s: cannot create: %s", blobs, strerror(errno));
    if (!kvq_hub_blob_present(c, m)) {
        int fd = lock_blob(c, m, file);
        if (fd < 0) return kvq_fail(KVQ_ERR_IO, "%s: cannot take the download lock: %s", file, strerror(errno));
        kvq_status s = fetch_locked(c, file, m);
        close(fd);
        if (s != KVQ_OK) return s;
    }
    return kvq_hub_link_blob(c->repo_dir, c->commit, file, m->etag);
}
