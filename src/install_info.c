/* kvq_version and kvq_demo_model_dir: where an installed kvq keeps its demo model. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq.h"

const char *kvq_version(void) { return KVQ_VERSION_STRING; }

static int has_config(const char *dir) {
    char p[PATH_MAX + 96];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", dir);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir of the object holding this code (libkvq.so, or the program for libkvq.a) + rel */
static int beside_me(const char *rel, char *out, size_t size) {
    Dl_info info;
    if (!dladdr((void *)kvq_demo_model_dir, &info) || !info.dli_fname || !strchr(info.dli_fname, '/')) return 0;
    char real[PATH_MAX];
    if (!realpath(info.dli_fname, real)) return 0;
    *strrchr(real, '/') = 0;
    if ((size_t)snprintf(out, size, "%s/%s", real, rel) >= size) return 0;
    return has_config(out);
}

const char *kvq_demo_model_dir(void) {
    static _Thread_local char buf[PATH_MAX + 64];
    const char *env = getenv("KVQ_DEMO_MODEL");
    if (env && *env) return has_config(env) ? env : NULL; /* an explicit choice is not second-guessed */
    if (beside_me(KVQ_DEMO_FROM_LIB, buf, sizeof buf) || beside_me(KVQ_DEMO_FROM_BIN, buf, sizeof buf)) return buf;
    if (has_config(KVQ_DEMO_INSTALLED)) return KVQ_DEMO_INSTALLED;
    if (has_config(KVQ_DEMO_SOURCE)) return KVQ_DEMO_SOURCE;
    return NULL;
}
