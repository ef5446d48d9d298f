#include "common.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int has_config(const char *dir) {
    char p[PATH_MAX + 16];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", dir);
    return stat(p, &st) == 0;
}

const char *kvq_tool_demo_model(void) {
    static char buf[PATH_MAX];
    /* <exe dir>/../share/kvq/models/demo covers a relocated install. */
    char exe[PATH_MAX - 64]; /* leaves room for the suffix below */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, sizeof buf, "%s/../share/kvq/models/demo", exe);
            if (has_config(buf)) return buf;
        }
    }
    const char *env = getenv("KVQ_DEMO_MODEL");
    if (env && has_config(env)) return env;
#ifdef KVQ_DEMO_MODEL_SRC
    if (has_config(KVQ_DEMO_MODEL_SRC)) return KVQ_DEMO_MODEL_SRC;
#endif
#ifdef KVQ_DEMO_MODEL_INSTALL
    if (has_config(KVQ_DEMO_MODEL_INSTALL)) return KVQ_DEMO_MODEL_INSTALL;
#endif
    return NULL;
}

int kvq_tool_die(const char *prog, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n') *p = ' ';
    fprintf(stderr, "%s: %s\n", prog, msg);
    return 1;
}

int kvq_tool_parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int kvq_tool_parse_float(const char *s, double *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

double kvq_tool_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int kvq_tool_version(const char *prog, int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--version")) {
            printf("%s %s\n", prog, kvq_version());
            return 1;
        }
    return 0;
}

void kvq_tool_report_backend(const char *prog, const kvq_model *m) {
    const char *note = kvq_model_backend_note(m);
    if (note && *note) fprintf(stderr, "%s: %s; using the next backend\n", prog, note);
    fprintf(stderr, "%s: backend %s\n", prog, kvq_model_backend_name(m));
    fprintf(stderr, "%s: %s\n", prog, kvq_model_plan(m));
}

int kvq_tool_parse_ngl(const char *s, int *out) {
    long v;
    if (!strcmp(s, "all")) v = -1;
    else if (kvq_tool_parse_int(s, -1, 1 << 20, &v)) return 1;
    *out = (int)v;
    return 0;
}
