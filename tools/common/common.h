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
    int *plan; /* --plan; NULL: the tool has none */
} kvq_tool_model_flags;

/* -c 0: the model's trained context, known once it is loaded (kvq_tool_ctx). */
#define KVQ_TOOL_CTX_TRAINED (-1L)
struct kvq_model;
long kvq_tool_ctx(long n_ctx, const struct kvq_model *m);

/* -m, --model, -hf, --hf-repo */
int kvq_tool_is_model_flag(const char *a);
/* 1 when model is no existing directory but reads as a hub name ORG/NAME[:REVISION]. */
int kvq_tool_hub_name(const char *model);
/* A hub name in *model becomes the directory of its snapshot in the Hugging Face cache,
 * downloaded first when the cache lacks it (weights only when need_weights); an existing
 * directory or anything else is left as it is. 0, or 1 after printing one line. */
int kvq_tool_model_dir(const char *prog, const char **model, int need_weights);
/* f32, f16, q8, q4 and llama.cpp's q8_0, q4_0 (fp16, fp32); -1 when unknown. */
int kvq_tool_parse_cache_type(const char *s);
#define KVQ_TOOL_CACHE_TYPES "f32, f16, q8 (q8_0), q4 (q4_0)"
/* --plan: download size, disk, memory at n_ctx (0: trained context) and the cache types for
 * n_seq contexts (kvq-server's slots), RAM, whether it fits and a decode speed estimate, from
 * config.json and the weights' headers only. Returns the tool's exit code. */
int kvq_tool_plan(const char *prog, const char *model, long n_ctx, int type_k, int type_v, const kvq_model_params *mp, int n_seq);

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
