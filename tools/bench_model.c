/* kvq-bench model: prompt processing and decode speed of a whole model, and
 * the decode rate as a fraction of memory bandwidth (each decoded token streams
 * every weight but the embedding table once, plus the KV cache in use). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "common.h"
#include "kvq.h"

static const char *P = "kvq-bench model";

static int usage(FILE *f) {
    fprintf(f, "usage: kvq-bench model [-m DIR] [-p N] [-n N] [-t N] [-ctk T] [-ctv T] [--reps N] [--backend B] [--device D]\n"
               "  -m      model directory (default: the demo model)\n"
               "  -p      prompt tokens (default 256), -n decoded tokens (default 128)\n"
               "  -t      threads (default: all cores), --reps passes, best is reported (default 3)\n"
               "  -ctk/-ctv  KV cache types (default f16)\n"
               "  --backend auto|cpu|vulkan, --device N|NAME (GPU)\n");
    return 0;
}

int kvq_bench_model(int argc, char **argv) {
    const char *dir = NULL, *backend = NULL, *device = NULL;
    long pp = 256, tg = 128, threads = 0, reps = 3;
    int tk = KVQ_CACHE_F16, tv = KVQ_CACHE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!v) return kvq_tool_die(P, "unknown option or missing value: %s (see --help)", a);
        i++;
        if (!strcmp(a, "-m")) dir = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "-p")) { if (kvq_tool_parse_int(v, 1, 1 << 20, &pp)) goto bad; }
        else if (!strcmp(a, "-n")) { if (kvq_tool_parse_int(v, 1, 1 << 20, &tg)) goto bad; }
        else if (!strcmp(a, "-t")) { if (kvq_tool_parse_int(v, 1, 1024, &threads)) goto bad; }
        else if (!strcmp(a, "--reps")) { if (kvq_tool_parse_int(v, 1, 1000, &reps)) goto bad; }
        else if (!strcmp(a, "-ctk")) { if ((tk = kvq_cache_type_parse(v)) < 0) goto bad; }
        else if (!strcmp(a, "-ctv")) { if ((tv = kvq_cache_type_parse(v)) < 0) goto bad; }
        else return kvq_tool_die(P, "unknown option '%s' (see --help)", a);
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a);
    }
    if (!dir && !(dir = kvq_tool_demo_model())) return kvq_tool_die(P, "no -m given and the demo model was not found");
    kvq_model_params mp = kvq_model_default_params();
    mp.n_threads = (int)threads;
    mp.backend = backend;
    mp.device = device;
    kvq_model *m;
    if (kvq_model_load(dir, &mp, &m) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    kvq_tool_report_backend(P, m);
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = (int)(pp + tg);
    cp.n_batch = (int)pp;
    cp.type_k = (kvq_cache_type)tk;
    cp.type_v = (kvq_cache_type)tv;
    kvq_context *c;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    /* token ids spread over the vocabulary: speed does not depend on which */
    int nv = kvq_model_n_vocab(m);
    int32_t *ids = malloc(sizeof *ids * (size_t)pp);
    for (long i = 0; i < pp; i++) ids[i] = (int32_t)((i * 7919 + 13) % nv);
    double best_pp = 1e30, best_tg = 1e30;
    for (long r = 0; r < reps; r++) {
        kvq_kv_truncate(c, 0);
        double t0 = kvq_tool_now();
        if (kvq_eval(c, ids, (int)pp) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
        double t1 = kvq_tool_now();
        for (long i = 0; i < tg; i++) {
            int32_t id = ids[i % pp];
            if (kvq_eval(c, &id, 1) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
        }
        double t2 = kvq_tool_now();
        if (t1 - t0 < best_pp) best_pp = t1 - t0;
        if (t2 - t1 < best_tg) best_tg = t2 - t1;
    }
    double bw = kvq_bench_model_bw_gbs(m, threads > 0 ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    double wbytes = (double)kvq_model_weight_bytes(m);
    double kv_avg = (double)kvq_kv_bytes_total(c) * ((double)pp + (double)tg / 2) / (double)(pp + tg);
    double tok_bytes = wbytes + kv_avg, tg_tps = (double)tg / best_tg;
    printf("model: %s\n", kvq_model_desc(m));
    printf("backend: %s, K %s, V %s\n", kvq_model_backend_name(m), kvq_cache_type_name((kvq_cache_type)tk),
           kvq_cache_type_name((kvq_cache_type)tv));
    printf("prompt %ld tokens: %.1f tok/s\n", pp, (double)pp / best_pp);
    printf("decode %ld tokens: %.1f tok/s, %.2f MB streamed per token, %.1f GB/s, %.0f%% of measured %.1f GB/s\n", tg,
           tg_tps, tok_bytes / 1e6, tok_bytes * tg_tps / 1e9, bw > 0 ? 100 * tok_bytes * tg_tps / 1e9 / bw : 0, bw);
    printf("model pp=%ld tg=%ld pp_tps=%.1f tg_tps=%.1f tg_bw_ratio=%.2f\n", pp, tg, (double)pp / best_pp, tg_tps,
           bw > 0 ? tok_bytes * tg_tps / 1e9 / bw : 0);
    free(ids);
    kvq_context_free(c);
    kvq_model_free(m);
    return 0;
}
