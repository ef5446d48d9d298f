#include <stdio.h>
#include <string.h>

#include "backend.h"

/* Backends built into this library, preferred first. A GPU backend goes
 * ahead of the CPU one when it is compiled in; it fails init() cleanly where
 * no device exists and the loader falls through to the next. */
static const kvq_backend *const g_backends[] = {
#ifdef KVQ_HAVE_VULKAN
    &kvq_backend_vulkan,
#endif
    &kvq_backend_cpu,
};

int kvq_backend_count(void) { return (int)(sizeof g_backends / sizeof g_backends[0]); }

const kvq_backend *kvq_backend_get(int i) {
    return i >= 0 && i < kvq_backend_count() ? g_backends[i] : NULL;
}

const kvq_backend *kvq_backend_find(const char *name) {
    for (int i = 0; i < kvq_backend_count(); i++)
        if (strcmp(g_backends[i]->name, name) == 0) return g_backends[i];
    return NULL;
}

const char *kvq_backend_names(void) {
    static char names[128];
    if (!names[0])
        for (int i = 0; i < kvq_backend_count(); i++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", i ? ", " : "", g_backends[i]->name);
        }
    return names;
}
