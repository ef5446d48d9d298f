/* kvq-bench model --batch-sweep: the cost of one step of N tokens (one kvq_eval of N
 * tokens on top of a filled prompt) for N = 1, 2, 4, 8, 16. A server step with N
 * decoding rows and a speculative verification of N drafts cost this; the ratio to
 * N = 1 says how much a batch gets for free (issue 34). */
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"
#include "common.h"
#include "kvq.h"

static const char *P = "kvq-bench model";

#define SWEEP_MAX 16

int kvq_bench_batch_sweep(kvq_model *m, long pp, long reps, int tk, int tv) {
    static const int ns[] = {1, 2, 4, 8, 16};
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = (int)pp + SWEEP_MAX;
    cp.n_batch = pp > SWEEP_MAX ? (int)pp : SWEEP_MAX;
    cp.type_k = (kvq_cache_type)tk, cp.type_v = (kvq_cache_type)tv;
    kvq_context *c;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    int nv = kvq_model_n_vocab(m);
    int32_t *ids = malloc(sizeof *ids * (size_t)(pp + SWEEP_MAX));
    if (!ids) return kvq_tool_die(P, "out of memory");
    for (long i = 0; i < pp + SWEEP_MAX; i++) ids[i] = (int32_t)((i * 7919 + 13) % nv);
    if (kvq_eval(c, ids, (int)pp) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    double step1 = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k];
        double best = 1e30;
        /* one untimed step first: the scratch of a new batch size is allocated there */
        for (long r = -1; r < reps; r++) {
            if (kvq_kv_truncate(c, (int)pp)) return kvq_tool_die(P, "%s", kvq_last_error());
            double t0 = kvq_tool_now();
            if (kvq_eval(c, ids + pp, n) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
            double t = kvq_tool_now() - t0;
            if (r >= 0 && t < best) best = t;
        }
        if (n == 1) step1 = best;
        printf("batch n=%d step_ms=%.2f per_token_ms=%.2f ratio_to_1=%.3f\n", n, best * 1e3, best * 1e3 / n,
               step1 > 0 ? best / step1 : 0);
        fflush(stdout);
    }
    free(ids);
    kvq_context_free(c);
    return 0;
}
