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

/* Strict number parsing: return 0 and set *out on success, -1 on junk. */
int kvq_tool_parse_int(const char *s, long lo, long hi, long *out);
/* -ngl / --n-gpu-layers: a count, or "all" / -1 (every layer); non-zero on a bad value. */
int kvq_tool_parse_ngl(const char *s, int *out);
int kvq_tool_parse_float(const char *s, double *out);

/* With --version among the arguments: prints "<prog> <kvq version>" and returns 1
 * (main then exits 0); otherwise 0. */
int kvq_tool_version(const char *prog, int argc, char **argv);

/* Prints the backend and device in use on stderr, with the reason when automatic
 * selection passed over a GPU backend (one line each). */
struct kvq_model;
void kvq_tool_report_backend(const char *prog, const struct kvq_model *m);

/* Monotonic seconds. */
double kvq_tool_now(void);

#endif
