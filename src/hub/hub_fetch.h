/* Internal to src/hub: one repository's download state, and one file's fetch. */
#ifndef KVQ_HUB_FETCH_H
#define KVQ_HUB_FETCH_H

#include "hub/hub.h"
#include "hub/hub_http.h"

typedef struct {
    const kvq_hub_name *n;
    const kvq_hub_opts *o;
    char endpoint[512], token[512];
    char repo_dir[KVQ_HUB_PATH];
    char commit[41];
} kvq_hub_ctx;

/* What the resolve route says of one file. */
typedef struct {
    char etag[129];   /* the blob's name: sha256 of an LFS file, the git hash of others */
    int lfs;          /* etag is the content's sha256, checked before linking */
    int64_t size;     /* -1 unknown */
    int absent;       /* an optional file the repository does not have */
} kvq_hub_meta;

/* Endpoint, token and cache folder for one repository. */
kvq_status kvq_hub_ctx_init(kvq_hub_ctx *c, const kvq_hub_name *n, const kvq_hub_opts *o);
/* "<endpoint>/<org>/<name>/resolve/<commit>/<file>", percent-encoded. */
void kvq_hub_resolve_url(const kvq_hub_ctx *c, const char *file, char *buf, size_t size);
/* One line for an HTTP status the hub answered with (and its X-Error-Code, "" if none). */
kvq_status kvq_hub_status_error(const kvq_hub_ctx *c, long status, const char *code, const char *what);
/* HEAD on the resolve route (no redirect followed). A 404 of an optional file sets m->absent. */
kvq_status kvq_hub_head(const kvq_hub_ctx *c, const char *file, int optional, kvq_hub_meta *m);
/* blobs/<etag> present (of the expected size when known). */
int kvq_hub_blob_present(const kvq_hub_ctx *c, const kvq_hub_meta *m);
/* Downloads into blobs/<etag>.incomplete under a lock shared with huggingface_hub
 * (.locks/models--ORG--NAME/<etag>.lock), resuming what is there, checks size and sha256,
 * renames it to blobs/<etag> and links snapshots/<commit>/<file> to it. */
kvq_status kvq_hub_fetch_file(const kvq_hub_ctx *c, const char *file, const kvq_hub_meta *m);

#endif
