/* Hub names, the environment huggingface_hub reads (cache root, endpoint, token, offline),
 * and the list of files a load needs. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hub/hub.h"

static int name_char(int c) { return isalnum(c) || c == '.' || c == '_' || c == '-'; }

/* One part of a repo id: 1..95 name characters, not starting with '.' or '-', no "..". */
static int copy_part(const char *s, size_t n, char *out, size_t size) {
    if (n == 0 || n >= size || s[0] == '.' || s[0] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!name_char((unsigned char)s[i]) || (s[i] == '.' && i + 1 < n && s[i + 1] == '.')) return 0;
    memcpy(out, s, n);
    out[n] = 0;
    return 1;
}

int kvq_hub_parse_name(const char *s, kvq_hub_name *out) {
    memset(out, 0, sizeof *out);
    if (!s) return 0;
    const char *slash = strchr(s, '/');
    if (!slash || strchr(slash + 1, '/')) {
        /* a revision may not hold '/', so a second slash means a path */
        return 0;
    }
    const char *colon = strchr(slash + 1, ':');
    size_t nl = colon ? (size_t)(colon - slash - 1) : strlen(slash + 1);
    if (!copy_part(s, (size_t)(slash - s), out->org, sizeof out->org) || !copy_part(slash + 1, nl, out->name, sizeof out->name))
        return 0;
    if (colon && !copy_part(colon + 1, strlen(colon + 1), out->rev, sizeof out->rev)) return 0;
    if (!colon) snprintf(out->rev, sizeof out->rev, "main");
    snprintf(out->repo, sizeof out->repo, "%s/%s", out->org, out->name);
    return 1;
}

static const char *env(const char *k) {
    const char *v = getenv(k);
    return v && *v ? v : NULL;
}

/* $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface. */
static int hf_home(char *buf, size_t size) {
    const char *h = env("HF_HOME"), *x = env("XDG_CACHE_HOME"), *home = env("HOME");
    int n;
    if (h) n = snprintf(buf, size, "%s", h);
    else if (x) n = snprintf(buf, size, "%s/huggingface", x);
    else if (home) n = snprintf(buf, size, "%s/.cache/huggingface", home);
    else return -1;
    return n > 0 && (size_t)n < size ? 0 : -1;
}

int kvq_hub_cache_root(char *buf, size_t size) {
    const char *c = env("HF_HUB_CACHE");
    if (!c) c = env("HUGGINGFACE_HUB_CACHE");
    if (c) {
        int n = snprintf(buf, size, "%s", c);
        return n > 0 && (size_t)n < size ? 0 : -1;
    }
    char home[KVQ_HUB_PATH];
    if (hf_home(home, sizeof home)) return -1;
    int n = snprintf(buf, size, "%s/hub", home);
    return n > 0 && (size_t)n < size ? 0 : -1;
}

int kvq_hub_repo_dir(const kvq_hub_name *nm, char *buf, size_t size) {
    char root[KVQ_HUB_PATH];
    if (kvq_hub_cache_root(root, sizeof root)) return -1;
    int n = snprintf(buf, size, "%s/models--%s--%s", root, nm->org, nm->name);
    return n > 0 && (size_t)n < size ? 0 : -1;
}

int kvq_hub_offline(void) {
    const char *v = env("HF_HUB_OFFLINE");
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

const char *kvq_hub_endpoint(char *buf, size_t size) {
    const char *e = env("HF_ENDPOINT");
    snprintf(buf, size, "%s", e ? e : "https://huggingface.co");
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '/') buf[--n] = 0;
    return buf;
}

void kvq_hub_token(char *buf, size_t size) {
    buf[0] = 0;
    const char *t = env("HF_TOKEN");
    if (!t) t = env("HUGGING_FACE_HUB_TOKEN");
    if (t) {
        snprintf(buf, size, "%s", t);
    } else {
        char path[KVQ_HUB_PATH + 8];
        const char *p = env("HF_TOKEN_PATH");
        if (p) snprintf(path, sizeof path, "%s", p);
        else {
            char home[KVQ_HUB_PATH];
            if (hf_home(home, sizeof home)) return;
            snprintf(path, sizeof path, "%s/token", home);
        }
        FILE *f = fopen(path, "r");
        if (!f) return;
        if (!fgets(buf, (int)size, f)) buf[0] = 0;
        fclose(f);
    }
    /* trim: a header value must not carry a newline */
    size_t n = strlen(buf);
    while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 0x21 || buf[i] == 0x7f) {
            buf[0] = 0;
            return;
        }
}

int kvq_hub_safe_file_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 255 || name[0] == '/') return 0;
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == 0 || (l == 1 && p[0] == '.') || (l == 2 && p[0] == '.' && p[1] == '.')) return 0;
        for (size_t i = 0; i < l; i++)
            if ((unsigned char)p[i] < 0x20 || p[i] == '\\') return 0;
        p += l + (e ? 1 : 0);
        if (e && !*p) return 0;
    }
    return 1;
}

void kvq_hub_files_free(kvq_hub_files *f) {
    for (int i = 0; i < f->n; i++) free(f->names[i]);
    f->n = 0;
}

kvq_status kvq_hub_files_add(kvq_hub_files *f, const char *name, int optional) {
    if (!kvq_hub_safe_file_name(name)) return kvq_fail(KVQ_ERR_FORMAT, "unsafe file name '%.80s' in the repository", name);
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) return KVQ_OK;
    if (f->n >= KVQ_HUB_MAX_FILES) return kvq_fail(KVQ_ERR_FORMAT, "more than %d files to fetch", KVQ_HUB_MAX_FILES);
    if (!(f->names[f->n] = strdup(name))) return kvq_fail(KVQ_ERR_NOMEM, "out of memory");
    f->optional[f->n++] = optional;
    return KVQ_OK;
}

kvq_status kvq_hub_index_shards(const char *text, const char *path, kvq_hub_files *f) {
    cJSON *root = cJSON_Parse(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return kvq_fail(KVQ_ERR_FORMAT, "%s: no weight_map object", path);
    }
    kvq_status s = KVQ_OK;
    int any = 0;
    for (const cJSON *e = wm->child; e && s == KVQ_OK; e = e->next) {
        if (!cJSON_IsString(e)) s = kvq_fail(KVQ_ERR_FORMAT, "%s: weight_map holds a non-string", path);
        else s = kvq_hub_files_add(f, e->valuestring, 0), any = 1;
    }
    if (s == KVQ_OK && !any) s = kvq_fail(KVQ_ERR_FORMAT, "%s: weight_map is empty", path);
    cJSON_Delete(root);
    return s;
}
