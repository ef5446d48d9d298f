/* A hub name to a local directory: the cache's snapshot when it holds what a load needs,
 * else the repository's commit and file list from the API, config.json checked before any
 * weight is fetched, then the files a load reads. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hub/hub_fetch.h"
#include "model/hparams.h"

kvq_status kvq_hub_ctx_init(kvq_hub_ctx *c, const kvq_hub_name *n, const kvq_hub_opts *o) {
    memset(c, 0, sizeof *c);
    c->n = n, c->o = o;
    kvq_hub_endpoint(c->endpoint, sizeof c->endpoint);
    kvq_hub_token(c->token, sizeof c->token);
    if (kvq_hub_repo_dir(n, c->repo_dir, sizeof c->repo_dir))
        return kvq_fail(KVQ_ERR_IO, "%s: no cache directory (set HF_HOME or HF_HUB_CACHE)", n->repo);
    return KVQ_OK;
}

/* Files the repository lists at that revision (NULL siblings: the API gave no list). */
typedef struct {
    cJSON *root;
    const cJSON *siblings;
} api_info;

static int listed(const api_info *a, const char *file) {
    if (!cJSON_IsArray(a->siblings)) return 1; /* unknown: ask for it */
    for (const cJSON *e = a->siblings->child; e; e = e->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "rfilename");
        if (cJSON_IsString(f) && !strcmp(f->valuestring, file)) return 1;
    }
    return 0;
}

static kvq_status api_revision(kvq_hub_ctx *c, api_info *a) {
    char url[1024];
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", c->endpoint, c->n->repo, c->n->rev);
    kvq_http_req rq = {.follow = 1, .range_to = -1, .body_max = 16u << 20, .token = c->token};
    kvq_http_resp r;
    kvq_status s = kvq_http_request(url, &rq, &r);
    if (s == KVQ_OK && r.status != 200)
        s = kvq_hub_status_error(c, r.status, r.status == 404 && !r.error_code[0] ? "RepoNotFound" : r.error_code, "the model's information");
    if (s == KVQ_OK) {
        a->root = cJSON_Parse(r.body ? r.body : "");
        const cJSON *sha = cJSON_GetObjectItemCaseSensitive(a->root, "sha");
        size_t i = 0;
        if (cJSON_IsString(sha))
            for (; i < 40 && isxdigit((unsigned char)sha->valuestring[i]) && !isupper((unsigned char)sha->valuestring[i]); i++) {}
        if (i != 40 || sha->valuestring[40]) {
            s = kvq_fail(KVQ_ERR_FORMAT, "%s: the hub's answer for revision '%s' has no commit sha", c->n->repo, c->n->rev);
        } else {
            memcpy(c->commit, sha->valuestring, 41);
            a->siblings = cJSON_GetObjectItemCaseSensitive(a->root, "siblings");
        }
    }
    kvq_http_resp_free(&r);
    return s;
}

/* HEAD then fetch one file; *got 0 when an optional one is absent. */
static kvq_status get_one(kvq_hub_ctx *c, const api_info *a, const char *file, int optional, int *got) {
    *got = 0;
    if (optional && (!listed(a, file) || kvq_hub_is_absent(c->repo_dir, c->commit, file))) {
        kvq_hub_mark_absent(c->repo_dir, c->commit, file);
        return KVQ_OK;
    }
    kvq_hub_meta m;
    kvq_status s = kvq_hub_head(c, file, optional, &m);
    if (s != KVQ_OK) return s;
    if (m.absent) {
        kvq_hub_mark_absent(c->repo_dir, c->commit, file);
        return KVQ_OK;
    }
    *got = 1;
    return kvq_hub_fetch_file(c, file, &m);
}

static kvq_status check_config(const kvq_hub_ctx *c, const char *snap) {
    kvq_hparams hp;
    kvq_status s = kvq_hparams_load(snap, &hp);
    kvq_hparams_free(&hp);
    if (s == KVQ_OK) return KVQ_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kvq_last_error());
    const char *tail = strstr(msg, "config.json: ");
    return kvq_fail(s, "%s: %s (no weights were downloaded)", c->n->repo, tail ? tail + 13 : msg);
}

/* The weight files: the index's shards, or model.safetensors. */
static kvq_status weight_list(kvq_hub_ctx *c, const api_info *a, const char *snap, kvq_hub_files *w) {
    int got = 0;
    kvq_status s = KVQ_OK;
    if (listed(a, "model.safetensors.index.json") && (s = get_one(c, a, "model.safetensors.index.json", 1, &got))) return s;
    if (!got) return kvq_hub_files_add(w, "model.safetensors", 0);
    char p[KVQ_HUB_PATH + 64], *text;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", snap);
    if ((s = kvq_read_file(p, &text, NULL))) return s;
    s = kvq_hub_index_shards(text, p, w);
    free(text);
    return s;
}

static const char *const SMALL[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
static const int SMALL_OPTIONAL[] = {0, 1, 0, 1, 1};

static kvq_status fetch_meta(kvq_hub_ctx *c, api_info *a, char *snap, size_t size) {
    kvq_status s = api_revision(c, a);
    if (s != KVQ_OK) return s;
    if (kvq_hub_snapshot_dir(c->repo_dir, c->commit, snap, size)) return kvq_fail(KVQ_ERR_IO, "cache path too long");
    if (strcmp(c->n->rev, c->commit) && (s = kvq_hub_write_ref(c->repo_dir, c->n->rev, c->commit))) return s;
    int got;
    if ((s = get_one(c, a, "config.json", 0, &got))) return s;
    return check_config(c, snap);
}

kvq_status kvq_hub_resolve(const kvq_hub_name *n, const kvq_hub_opts *o, char *dir, size_t size) {
    kvq_hub_ctx c;
    kvq_status s = kvq_hub_ctx_init(&c, n, o);
    if (s != KVQ_OK) return s;
    char commit[41], snap[KVQ_HUB_PATH], miss[512];
    int cached = kvq_hub_cache_commit(c.repo_dir, n->rev, commit) == 0 && kvq_hub_snapshot_dir(c.repo_dir, commit, snap, sizeof snap) == 0;
    const char *missing = cached ? kvq_hub_snapshot_missing(snap, o->need_weights, miss, sizeof miss) : "refs";
    if (cached && !missing) {
        snprintf(dir, size, "%s", snap);
        return KVQ_OK;
    }
    if (kvq_hub_offline()) {
        if (!cached)
            return kvq_fail(KVQ_ERR_IO, "%s: HF_HUB_OFFLINE=1 and revision '%s' is not in the cache (%s); unset HF_HUB_OFFLINE to download it",
                            n->repo, n->rev, c.repo_dir);
        return kvq_fail(KVQ_ERR_IO, "%s: HF_HUB_OFFLINE=1 and the cached snapshot %s lacks %s; unset HF_HUB_OFFLINE to download it", n->repo, snap,
                        missing);
    }
    if (!kvq_hub_can_download())
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s is not in the cache (%s) and downloads need libcurl: install libcurl4-openssl-dev and rebuild kvq",
                        n->repo, c.repo_dir);
    api_info a = {0};
    kvq_hub_files w = {0};
    if ((s = fetch_meta(&c, &a, snap, sizeof snap))) goto done;
    for (size_t i = 1; i < sizeof SMALL / sizeof *SMALL; i++) {
        int got;
        if ((s = get_one(&c, &a, SMALL[i], SMALL_OPTIONAL[i], &got))) goto done;
    }
    if (o->need_weights) {
        if ((s = weight_list(&c, &a, snap, &w))) goto done;
        /* all sizes first: a disk too small is said before any weight is written */
        kvq_hub_meta m[KVQ_HUB_MAX_FILES];
        int64_t need = 0;
        for (int i = 0; i < w.n; i++) {
            if ((s = kvq_hub_head(&c, w.names[i], 0, &m[i]))) goto done;
            if (!kvq_hub_blob_present(&c, &m[i]) && m[i].size > 0) need += m[i].size;
        }
        char blobs[KVQ_HUB_PATH + 8], x[32], y[32];
        snprintf(blobs, sizeof blobs, "%s/blobs", c.repo_dir);
        kvq_hub_mkdirs(blobs);
        int64_t avail = kvq_hub_disk_free(blobs);
        if (avail >= 0 && need > avail) {
            s = kvq_fail(KVQ_ERR_IO, "%s: not enough disk space: the weights need %s, %s free in %s", n->repo, kvq_hub_bytes((double)need, x, sizeof x),
                         kvq_hub_bytes((double)avail, y, sizeof y), blobs);
            goto done;
        }
        for (int i = 0; i < w.n; i++)
            if ((s = kvq_hub_fetch_file(&c, w.names[i], &m[i]))) goto done;
    }
    missing = kvq_hub_snapshot_missing(snap, o->need_weights, miss, sizeof miss);
    if (missing) s = kvq_fail(KVQ_ERR_FORMAT, "%s: the repository has no %s at revision '%s'", n->repo, missing, n->rev);
    else snprintf(dir, size, "%s", snap);
done:
    kvq_hub_files_free(&w);
    cJSON_Delete(a.root);
    return s;
}

/* Size of a safetensors file and of its tensor data, from its first 8 bytes (the header's
 * length): from the file when cached, else by a Range request. */
static kvq_status weight_size(kvq_hub_ctx *c, const char *snap, const char *file, uint64_t *total, uint64_t *data, int *cached) {
    char p[KVQ_HUB_PATH + 300];
    unsigned char head[8];
    snprintf(p, sizeof p, "%s/%s", snap, file);
    FILE *f = fopen(p, "rb");
    struct stat st;
    *cached = f && fstat(fileno(f), &st) == 0 && fread(head, 1, 8, f) == 8;
    if (f) fclose(f);
    if (*cached) {
        *total = (uint64_t)st.st_size;
    } else {
        if (kvq_hub_offline()) return kvq_fail(KVQ_ERR_IO, "%s: HF_HUB_OFFLINE=1 and %s is not in the cache", c->n->repo, file);
        char url[2048];
        kvq_hub_resolve_url(c, file, url, sizeof url);
        kvq_http_req rq = {.follow = 1, .range_from = 0, .range_to = 7, .body_max = 64, .token = c->token};
        kvq_http_resp r;
        kvq_status s = kvq_http_request(url, &rq, &r);
        if (s == KVQ_OK && r.status != 206) s = r.status == 200 ? kvq_fail(KVQ_ERR_FORMAT, "%s: the hub ignored a Range request for %s", c->n->repo, file)
                                                                 : kvq_hub_status_error(c, r.status, r.error_code, file);
        if (s == KVQ_OK && (r.body_len != 8 || r.range_total < 8)) s = kvq_fail(KVQ_ERR_FORMAT, "%s: %s: bad answer to a Range request", c->n->repo, file);
        if (s == KVQ_OK) memcpy(head, r.body, 8), *total = (uint64_t)r.range_total;
        kvq_http_resp_free(&r);
        if (s != KVQ_OK) return s;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | head[i];
    if (hl > (100u << 20) || hl > *total - 8) return kvq_fail(KVQ_ERR_FORMAT, "%s: %s: bad safetensors header length %llu", c->n->repo, file, (unsigned long long)hl);
    *data = *total - 8 - hl;
    return KVQ_OK;
}

kvq_status kvq_hub_plan(const kvq_hub_name *n, const kvq_hub_opts *o, kvq_hub_plan_info *out) {
    memset(out, 0, sizeof *out);
    kvq_hub_ctx c;
    kvq_status s = kvq_hub_ctx_init(&c, n, o);
    if (s != KVQ_OK) return s;
    char miss[512];
    int have = kvq_hub_cache_commit(c.repo_dir, n->rev, c.commit) == 0 &&
               kvq_hub_snapshot_dir(c.repo_dir, c.commit, out->snapshot, sizeof out->snapshot) == 0;
    /* the cache answers alone when it holds the whole model, or when the network is off limits */
    int cached = have && (!kvq_hub_snapshot_missing(out->snapshot, 1, miss, sizeof miss) ||
                          (kvq_hub_offline() && !kvq_hub_snapshot_missing(out->snapshot, 0, miss, sizeof miss)));
    api_info a = {0};
    kvq_hub_files w = {0};
    if (!cached) {
        if (kvq_hub_offline())
            return kvq_fail(KVQ_ERR_IO, "%s: HF_HUB_OFFLINE=1 and revision '%s' is not in the cache (%s)", n->repo, n->rev, c.repo_dir);
        if (!kvq_hub_can_download())
            return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s is not in the cache and downloads need libcurl: install libcurl4-openssl-dev and rebuild kvq", n->repo);
        if ((s = fetch_meta(&c, &a, out->snapshot, sizeof out->snapshot)) || (s = weight_list(&c, &a, out->snapshot, &w))) goto done;
    } else {
        char p[KVQ_HUB_PATH + 64], *text;
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", out->snapshot);
        if (kvq_read_file(p, &text, NULL) == KVQ_OK) {
            s = kvq_hub_index_shards(text, p, &w);
            free(text);
        } else {
            kvq_clear_error();
            s = kvq_hub_files_add(&w, "model.safetensors", 0);
        }
        if (s != KVQ_OK || (s = check_config(&c, out->snapshot))) goto done;
    }
    for (int i = 0; i < w.n; i++) {
        uint64_t total = 0, data = 0;
        int in_cache;
        if ((s = weight_size(&c, out->snapshot, w.names[i], &total, &data, &in_cache))) goto done;
        out->weight_bytes += data;
        if (in_cache) out->cached_bytes += total;
        else out->download_bytes += total;
    }
    out->n_weight_files = w.n;
done:
    kvq_hub_files_free(&w);
    cJSON_Delete(a.root);
    return s;
}
