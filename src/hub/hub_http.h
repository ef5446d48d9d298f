/* One HTTP request through libcurl, with the headers the hub's resolve route answers with. */
#ifndef KVQ_HUB_HTTP_H
#define KVQ_HUB_HTTP_H

#include <stdint.h>
#include <stdio.h>

#include "hub/hub.h"

typedef struct {
    int head;            /* HEAD instead of GET */
    int follow;          /* follow redirects (to the CDN) */
    int64_t range_from;  /* > 0 or range_to >= 0: a Range request */
    int64_t range_to;    /* -1: to the end */
    FILE *out;           /* body of a 200/206 goes here (at most out_max bytes when > 0) ... */
    int64_t out_max;
    size_t body_max;     /* ... or into resp.body, up to this many bytes */
    const char *token;   /* Bearer token, "" or NULL for none */
    const char *prog;    /* progress on stderr: prefix; NULL for none */
    const char *label;   /* progress: the file's name */
    int64_t total;       /* progress: the file's full size (-1 unknown) */
} kvq_http_req;

typedef struct {
    long status;
    char etag[160], linked_etag[160], commit[64], error_code[64];
    int64_t linked_size, content_length, range_total; /* -1 when absent */
    char *body;          /* NUL-terminated; free() it */
    size_t body_len;
    int64_t written;     /* bytes of body written to out */
    int cut;             /* the connection ended before the body was complete */
    int write_errno;     /* a write to out failed (ENOSPC: disk full) */
} kvq_http_resp;

/* KVQ_OK when the server answered (any status); KVQ_ERR_IO with a one-line message when it could
 * not be reached or the transfer broke (resp.cut set when some of the body arrived). */
kvq_status kvq_http_request(const char *url, const kvq_http_req *rq, kvq_http_resp *resp);
void kvq_http_resp_free(kvq_http_resp *r);
/* "1.2 GiB" style */
const char *kvq_hub_bytes(double b, char *buf, size_t size);

#endif
