/* HTTP for the hub through libcurl: headers parsed with bounds, bodies to a file or a capped
 * buffer, a progress bar on a terminal. Without libcurl every request fails with one line. */
#include "hub/hub_http.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

const char *kvq_hub_bytes(double b, char *buf, size_t size) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, size, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return buf;
}

void kvq_http_resp_free(kvq_http_resp *r) {
    free(r->body);
    r->body = NULL;
}

#ifndef KVQ_HAVE_CURL

int kvq_hub_can_download(void) { return 0; }

kvq_status kvq_http_request(const char *url, const kvq_http_req *rq, kvq_http_resp *resp) {
    (void)url, (void)rq;
    memset(resp, 0, sizeof *resp);
    return kvq_fail(KVQ_ERR_UNSUPPORTED, "downloads need libcurl: this kvq was built without it (install libcurl4-openssl-dev and rebuild)");
}

#else
#include <curl/curl.h>

int kvq_hub_can_download(void) { return 1; }

typedef struct {
    const kvq_http_req *rq;
    kvq_http_resp *r;
    CURL *c;
    size_t cap;
    double t0, last_draw;
    int tty;
} xfer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t parse_i64(const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    return errno || end == s || v < 0 ? -1 : (int64_t)v;
}

/* Value of "Name: value" when the line is that header (value trimmed into buf). */
static int header_is(const char *line, size_t n, const char *name, char *buf, size_t size) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) || line[k] != ':') return 0;
    const char *v = line + k + 1, *e = line + n;
    while (v < e && (*v == ' ' || *v == '\t')) v++;
    while (e > v && isspace((unsigned char)e[-1])) e--;
    size_t l = (size_t)(e - v) < size - 1 ? (size_t)(e - v) : size - 1;
    memcpy(buf, v, l);
    buf[l] = 0;
    return 1;
}

static void set_str(char *dst, size_t size, const char *v) {
    size_t l = strlen(v) < size - 1 ? strlen(v) : size - 1;
    memcpy(dst, v, l);
    dst[l] = 0;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud) {
    xfer *x = ud;
    kvq_http_resp *r = x->r;
    size_t n = sz * nm;
    char v[256];
    /* a redirect's headers come first; keep what each response says (the hub's X-Linked-* and the CDN's ETag) */
    if (header_is(p, n, "ETag", v, sizeof v)) set_str(r->etag, sizeof r->etag, v);
    else if (header_is(p, n, "X-Linked-Etag", v, sizeof v)) set_str(r->linked_etag, sizeof r->linked_etag, v);
    else if (header_is(p, n, "X-Repo-Commit", v, sizeof v)) set_str(r->commit, sizeof r->commit, v);
    else if (header_is(p, n, "X-Error-Code", v, sizeof v)) set_str(r->error_code, sizeof r->error_code, v);
    else if (header_is(p, n, "X-Linked-Size", v, sizeof v)) r->linked_size = parse_i64(v);
    else if (header_is(p, n, "Content-Length", v, sizeof v)) r->content_length = parse_i64(v);
    else if (header_is(p, n, "Content-Range", v, sizeof v)) {
        const char *slash = strrchr(v, '/');
        r->range_total = slash ? parse_i64(slash + 1) : -1;
    }
    return n;
}

static int body_wanted(xfer *x) {
    long st = 0;
    curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &st);
    return st == 200 || st == 206;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
    xfer *x = ud;
    size_t n = sz * nm;
    kvq_http_resp *r = x->r;
    if (x->rq->out && body_wanted(x)) {
        if (x->rq->out_max > 0 && r->written + (int64_t)n > x->rq->out_max) {
            r->write_errno = EOVERFLOW; /* more than announced: stop before it fills the disk */
            return 0;
        }
        if (fwrite(p, 1, n, x->rq->out) != n || fflush(x->rq->out)) {
            r->write_errno = errno ? errno : EIO;
            return 0;
        }
        r->written += (int64_t)n;
        return n;
    }
    /* an error page or a small file: kept up to body_max, the rest dropped */
    int wanted = body_wanted(x);
    size_t keep = x->rq->out || !wanted ? 512 : x->rq->body_max;
    if (r->body_len + n > keep) {
        if (!x->rq->out && wanted) {
            errno = EFBIG;
            r->write_errno = EFBIG;
            return 0;
        }
        n = r->body_len < keep ? keep - r->body_len : 0;
    }
    if (r->body_len + n + 1 > x->cap) {
        size_t nc = (r->body_len + n + 1) * 2;
        char *b = realloc(r->body, nc);
        if (!b) return 0;
        r->body = b, x->cap = nc;
    }
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    r->body[r->body_len] = 0;
    return sz * nm;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ul, curl_off_t uln) {
    (void)dltotal, (void)ul, (void)uln;
    xfer *x = ud;
    if (!x->tty || !x->rq->prog || !x->rq->out) return 0;
    double t = now_s();
    if (t - x->last_draw < 0.1) return 0;
    x->last_draw = t;
    double have = (double)(x->rq->range_from > 0 ? x->rq->range_from : 0) + (double)dlnow, total = (double)x->rq->total;
    double rate = (double)dlnow / (t - x->t0 > 1e-3 ? t - x->t0 : 1e-3);
    char a[32], b[32], c[32];
    int pct = total > 0 ? (int)(100.0 * have / total) : 0;
    char bar[21];
    for (int i = 0; i < 20; i++) bar[i] = i < pct / 5 ? '#' : '.';
    bar[20] = 0;
    double left = rate > 0 && total > have ? (total - have) / rate : 0;
    fprintf(stderr, "\r%s: %s [%s] %3d%% %s / %s  %s/s  %d:%02d left  ", x->rq->prog, x->rq->label ? x->rq->label : "", bar, pct,
            kvq_hub_bytes(have, a, sizeof a), total > 0 ? kvq_hub_bytes(total, b, sizeof b) : "?", kvq_hub_bytes(rate, c, sizeof c),
            (int)(left / 60), (int)left % 60);
    return 0;
}

static int curl_ready(void) {
    static int done;
    if (!done) done = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 1 : -1;
    return done == 1;
}

kvq_status kvq_http_request(const char *url, const kvq_http_req *rq, kvq_http_resp *resp) {
    memset(resp, 0, sizeof *resp);
    resp->linked_size = resp->content_length = resp->range_total = -1;
    if (!curl_ready()) return kvq_fail(KVQ_ERR_IO, "libcurl failed to initialise");
    CURL *c = curl_easy_init();
    if (!c) return kvq_fail(KVQ_ERR_NOMEM, "libcurl: out of memory");
    xfer x = {.rq = rq, .r = resp, .c = c, .t0 = now_s(), .tty = isatty(2)};
    x.last_draw = x.t0; /* a file done within 0.1 s gets no bar */
    struct curl_slist *hdr = NULL;
    char line[600];
    if (rq->token && *rq->token) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", rq->token);
        hdr = curl_slist_append(hdr, line);
    }
    if (rq->range_from > 0 || rq->range_to >= 0) {
        if (rq->range_to >= 0) snprintf(line, sizeof line, "Range: bytes=%lld-%lld", (long long)rq->range_from, (long long)rq->range_to);
        else snprintf(line, sizeof line, "Range: bytes=%lld-", (long long)rq->range_from);
        hdr = curl_slist_append(hdr, line);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    char ua[64];
    snprintf(ua, sizeof ua, "kvq/%s", kvq_version());
    curl_easy_setopt(c, CURLOPT_USERAGENT, ua);
    curl_easy_setopt(c, CURLOPT_NOBODY, rq->head ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, rq->follow ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
    /* a stalled transfer (under 1 byte/s for 30 s) counts as a cut, and resumes */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, rq->prog && rq->out ? 0L : 1L);
    char err[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp->status);
    if (x.tty && rq->prog && rq->out) fprintf(stderr, "\r\033[K");
    curl_easy_cleanup(c);
    curl_slist_free_all(hdr);
    if (rc == CURLE_OK) return KVQ_OK;
    if (resp->write_errno == EFBIG) return kvq_fail(KVQ_ERR_FORMAT, "%s: answer larger than %zu bytes", url, rq->body_max);
    if (resp->write_errno == EOVERFLOW) return kvq_fail(KVQ_ERR_FORMAT, "%s: the server sent more bytes than it announced", url);
    if (resp->write_errno) return kvq_fail(KVQ_ERR_IO, "cannot write the download: %s", strerror(resp->write_errno));
    resp->cut = resp->status != 0;
    if (resp->cut)
        return kvq_fail(KVQ_ERR_IO, "the connection broke after %lld bytes (%s)", (long long)resp->written, err[0] ? err : curl_easy_strerror(rc));
    return kvq_fail(KVQ_ERR_IO, "cannot reach %s (%s); check the network, or set HF_HUB_OFFLINE=1 to use only the cache", url,
                    err[0] ? err : curl_easy_strerror(rc));
}

#endif
