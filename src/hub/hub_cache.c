/* The Hugging Face cache as huggingface_hub lays it out:
 *   models--ORG--NAME/refs/REV               the commit hash REV points at (no newline)
 *   models--ORG--NAME/snapshots/COMMIT/FILE  relative symlink to ../../blobs/ETAG
 *   models--ORG--NAME/blobs/ETAG             the content (ETAG: sha256 for LFS files, git sha1 else)
 *   models--ORG--NAME/.no_exist/COMMIT/FILE  an optional file the repository does not have */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub/hub.h"

int kvq_hub_mkdirs(const char *path) {
    char p[KVQ_HUB_PATH];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

static int is_commit(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n]) || isupper((unsigned char)s[n])) return 0;
    return n == 40;
}

int kvq_hub_cache_commit(const char *repo_dir, const char *rev, char commit[41]) {
    if (is_commit(rev)) {
        memcpy(commit, rev, 41);
        return 0;
    }
    char p[KVQ_HUB_PATH + 256];
    snprintf(p, sizeof p, "%s/refs/%s", repo_dir, rev);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    char buf[64] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    if (!is_commit(buf)) return -1;
    memcpy(commit, buf, 41);
    return 0;
}

int kvq_hub_snapshot_dir(const char *repo_dir, const char *commit, char *buf, size_t size) {
    int n = snprintf(buf, size, "%s/snapshots/%s", repo_dir, commit);
    return n > 0 && (size_t)n < size ? 0 : -1;
}

static int present(const char *dir, const char *name) {
    char p[KVQ_HUB_PATH + 300];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode); /* stat follows the link: a dangling one is missing */
}

const char *kvq_hub_snapshot_missing(const char *dir, int need_weights, char *buf, size_t size) {
    static const char *const always[] = {"config.json", "tokenizer.json"};
    for (size_t i = 0; i < sizeof always / sizeof *always; i++)
        if (!present(dir, always[i])) return snprintf(buf, size, "%s", always[i]), buf;
    if (!need_weights) return NULL;
    if (!present(dir, "model.safetensors.index.json")) {
        if (present(dir, "model.safetensors")) return NULL;
        return snprintf(buf, size, "model.safetensors"), buf;
    }
    char p[KVQ_HUB_PATH + 64];
    char *text;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (kvq_read_file(p, &text, NULL) != KVQ_OK) return snprintf(buf, size, "model.safetensors.index.json"), buf;
    kvq_hub_files f = {0};
    kvq_status s = kvq_hub_index_shards(text, p, &f);
    free(text);
    const char *miss = NULL;
    if (s != KVQ_OK) miss = "model.safetensors.index.json";
    for (int i = 0; !miss && i < f.n; i++)
        if (!present(dir, f.names[i])) miss = f.names[i];
    if (miss) snprintf(buf, size, "%s", miss);
    kvq_hub_files_free(&f);
    kvq_clear_error();
    return miss ? buf : NULL;
}

kvq_status kvq_hub_write_ref(const char *repo_dir, const char *rev, const char *commit) {
    char p[KVQ_HUB_PATH + 256], tmp[KVQ_HUB_PATH + 300];
    snprintf(p, sizeof p, "%s/refs", repo_dir);
    if (kvq_hub_mkdirs(p)) return kvq_fail(KVQ_ERR_IO, "%s: cannot create: %s", p, strerror(errno));
    snprintf(p, sizeof p, "%s/refs/%s", repo_dir, rev);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", p, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return kvq_fail(KVQ_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    int ok = fputs(commit, f) >= 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, p)) {
        unlink(tmp);
        return kvq_fail(KVQ_ERR_IO, "%s: cannot write: %s", p, strerror(errno));
    }
    return KVQ_OK;
}

/* Creates the folders of snapshots/<commit>/<file> and returns its depth below the commit. */
static int make_parent(const char *base, const char *file) {
    char p[KVQ_HUB_PATH + 300];
    snprintf(p, sizeof p, "%s/%s", base, file);
    char *slash = strrchr(p, '/');
    *slash = 0;
    if (kvq_hub_mkdirs(p)) return -1;
    int depth = 0;
    for (const char *s = file; *s; s++) depth += *s == '/';
    return depth;
}

kvq_status kvq_hub_link_blob(const char *repo_dir, const char *commit, const char *file, const char *etag) {
    char snap[KVQ_HUB_PATH + 64], link[KVQ_HUB_PATH + 320], tmp[KVQ_HUB_PATH + 360], target[KVQ_HUB_PATH];
    if (kvq_hub_snapshot_dir(repo_dir, commit, snap, sizeof snap)) return kvq_fail(KVQ_ERR_IO, "cache path too long");
    int depth = make_parent(snap, file);
    if (depth < 0) return kvq_fail(KVQ_ERR_IO, "%s: cannot create: %s", snap, strerror(errno));
    size_t o = 0;
    for (int i = 0; i < depth + 2 && o + 4 < sizeof target; i++) memcpy(target + o, "../", 3), o += 3;
    snprintf(target + o, sizeof target - o, "blobs/%s", etag);
    snprintf(link, sizeof link, "%s/%s", snap, file);
    snprintf(tmp, sizeof tmp, "%s.%ld.link", link, (long)getpid());
    unlink(tmp);
    /* a new link renamed over the old one: readers never see the name missing */
    if (symlink(target, tmp) || rename(tmp, link)) {
        int e = errno;
        unlink(tmp);
        return kvq_fail(KVQ_ERR_IO, "%s: cannot link to %s: %s", link, target, strerror(e));
    }
    return KVQ_OK;
}

static void absent_path(const char *repo_dir, const char *commit, const char *file, char *buf, size_t size) {
    snprintf(buf, size, "%s/.no_exist/%s/%s", repo_dir, commit, file);
}

void kvq_hub_mark_absent(const char *repo_dir, const char *commit, const char *file) {
    char base[KVQ_HUB_PATH + 64], p[KVQ_HUB_PATH + 320];
    snprintf(base, sizeof base, "%s/.no_exist/%s", repo_dir, commit);
    if (make_parent(base, file) < 0) return;
    absent_path(repo_dir, commit, file, p, sizeof p);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
}

int kvq_hub_is_absent(const char *repo_dir, const char *commit, const char *file) {
    char p[KVQ_HUB_PATH + 320];
    absent_path(repo_dir, commit, file, p, sizeof p);
    return access(p, F_OK) == 0;
}
