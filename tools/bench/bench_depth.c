/* kvq-bench model --depth: prompt and decode speed with the KV cache already holding
 * N positions, for each N and cache type (the figures of llama.cpp's `llama-bench -d`).
 *
 * Prefilling 32k tokens of an 8B model takes an hour on a small CPU, so the cache is
 * filled up to the depth with random rows (kvq_kv_fill_random, src/kv_fill.h): valid
 * rows of the cache type, stored the way kvq_eval stores them. Attention's cost does not
 * depend on what the rows hold, so the timed prompt and decode run as after a real
 * prefill; only their outputs are meaningless. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "common.h"
#include "kv_fill.h"
#include "kvq.h"

static const char *P = "kvq-bench model";

int kvq_bench_depth_parse(const char *s, int *depths, int max) {
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > (1 << 24) || n == max || (*end && *end != ',')) return -1;
        depths[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return n;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Best-of-reps seconds of the prompt (pp tokens) and of tg decode steps, each from depth. */
static int time_at_depth(kvq_context *c, int depth, const int32_t *ids, long pp, long tg, long reps, double *t_pp,
                         double *t_tg) {
    *t_pp = *t_tg = 1e30;
    for (long r = 0; r < reps; r++) {
        if (kvq_kv_truncate(c, depth)) return -1;
        double t0 = kvq_tool_now();
        if (kvq_eval(c, ids, (int)pp)) return -1;
        double t1 = kvq_tool_now();
        if (kvq_kv_truncate(c, depth)) return -1;
        double t2 = kvq_tool_now();
        for (long i = 0; i < tg; i++)
            if (kvq_eval(c, &ids[i % pp], 1)) return -1;
        double t3 = kvq_tool_now();
        if (t1 - t0 < *t_pp) *t_pp = t1 - t0;
        if (t3 - t2 < *t_tg) *t_tg = t3 - t2;
    }
    return 0;
}

/* All depths (ascending) for one cache type: the context is filled once, a depth at a time. */
static int run_type(kvq_model *m, const int *depths, int nd, long pp, long tg, long reps, int tk, int tv) {
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = depths[nd - 1] + (int)(pp > tg ? pp : tg);
    cp.n_batch = (int)pp;
    cp.type_k = (kvq_cache_type)tk;
    cp.type_v = (kvq_cache_type)tv;
    kvq_context *c;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    int nv = kvq_model_n_vocab(m);
    int32_t *ids = malloc(sizeof *ids * (size_t)pp);
    if (!ids) return kvq_tool_die(P, "out of memory");
    for (long i = 0; i < pp; i++) ids[i] = (int32_t)((i * 7919 + 13) % nv);
    char name[16];
    if (tk == tv) snprintf(name, sizeof name, "%s", kvq_cache_type_name((kvq_cache_type)tk));
    else snprintf(name, sizeof name, "%s/%s", kvq_cache_type_name((kvq_cache_type)tk), kvq_cache_type_name((kvq_cache_type)tv));
    int rc = 0;
    for (int i = 0; i < nd && !rc; i++) {
        int d = depths[i], from = kvq_n_past(c);
        /* rows below the last depth's stay valid (they were filled or evaluated): only
         * the new span is filled */
        if (from > d && kvq_kv_truncate(c, from = d)) rc = 1;
        double t0 = kvq_tool_now();
        if (!rc && kvq_kv_fill_random(c, d, (uint64_t)d + 1)) rc = 1;
        if (!rc && d > from)
            fprintf(stderr, "%s: cache %s filled from %d to %d positions with random rows in %.1f s\n", P, name, from, d,
                    kvq_tool_now() - t0);
        double kv_mib = (double)kvq_kv_bytes_used(c) / (1024.0 * 1024.0), t_pp, t_tg;
        if (!rc && time_at_depth(c, d, ids, pp, tg, reps, &t_pp, &t_tg)) rc = 1;
        if (rc) {
            kvq_tool_die(P, "depth %d, cache %s: %s", d, name, kvq_last_error());
            break;
        }
        printf("depth n=%d cache=%s pp_tps=%.2f tg_tps=%.2f kv_mib=%.1f\n", d, name, (double)pp / t_pp, (double)tg / t_tg,
               kv_mib);
        fflush(stdout);
    }
    free(ids);
    kvq_context_free(c);
    return rc;
}

int kvq_bench_depth(kvq_model *m, const int *depths_in, int nd, long pp, long tg, long reps, int tk, int tv, int types_given) {
    int *depths = malloc(sizeof *depths * (size_t)nd);
    if (!depths) return kvq_tool_die(P, "out of memory");
    memcpy(depths, depths_in, sizeof *depths * (size_t)nd);
    qsort(depths, (size_t)nd, sizeof *depths, cmp_int);
    printf("model: %s\n", kvq_model_desc(m));
    printf("depth: prompt %ld tokens and decode %ld tokens after a cache of n positions "
           "(filled with random rows, not a prefill); best of %ld\n", pp, tg, reps);
    static const int all[] = {KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};
    int rc = 0;
    if (types_given) rc = run_type(m, depths, nd, pp, tg, reps, tk, tv);
    else
        for (int i = 0; i < 3 && !rc; i++) rc = run_type(m, depths, nd, pp, tg, reps, all[i], all[i]);
    free(depths);
    return rc;
}
