/* Shared bits of the command-line tools: demo model lookup, errors, numbers. */
#ifndef KVQ_TOOLS_COMMON_H
#define KVQ_TOOLS_COMMON_H

#include <stdint.h>
#include "kvq.h"

/* Directory of the demo model shipped with kvq: next to the executable's build
 * tree, the source tree, or the install tree. NULL if none is found. */
const char *kvq_tool_demo_model(void);

/* Prints "<prog>: <msg>" on stderr (one line) and returns 1 (for `return die(...)`). */
int kvq_tool_die(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* For a tool's flag loop, with `a` (the flag), `v` (the next argument or NULL), `i` and `P`
 * (the program's name) in scope: FLAG_IS matches either spelling of a flag; FLAG_VALUE takes v
 * as the flag's value, or ends the parse (the function returns non-zero) with one line. */
#define FLAG_IS(x, y) (!strcmp(a, x) || !strcmp(a, y))
#define FLAG_VALUE()                                                      \
    do {                                                                  \
        if (!v) return kvq_tool_die(P, "option %s needs a value", a) + 1; \
        i++;                                                              \
    } while (0)

/* Strict number parsing: return 0 and set *out on success, -1 on junk. */
int kvq_tool_parse_int(const char *s, long lo, long hi, long *out);
/* -ngl / --n-gpu-layers: a count, "all" / -1 (every layer) or "auto" (what the device's memory
 * holds); non-zero on a bad value. */
int kvq_tool_parse_ngl(const char *s, int *out);

/* The model, backend and cache flags every model-running tool takes, each pointing at the
 * tool's own option field: -m, --backend, --device, -ngl, --aqlm-cb8, --aqlm-lut8, --aqlm-i8, --no-aqlm-i8, --exact, -c, -b, -t,
 * -ctk, -ctv, --kv-rotate, --no-kv-rotate. */
typedef struct {
    const char **model, **backend, **device;
    long *n_ctx, *n_batch, *threads;
    int *type_k, *type_v, *kv_rotate, *aqlm_cb8, *aqlm_lut8, *aqlm_i8, *ngl, *exact;
} kvq_tool_model_flags;

/* argv[*i] as one of those flags: 1 when it was (its value taken, *i advanced past it), 0 when it
 * is not one of them, -1 after printing one line when its value is missing or bad. */
int kvq_tool_model_flag(const char *prog, const kvq_tool_model_flags *f, int argc, char **argv, int *i);
/* --chat-template NAME: 0 for a family kvq renders, else prints one line and returns -1. */
int kvq_tool_check_template_name(const char *prog, const char *name);
int kvq_tool_parse_float(const char *s, double *out);

/* With --version among the arguments: prints "<prog> <kvq version>" and returns 1
 * (main then exits 0); otherwise 0. */
int kvq_tool_version(const char *prog, int argc, char **argv);

/* Prints the backend and device in use on stderr, with the reason when automatic
 * selection passed over a GPU backend (one line each). */
struct kvq_model;
void kvq_tool_report_backend(const char *prog, const struct kvq_model *m);
/* Prints a context's warning (kvq_context_note: the GPU put its cache in host memory) on stderr. */
struct kvq_context;
void kvq_tool_report_context(const char *prog, const struct kvq_context *c);

/* Monotonic seconds. */
double kvq_tool_now(void);

#endif
