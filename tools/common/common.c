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

void kvq_tool_report_context(const char *prog, const kvq_context *c) {
    const char *note = kvq_context_note(c);
    if (note && *note) fprintf(stderr, "%s: %s\n", prog, note);
}

int kvq_tool_parse_ngl(const char *s, int *out) {
    long v;
    if (!strcmp(s, "all")) v = -1;
    else if (!strcmp(s, "auto")) v = KVQ_GPU_LAYERS_AUTO;
    else if (kvq_tool_parse_int(s, -1, 1 << 20, &v)) return 1;
    *out = (int)v;
    return 0;
}

int kvq_tool_model_flag(const char *prog, const kvq_tool_model_flags *f, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (FLAG_IS("--aqlm-cb8", "--aqlm-cb8")) return *f->aqlm_cb8 = 1;
    if (FLAG_IS("--aqlm-lut8", "--aqlm-lut8")) return *f->aqlm_lut8 = 1;
    if (FLAG_IS("--aqlm-i8", "--aqlm-i8")) return (*f->aqlm_i8 = 2) - 1; /* 2: on whatever the CPU class */
    if (FLAG_IS("--no-aqlm-i8", "--no-aqlm-i8")) return (*f->aqlm_i8 = 0) + 1;
    if (FLAG_IS("--exact", "--exact")) return *f->exact = 1;
    if (FLAG_IS("--kv-rotate", "--kv-rotate")) return (*f->kv_rotate = 1);
    if (FLAG_IS("--no-kv-rotate", "--no-kv-rotate")) return (*f->kv_rotate = 0) + 1;
    if (f->plan && FLAG_IS("--plan", "--plan")) return *f->plan = 1;
    static const char *const valued[] = {"-m",  "--model", "-hf", "--hf-repo", "--backend",    "--device",         "-ngl", "--n-gpu-layers",
                                         "--gpu-layers", "-c", "--ctx-size", "-b", "--batch-size", "-t", "--threads",
                                         "-ctk", "--cache-type-k", "-ctv", "--cache-type-v"};
    int ours = 0;
    for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) ours |= !strcmp(a, valued[k]);
    if (!ours) return 0;
    if (!v) return kvq_tool_die(prog, "option %s needs a value", a), -1;
    ++*i;
    int bad = 0;
    if (kvq_tool_is_model_flag(a)) *f->model = v;
    else if (FLAG_IS("--backend", "--backend")) *f->backend = v;
    else if (FLAG_IS("--device", "--device")) *f->device = v;
    else if (FLAG_IS("-ngl", "--n-gpu-layers") || FLAG_IS("--gpu-layers", "--gpu-layers")) bad = kvq_tool_parse_ngl(v, f->ngl);
    else if (FLAG_IS("-c", "--ctx-size")) {
        bad = kvq_tool_parse_int(v, 0, 1 << 30, f->n_ctx);
        if (!bad && *f->n_ctx == 0) *f->n_ctx = KVQ_TOOL_CTX_TRAINED;
    }
    else if (FLAG_IS("-b", "--batch-size")) bad = kvq_tool_parse_int(v, 1, 1 << 20, f->n_batch);
    else if (FLAG_IS("-t", "--threads")) bad = kvq_tool_parse_int(v, 1, 1024, f->threads);
    else if (FLAG_IS("-ctk", "--cache-type-k") || FLAG_IS("-ctv", "--cache-type-v")) {
        int t = kvq_tool_parse_cache_type(v);
        if (t < 0) return kvq_tool_die(prog, "bad value '%s' for %s: the cache types are " KVQ_TOOL_CACHE_TYPES, v, a), -1;
        *(a[strlen(a) - 1] == 'k' ? f->type_k : f->type_v) = t;
    }
    if (bad) return kvq_tool_die(prog, "bad value '%s' for %s", v, a), -1;
    return 1;
}

int kvq_tool_check_template_name(const char *prog, const char *name) {
    static const char *const names[] = {"none", "llama2", "llama3", "mistral", "chatml", "phi3", "gemma", "command-r"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i])) return 0;
    kvq_tool_die(prog, "unknown chat template '%s' (none, llama2, llama3, mistral, chatml, phi3, gemma, command-r)", name);
    return -1;
}
