/* Models by hub name (ORG/NAME[:REVISION]): the Hugging Face cache laid out as huggingface_hub
 * lays it, so a model fetched by transformers, `hf download` or kvq is found by all of them, and
 * downloads from the hub (HF_ENDPOINT) into that cache. Errors are one line (kvq_last_error). */
#ifndef KVQ_HUB_H
#define KVQ_HUB_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define KVQ_HUB_PATH 4096
#define KVQ_HUB_MAX_FILES 256

typedef struct {
    char org[96], name[96], rev[128]; /* rev "main" when none is given */
    char repo[200];                   /* "org/name" */
} kvq_hub_name;

/* 1 and *out filled when s reads as ORG/NAME[:REV] (letters, digits, '.', '_', '-'; no "..").
 * Says nothing about whether a directory of that name exists: callers check that first. */
int kvq_hub_parse_name(const char *s, kvq_hub_name *out);

/* The cache root: HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub. Returns 0, or -1 when no home directory is known. */
int kvq_hub_cache_root(char *buf, size_t size);
/* <root>/models--ORG--NAME */
int kvq_hub_repo_dir(const kvq_hub_name *n, char *buf, size_t size);
/* HF_HUB_OFFLINE set to 1/true/yes/on. */
int kvq_hub_offline(void);
/* HF_ENDPOINT without a trailing slash, default https://huggingface.co. */
const char *kvq_hub_endpoint(char *buf, size_t size);
/* HF_TOKEN, else the file HF_TOKEN_PATH or $HF_HOME/token (~/.cache/huggingface/token); "" if none. */
void kvq_hub_token(char *buf, size_t size);

/* The files a load reads, in the order they are fetched; weights come from the index. */
typedef struct {
    int n;
    char *names[KVQ_HUB_MAX_FILES];
    int optional[KVQ_HUB_MAX_FILES]; /* a 404 is skipped */
} kvq_hub_files;
void kvq_hub_files_free(kvq_hub_files *f);
/* Appends a copy of name unless it is there; rejects names that could leave the snapshot. */
kvq_status kvq_hub_files_add(kvq_hub_files *f, const char *name, int optional);
/* The shard names of a model.safetensors.index.json text (weight_map's values, each once). */
kvq_status kvq_hub_index_shards(const char *text, const char *path, kvq_hub_files *f);
/* A file name safe to join under a snapshot: no absolute path, no "..", no empty part. */
int kvq_hub_safe_file_name(const char *name);

/* ---- cache ---- */
/* mkdir -p; 0 or -1 (errno). */
int kvq_hub_mkdirs(const char *path);
/* The commit a revision names: itself when it is 40 hex digits, else refs/REV. 0 or -1. */
int kvq_hub_cache_commit(const char *repo_dir, const char *rev, char commit[41]);
/* The snapshot directory of a commit. */
int kvq_hub_snapshot_dir(const char *repo_dir, const char *commit, char *buf, size_t size);
/* First file of what a load needs missing from dir (NULL when complete); weights only when
 * need_weights. Reads the index from dir when there is one. */
const char *kvq_hub_snapshot_missing(const char *dir, int need_weights, char *buf, size_t size);
/* Writes refs/REV holding commit (as huggingface_hub does: no newline), atomically. */
kvq_status kvq_hub_write_ref(const char *repo_dir, const char *rev, const char *commit);
/* snapshots/<commit>/<file> -> ../../blobs/<etag> (one "../" more per sub-folder of file). */
kvq_status kvq_hub_link_blob(const char *repo_dir, const char *commit, const char *file, const char *etag);
/* Marks an optional file the repository does not have (.no_exist/<commit>/<file>). */
void kvq_hub_mark_absent(const char *repo_dir, const char *commit, const char *file);
int kvq_hub_is_absent(const char *repo_dir, const char *commit, const char *file);

/* ---- SHA-256 ---- */
typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t fill;
} kvq_sha256;
void kvq_sha256_init(kvq_sha256 *s);
void kvq_sha256_update(kvq_sha256 *s, const void *p, size_t n);
void kvq_sha256_hex(kvq_sha256 *s, char out[65]);
/* Of a whole file; 0 or -1 (errno) when it cannot be read. */
int kvq_sha256_file(const char *path, char out[65]);

/* ---- resolve and download ---- */
typedef struct {
    const char *prog;  /* prefixes progress lines */
    int need_weights;  /* 0: config and tokenizer files only (kvq-tokenize) */
    int meta_only;     /* --plan: config.json and the index, nothing else */
} kvq_hub_opts;

/* A local directory holding what the load needs: the cache's snapshot if complete, else
 * downloaded into the cache (never with HF_HUB_OFFLINE=1). */
kvq_status kvq_hub_resolve(const kvq_hub_name *n, const kvq_hub_opts *o, char *dir, size_t size);

/* What --plan learns without fetching weights: each weight file's size and header length. */
typedef struct {
    char snapshot[KVQ_HUB_PATH]; /* a directory holding config.json (and the index if any) */
    uint64_t download_bytes;     /* weight files not yet in the cache, plus the small files */
    uint64_t weight_bytes;       /* tensor data of all weight files */
    uint64_t cached_bytes;       /* weight bytes already in the cache */
    int n_weight_files;
} kvq_hub_plan_info;
kvq_status kvq_hub_plan(const kvq_hub_name *n, const kvq_hub_opts *o, kvq_hub_plan_info *out);

/* Bytes free for an unprivileged writer on the file system holding path; -1 unknown. */
int64_t kvq_hub_disk_free(const char *path);

/* 1 when this build can download (libcurl), else 0. */
int kvq_hub_can_download(void);

#endif
