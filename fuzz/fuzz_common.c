#include "fuzz_common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[512];

static void remove_dir(void) {
    DIR *d = opendir(g_dir);
    if (!d) return;
    char p[1024];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(g_dir);
}

const char *fz_tmpdir(void) {
    if (g_dir[0]) return g_dir;
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/kvq-fuzz-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("kvq fuzz: mkdtemp");
        abort();
    }
    atexit(remove_dir);
    return g_dir;
}

void fz_write(const char *dir, const char *name, const void *data, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!data) {
        unlink(p);
        return;
    }
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(p);
        abort();
    }
}

void fz_check_error(const char *needle) {
    const char *m = kvq_last_error();
    if (!m[0] || strchr(m, '\n') || (needle && !strstr(m, needle))) {
        fprintf(stderr, "kvq fuzz: bad error message '%s' (want one line naming '%s')\n", m, needle ? needle : "");
        abort();
    }
}

int fz_tokenizers(const kvq_tokenizer ***out) {
    static const kvq_tokenizer *toks[8];
    static int n = -1;
    if (n < 0) {
        n = 0;
        char list[4096];
        const char *env = getenv("KVQ_FUZZ_TOKENIZERS");
        if (env && *env)
            snprintf(list, sizeof list, "%s", env);
        else
            snprintf(list, sizeof list, "%s/fixtures/tokenizers/llama2:%s/fixtures/tokenizers/llama3:"
                     "%s/fixtures/tokenizers/mistral:%s/models/demo",
                     KVQ_SHARED_DIR, KVQ_SHARED_DIR, KVQ_SHARED_DIR, KVQ_SOURCE_DIR);
        for (char *save = NULL, *d = strtok_r(list, ":", &save); d && n < 8; d = strtok_r(NULL, ":", &save)) {
            kvq_tokenizer *t;
            if (kvq_tokenizer_load(d, &t) == KVQ_OK) toks[n++] = t;
        }
        if (!n) {
            fprintf(stderr, "kvq fuzz: no tokenizer loaded (set KVQ_FUZZ_TOKENIZERS)\n");
            abort();
        }
    }
    *out = toks;
    return n;
}
