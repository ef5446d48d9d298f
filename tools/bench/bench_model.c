/* kvq-bench model: prompt processing and decode speed of a whole model, and
 * the decode rate as a fraction of memory bandwidth (each decoded token streams
 * every weight but the embedding table once, plus the KV cache in use). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_common.h"
#include "cpu/cpu_kernels.h"
#include "common.h"
#include "kvq.h"

static const char *P = "kvq-bench model";

static int print_plan(const char *dir, const kvq_model_params *mp);
/* bench_depth.c: --depth */
int kvq_bench_depth_parse(const char *s, int *depths, int max);
int kvq_bench_depth(kvq_model *m, const int *depths, int nd, long pp, long tg, long reps, int tk, int tv, int types_given);
#define DEPTHS_MAX 32
/* bench_batch.c: --batch-sweep */
int kvq_bench_batch_sweep(kvq_model *m, long pp, long reps, int tk, int tv);

static int usage(FILE *f) {
    fprintf(f, "usage: kvq-bench model [-m DIR] [-p N] [-n N] [-t N] [-ctk T] [-ctv T] [--reps N] [--backend B] [-ngl N] [--device D] [--aqlm-cb8] [--aqlm-lut8] [--no-aqlm-i8] [--exact] [--plan] [--profile] [--batch-sweep]\n"
               "       kvq-bench model --synthetic NAME --scheme 2x8|1x16 [--synthetic-dir D]\n"
               "  -m      model directory (default: the demo model), or ORG/NAME[:REV] (alias -hf)\n"
               "  --synthetic  a real-shape AQLM checkpoint with random codes, written once under D: llama2-7b,\n"
               "          llama2-13b, llama3-8b, llama3-70b, mistral-7b, mixtral-8x7b, command-r, gemma-2b, phi3-mini, qwen2-7b\n"
               "          (default $TMPDIR/kvq-synth) and loaded from there; defaults -p 512 -n 32 --reps 1\n"
               "  -p      prompt tokens (default 256), -n decoded tokens (default 128)\n"
               "  -t      threads (default: all cores), --reps passes, best is reported (default 3)\n"
               "  -ctk/-ctv  KV cache types (default f16)\n"
               "  --backend auto|cpu|vulkan, --device N|NAME (GPU), -ngl N|auto (the last N layers on the GPU)\n"
               "  --aqlm-cb8  CPU: 1x16 AQLM codebooks as int8 (opt-in, lossy; see README)\n"
               "  --aqlm-lut8 CPU with AVX-512 VBMI: 2x8 AQLM through int8 tables (opt-in, lossy; see README)\n"
               "  --no-aqlm-i8 / --aqlm-i8  CPU: 1x16 AQLM through the fp16 codebook and exact gathers, or int8 codewords\n"
               "              and integer dot products (lossy; the default with VNNI); a --synthetic 1x16 run decodes with the\n"
               "              other of the two on a second load (tg_i8_tps, tg_gather_tps, tg_i8_speedup = i8 / gather)\n"
               "  --exact    AQLM prompts through the exact paths too (CPU, Vulkan); without it a --synthetic CPU run times\n"
               "              the prompt with them on a second load (pp_exact_tps, pp_speedup)\n"
               "  --profile  GPU: time and GB/s per op kind over the decoded tokens (commands run one at a time)\n"
               "  --plan  print the load plan (weights, KV cache of -p + -n positions per backend, device\n"
               "          allocations) and exit without loading weights; --synthetic then writes only headers\n"
               "  With a GPU the last line adds dispatches=, barriers= and submits= per decoded token.\n"
               "  --depth N,N,...  prompt (-p) and decode (-n) speed after a cache of N positions, one line per depth\n"
               "          and cache type (f16, q8, q4 unless -ctk/-ctv given), like llama-bench -d: the cache is filled\n"
               "          to N with random rows instead of a prefill (speed does not depend on its contents)\n"
               "  --batch-sweep  time one step of N = 1, 2, 4, 8, 16 tokens after a -p prompt (default 128), best of\n"
               "          --reps (default 3): batch n= step_ms= per_token_ms= ratio_to_1= (no side runs)\n");
    return 0;
}

/* Tensor bytes of the checkpoint: the sizes of dir's *.safetensors files. */
static double checkpoint_bytes(const char *dir) {
    DIR *d = opendir(dir);
    double total = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        char path[4096];
        struct stat st;
        if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors") &&
            (size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < sizeof path && stat(path, &st) == 0)
            total += (double)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* CPU seconds (user + system, all threads) this process used so far. */
static double cpu_seconds(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* A second load of dir with mp (a path to compare: aqlm_i8, exact): the same
 * -p prompt, then tg tokens (tg may be 0), best of reps; *pp_tps gets the
 * prompt's tok/s. Run on its own load before the main one, so
 * the two never share memory. Returns decode tok/s; 0 on failure (printed). */
static double side_run(const char *what, const char *dir, const kvq_model_params *mp, long pp, long tg, long reps, int tk,
                       int tv, double *pp_tps) {
    kvq_model *m;
    kvq_context *c = NULL;
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = (int)(pp + tg), cp.n_batch = (int)pp, cp.type_k = (kvq_cache_type)tk, cp.type_v = (kvq_cache_type)tv;
    *pp_tps = 0;
    if (kvq_model_load(dir, mp, &m) != KVQ_OK || kvq_context_new(m, &cp, &c) != KVQ_OK) {
        fprintf(stderr, "%s: %s run: %s\n", P, what, kvq_last_error());
        return 0;
    }
    int nv = kvq_model_n_vocab(m);
    int32_t *ids = malloc(sizeof *ids * (size_t)pp);
    double best = 1e30, best_pp = 1e30;
    for (long i = 0; ids && i < pp; i++) ids[i] = (int32_t)((i * 7919 + 13) % nv); /* as the main run */
    for (long r = 0; ids && r < reps; r++) {
        kvq_kv_truncate(c, 0);
        double tp = kvq_tool_now();
        if (kvq_eval(c, ids, (int)pp) != KVQ_OK) break;
        double t0 = kvq_tool_now();
        if (t0 - tp < best_pp) best_pp = t0 - tp;
        for (long i = 0; i < tg; i++) {
            int32_t id = ids[i % pp];
            if (kvq_eval(c, &id, 1) != KVQ_OK) break;
        }
        double t = kvq_tool_now() - t0;
        if (t < best) best = t;
    }
    free(ids);
    kvq_context_free(c);
    kvq_model_free(m);
    if (best_pp < 1e30) *pp_tps = (double)pp / best_pp;
    if (best < 1e30 && tg > 0) fprintf(stderr, "%s: %s: prompt %.2f tok/s, decode %.2f tok/s\n", P, what, *pp_tps, (double)tg / best);
    else if (best_pp < 1e30) fprintf(stderr, "%s: %s: prompt %.2f tok/s\n", P, what, *pp_tps);
    return best < 1e30 && tg > 0 ? (double)tg / best : 0;
}

/* " tg_i8_tps=.. tg_gather_tps=.. tg_i8_speedup=.." for the last line when both were measured, else "". */
static const char *i8_fields(double tg_i8, double tg_gather) {
    static char buf[128];
    buf[0] = 0;
    if (tg_i8 >= 0 && tg_gather >= 0)
        snprintf(buf, sizeof buf, " tg_i8_tps=%.2f tg_gather_tps=%.2f tg_i8_speedup=%.3f", tg_i8, tg_gather,
                 tg_gather > 0 ? tg_i8 / tg_gather : 0);
    return buf;
}

/* Resident set of this process now, bytes (0 if unknown). */
static double current_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    int ok = f && fscanf(f, "%lu %lu", &size, &res) == 2;
    if (f) fclose(f);
    return ok ? (double)res * (double)sysconf(_SC_PAGESIZE) : 0.0;
}

/* Peak resident set of this process so far, bytes. */
static double peak_rss(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0.0;
}

int kvq_bench_model(int argc, char **argv) {
    const char *dir = NULL, *synth = NULL, *scheme = "2x8", *synth_root = NULL, *backend = NULL, *device = NULL;
    int ngl = -1;
    long pp = -1, tg = -1, threads = 0, reps = -1;
    int tk = KVQ_CACHE_F16, tv = KVQ_CACHE_F16, cb8 = 0, lut8 = 0, plan = 0, profile = 0, i8 = 1, exact = 0, types_given = 0, sweep = 0;
    int depths[DEPTHS_MAX], n_depths = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!strcmp(a, "--aqlm-cb8")) {
            cb8 = 1;
            continue;
        }
        if (!strcmp(a, "--aqlm-lut8")) {
            lut8 = 1;
            continue;
        }
        if (!strcmp(a, "--plan")) {
            plan = 1;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            setenv("KVQ_VK_PROFILE", "1", 1); /* read when the GPU backend starts */
            profile = 1;
            continue;
        }
        if (!strcmp(a, "--aqlm-i8") || !strcmp(a, "--no-aqlm-i8")) {
            i8 = a[2] == 'a' ? 2 : 0;
            continue;
        }
        if (!strcmp(a, "--exact")) {
            exact = 1;
            continue;
        }
        if (!strcmp(a, "--batch-sweep")) {
            sweep = 1;
            continue;
        }
        if (!v) return kvq_tool_die(P, "unknown option or missing value: %s (see --help)", a);
        i++;
        if (kvq_tool_is_model_flag(a)) dir = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) { if (kvq_tool_parse_ngl(v, &ngl)) goto bad; }
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--synthetic")) synth = v;
        else if (!strcmp(a, "--scheme")) scheme = v;
        else if (!strcmp(a, "--synthetic-dir")) synth_root = v;
        else if (!strcmp(a, "-p")) { if (kvq_tool_parse_int(v, 1, 1 << 20, &pp)) goto bad; }
        else if (!strcmp(a, "-n")) { if (kvq_tool_parse_int(v, 1, 1 << 20, &tg)) goto bad; }
        else if (!strcmp(a, "-t")) { if (kvq_tool_parse_int(v, 1, 1024, &threads)) goto bad; }
        else if (!strcmp(a, "--reps")) { if (kvq_tool_parse_int(v, 1, 1000, &reps)) goto bad; }
        else if (!strcmp(a, "-ctk")) { if ((tk = kvq_tool_parse_cache_type(v)) < 0) goto bad_type; types_given = 1; }
        else if (!strcmp(a, "-ctv")) { if ((tv = kvq_tool_parse_cache_type(v)) < 0) goto bad_type; types_given = 1; }
        else if (!strcmp(a, "--depth")) { if ((n_depths = kvq_bench_depth_parse(v, depths, DEPTHS_MAX)) < 1) goto bad; }
        else return kvq_tool_die(P, "unknown option '%s' (see --help)", a);
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a);
    bad_type:
        return kvq_tool_die(P, "bad value '%s' for %s: the cache types are " KVQ_TOOL_CACHE_TYPES, v, a);
    }
    char synth_dir[4096];
    double ckpt_bytes = 0;
    if (synth) {
        if (dir) return kvq_tool_die(P, "give either -m or --synthetic, not both");
        if ((plan ? kvq_bench_synth_plan_dir : kvq_bench_synth_dir)(synth, scheme, synth_root, synth_dir, sizeof synth_dir,
                                                                     &ckpt_bytes))
            return 1;
        dir = synth_dir;
    }
    if (pp < 0) pp = sweep ? 128 : synth ? 512 : 256;
    if (tg < 0) tg = synth ? 32 : 128;
    if (reps < 0) reps = synth && !sweep ? 1 : 3;
    if (!dir && !(dir = kvq_tool_demo_model())) return kvq_tool_die(P, "no -m given and the demo model was not found");
    if (kvq_tool_model_dir(P, &dir, 1)) return 1;
    if (!synth) ckpt_bytes = checkpoint_bytes(dir);
    kvq_model_params mp = kvq_model_default_params();
    mp.n_threads = (int)threads;
    mp.backend = backend;
    mp.n_gpu_layers = ngl;
    mp.device = device;
    mp.aqlm_cb8 = cb8;
    mp.aqlm_lut8 = lut8;
    mp.aqlm_i8 = i8;
    mp.exact = exact;
    mp.plan_ctx = (int)(pp + tg);
    mp.plan_type_k = tk, mp.plan_type_v = tv;
    if (plan) return print_plan(dir, &mp);
    /* the side runs below compare CPU kernels: not on a GPU backend */
    int on_cpu = !sweep && !(backend && strcmp(backend, "cpu") && strcmp(backend, "auto"));
    /* 1x16 synthetic: decode with the other of aqlm_i8 / the exact gathers too, for tg_i8_speedup */
    double tg_side = -1, pp_side = 0, pp_exact = -1;
    int i8_side = synth && on_cpu && !exact && !cb8 && !strncmp(scheme, "1x16", 4);
    /* what this load runs: auto (1) follows the CPU class */
    if (i8 == 1) i8 = kvq_cpu_i8_wins() ? 2 : 0;
    if (i8_side) {
        kvq_model_params m8 = mp;
        m8.aqlm_i8 = i8 ? 0 : 2;
        tg_side = side_run(i8 ? "exact gathers (--no-aqlm-i8)" : "aqlm_i8", dir, &m8, pp, tg, reps, tk, tv, &pp_side);
    }
    /* AQLM prompts: the exact paths too, for pp_exact_tps (the default's error: per-output bound in
     * i8tile/i8tile.c, kvq-ppl --kl-exact on trained checkpoints; a random synthetic model's logits
     * move chaotically under any change, so they are not compared here) */
    if (synth && !exact && on_cpu) {
        kvq_model_params mx = mp;
        mx.exact = 1;
        side_run("exact", dir, &mx, pp, 0, reps, tk, tv, &pp_exact);
    }
    kvq_model *m;
    double t_load = kvq_tool_now(), cpu_load = cpu_seconds();
    if (kvq_model_load(dir, &mp, &m) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    t_load = kvq_tool_now() - t_load, cpu_load = cpu_seconds() - cpu_load;
    kvq_tool_report_backend(P, m);
    if (sweep) {
        int rc = kvq_bench_batch_sweep(m, pp, reps, tk, tv);
        kvq_model_free(m);
        return rc;
    }
    if (n_depths) {
        int rc = kvq_bench_depth(m, depths, n_depths, pp, tg, reps, tk, tv, types_given);
        kvq_model_free(m);
        return rc;
    }
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = (int)(pp + tg);
    cp.n_batch = (int)pp;
    cp.type_k = (kvq_cache_type)tk;
    cp.type_v = (kvq_cache_type)tv;
    kvq_context *c;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    kvq_tool_report_context(P, c);
    /* token ids spread over the vocabulary: speed does not depend on which */
    int nv = kvq_model_n_vocab(m);
    int32_t *ids = malloc(sizeof *ids * (size_t)pp);
    for (long i = 0; i < pp; i++) ids[i] = (int32_t)((i * 7919 + 13) % nv);
    double best_pp = 1e30, best_tg = 1e30;
    kvq_backend_stats st0, st1;
    /* peak RSS before the first bandwidth sample's 1 GiB buffer; the work's own peak is
     * what stays resident after it (the sample buffers are freed) */
    double rss = peak_rss();
    const int bw_threads = threads > 0 ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    kvq_bench_bw bws = {0};
    kvq_bench_bw_sample(&bws, m, bw_threads);
    for (long r = 0; r < reps; r++) {
        kvq_kv_truncate(c, 0);
        double t0 = kvq_tool_now();
        if (kvq_eval(c, ids, (int)pp) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
        double t1 = kvq_tool_now();
        kvq_model_backend_stats(m, &st0);
        kvq_model_profile(m, NULL, 0); /* the profile covers the last pass's decode */
        for (long i = 0; i < tg; i++) {
            int32_t id = ids[i % pp];
            if (kvq_eval(c, &id, 1) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
        }
        double t2 = kvq_tool_now();
        kvq_model_backend_stats(m, &st1);
        if (t1 - t0 < best_pp) best_pp = t1 - t0;
        if (t2 - t1 < best_tg) best_tg = t2 - t1;
        double now = current_rss();
        if (now > rss) rss = now;
        kvq_bench_bw_sample(&bws, m, bw_threads);
    }
    if (profile) {
        static char prof[8192];
        kvq_model_profile(m, prof, sizeof prof);
        printf("profile of %ld decoded tokens (each GPU command alone; bytes = what its bindings hold):\n%s", tg,
               *prof ? prof : "(no GPU profile: --profile needs the Vulkan backend with timestamps)\n");
    }
    /* sampling cost per token on this model's logits, and on a Llama-3-sized vocabulary */
    double smp[4];
    int nv_big = 128256;
    float *big = malloc(sizeof *big * (size_t)nv_big);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; big && i < nv_big; i++) { /* logits spread like a model's: a few high, a long low tail */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u = (double)(x >> 11) / 9007199254740992.0;
        big[i] = (float)(-4.0 * log(-log(u + 1e-300) + 1e-12)); /* Gumbel-shaped */
    }
    for (int k = 0; k < 4; k++) {
        kvq_sampler_params sp = kvq_sampler_default_params();
        if (k % 2 == 0) sp.temp = 0;
        sp.seed = 1;
        kvq_sampler *s = kvq_sampler_new(&sp);
        const float *lg = k < 2 ? kvq_logits(c) : big;
        int n = k < 2 ? nv : nv_big, calls = 200;
        double best = 1e30;
        for (long r = 0; lg && r < reps; r++) {
            double t0 = kvq_tool_now();
            for (int i = 0; i < calls; i++) kvq_sample(s, lg, n);
            double t = (kvq_tool_now() - t0) / calls;
            if (t < best) best = t;
        }
        smp[k] = best;
        kvq_sampler_free(s);
    }
    free(big);
    kvq_bench_bw_sample(&bws, m, bw_threads);
    double bw = bws.best;
    double wbytes = (double)kvq_model_step_bytes(m); /* a mixture of experts reads only the experts it picks */
    double kv_avg = (double)kvq_kv_bytes_total(c) * ((double)pp + (double)tg / 2) / (double)(pp + tg);
    double tok_bytes = wbytes + kv_avg, tg_tps = (double)tg / best_tg;
    printf("model: %s\n", kvq_model_desc(m));
    printf("backend: %s, K %s, V %s\n", kvq_model_backend_name(m), kvq_cache_type_name((kvq_cache_type)tk),
           kvq_cache_type_name((kvq_cache_type)tv));
    printf("prompt %ld tokens: %.1f tok/s%s\n", pp, (double)pp / best_pp,
           exact ? " (exact paths)"
                 : " (AQLM batches through int8 tiles where the CPU has integer dot products; per output "
                   "|err| <= sum over 256-value blocks of sw/2*|x|_1 + sa/2*|W|_1 + 64*sw*sa, sw, sa = block max|.|/127)");
    printf("decode %ld tokens: %.1f tok/s, %.2f MB streamed per token, %.1f GB/s, %.0f%% of measured %.1f GB/s\n", tg,
           tg_tps, tok_bytes / 1e6, tok_bytes * tg_tps / 1e9, bw > 0 ? 100 * tok_bytes * tg_tps / 1e9 / bw : 0, bw);
    printf("bandwidth best_gbs=%.2f worst_gbs=%.2f spread=%.3f samples=%d (before, after each pass, after; the bound uses the best)\n",
           bws.best, bws.worst, kvq_bench_bw_spread(&bws), bws.n);
    double step = best_tg / (double)tg;
    printf("sampling per token (vocab %d): greedy %.1f us, default sampler %.1f us (temp 0.8, top-k 40, top-p 0.95, "
           "min-p 0.05) = %.1f%% of a decode step\n", nv, smp[0] * 1e6, smp[1] * 1e6, 100 * smp[1] / step);
    printf("sampling per token (vocab %d): greedy %.1f us, default sampler %.1f us\n", nv_big, smp[2] * 1e6, smp[3] * 1e6);
    double kv_bytes = (double)kvq_kv_bytes_total(c), bound = bw > 0 ? bw * 1e9 / tok_bytes : 0;
    double rss_ratio = rss / (ckpt_bytes + kv_bytes);
    printf("load %.2f s (%.2f s CPU); peak RSS %.2f GB = %.2fx (checkpoint tensors %.2f GB + KV cache %.2f GB)\n", t_load,
           cpu_load, rss / 1e9, rss_ratio, ckpt_bytes / 1e9, kv_bytes / 1e9);
    if (synth) {
        printf("model synthetic=%s scheme=%s pp_tps=%.2f tg_tps=%.2f bound_tps=%.2f tg_bw_ratio=%.3f rss_ratio=%.3f%s", synth,
               scheme, (double)pp / best_pp, tg_tps, bound, bound > 0 ? tg_tps / bound : 0, rss_ratio,
               i8_side ? i8_fields(i8 ? tg_tps : tg_side, i8 ? tg_side : tg_tps) : "");
        if (pp_exact > 0) printf(" pp_exact_tps=%.2f pp_speedup=%.3f", pp_exact, (double)pp / best_pp / pp_exact);
    } else
        printf("model pp=%ld tg=%ld pp_tps=%.1f tg_tps=%.1f tg_bw_ratio=%.2f sample_greedy_us=%.1f sample_default_us=%.1f "
           "sample_default_128k_us=%.1f", pp, tg, (double)pp / best_pp, tg_tps,
           bw > 0 ? tok_bytes * tg_tps / 1e9 / bw : 0, smp[0] * 1e6, smp[1] * 1e6, smp[3] * 1e6);
    if (st1.dispatches > st0.dispatches) /* a GPU: its commands per decoded token */
        printf(" dispatches=%.0f barriers=%.0f submits=%.1f dsets=%.1f waits=%.1f",
               (double)(st1.dispatches - st0.dispatches) / (double)tg, (double)(st1.barriers - st0.barriers) / (double)tg,
               (double)(st1.submits - st0.submits) / (double)tg, (double)(st1.dsets - st0.dsets) / (double)tg,
               (double)(st1.waits - st0.waits) / (double)tg);
    printf("\n");
    free(ids);
    kvq_context_free(c);
    kvq_model_free(m);
    return 0;
}

/* --plan: the plan line of the model as it would load, without loading its weights. */
static int print_plan(const char *dir, const kvq_model_params *mp) {
    char line[400];
    if (kvq_model_plan_only(dir, mp, line, sizeof line) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    printf("%s\n", line);
    return 0;
}
