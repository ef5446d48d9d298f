/* `kvq-bench attn`: decode attention speed (one new token) from f16, q8 and
 * q4 KV caches, against this machine's memory bandwidth.
 *
 * What is timed: kvq_cpu_attention for one query at position ctx-1 over ctx
 * cached positions of one layer (all heads), i.e. reading every K and V row
 * of that layer once. Each configuration allocates enough layers that their
 * caches total at least --ws-mb (default 1024 MB, beyond the LLC) and the
 * timed loop cycles through all of them, so rows come from DRAM as in a real
 * decode step. Per-layer time is the loop time / layers (best of --reps
 * loops); "ms/token" is that times the model's 32 layers. Caches are filled
 * with kvq_cpu_kv_store_row (1024 distinct random rows per head, repeated
 * along the context and copied to the other layers). q4 rows are rotated. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "common.h"
#include "cpu/cpu_kernels.h"
#include "util.h"

int kvq_bench_attn(int argc, char **argv);
/* bench_vk_attn.c: the same table on a device backend */
int kvq_bench_attn_device(const char *backend, const int *ctxs, int n_ctx, const char *only, int reps, size_t ws_bytes);

static const char *PROG = "kvq-bench attn";

typedef kvq_bench_attn_shape shape;
#define SHAPES KVQ_BENCH_ATTN_SHAPES
static const kvq_cache_type TYPES[] = {KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};
static const char *const TYPE_NAMES[] = {"f16", "q8", "q4"};
#define N_TYPES 3

static uint64_t g_rng = 0x853c49e6748fea9bull;
static float rndf(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* One layer's K or V cache: n_kv heads × ctx rows; the first `distinct`
 * rows of each head are stored from random vectors, the rest repeat them. */
static void fill_layer(uint8_t *dst, kvq_cache_type t, int rotate, int n_kv, int ctx, int hd) {
    const size_t rb = kvq_kv_row_bytes(t, hd);
    const int distinct = ctx < 1024 ? ctx : 1024;
    float *x = malloc((size_t)hd * sizeof *x);
    if (!x) abort();
    for (int h = 0; h < n_kv; h++) {
        uint8_t *head = dst + (size_t)h * ctx * rb;
        for (int p = 0; p < distinct; p++) {
            for (int i = 0; i < hd; i++) x[i] = rndf();
            kvq_cpu_kv_store_row(t, rotate, x, head + (size_t)p * rb, hd);
        }
        for (int p = distinct; p < ctx; p += distinct) {
            const int m = ctx - p < distinct ? ctx - p : distinct;
            memcpy(head + (size_t)p * rb, head, (size_t)m * rb);
        }
    }
    free(x);
}

typedef struct {
    double ms_layer, bytes_layer;
    int ok;
} result;

static int bench_one(const shape *s, int ctx, kvq_cache_type t, int nt, int reps, size_t ws_bytes, result *res) {
    const int hd = s->head_dim, rotate = t == KVQ_CACHE_Q4;
    const size_t kb = kvq_kv_row_bytes(t, hd), layer = (size_t)s->n_head_kv * ctx * kb;
    size_t n_layers = (ws_bytes + 2 * layer - 1) / (2 * layer);
    if (n_layers < 1) n_layers = 1;
    uint8_t *K = kvq_alloc_aligned(n_layers * layer), *V = kvq_alloc_aligned(n_layers * layer);
    float *q = malloc((size_t)s->n_head * hd * sizeof *q), *out = malloc((size_t)s->n_head * hd * sizeof *out);
    if (!K || !V || !q || !out) {
        kvq_free_aligned(K);
        kvq_free_aligned(V);
        free(q);
        free(out);
        return kvq_tool_die(PROG, "out of memory for %zu layers of %zu bytes", n_layers, 2 * layer);
    }
    fill_layer(K, t, rotate, s->n_head_kv, ctx, hd);
    fill_layer(V, t, rotate, s->n_head_kv, ctx, hd);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t l = 1; l < n_layers; l++) {
        memcpy(K + l * layer, K, layer);
        memcpy(V + l * layer, V, layer);
    }
    for (int i = 0; i < s->n_head * hd; i++) q[i] = rndf();

    kvq_cpu_attn_args a = {.a = {.n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = hd,
                                 .scale = 1.0f / sqrtf((float)hd), .window = 0},
                           .type_k = t, .type_v = t, .rotate_k = rotate, .rotate_v = rotate, .n_ctx = ctx};
    double best = 1e30;
    for (int rep = -1; rep < reps; rep++) { /* rep -1 warms up */
        const double t0 = kvq_tool_now();
        for (size_t l = 0; l < n_layers; l++) {
            a.k = K + l * layer;
            a.v = V + l * layer;
            kvq_cpu_attention(&a, q, out, ctx - 1, 1, nt);
        }
        const double dt = (kvq_tool_now() - t0) / (double)n_layers;
        if (rep >= 0 && dt < best) best = dt;
    }
    for (int i = 0; i < s->n_head * hd; i++)
        if (!isfinite(out[i])) return kvq_tool_die(PROG, "non-finite attention output");
    res->ms_layer = best * 1e3;
    res->bytes_layer = 2.0 * (double)layer;
    res->ok = 1;
    kvq_free_aligned(K);
    kvq_free_aligned(V);
    free(q);
    free(out);
    return 0;
}

static int usage(FILE *f) {
    fprintf(f, "usage: kvq-bench attn [-t THREADS] [--ctx N,N,...] [--reps N] [--ws-mb MB] [--shape NAME]\n"
               "  decode attention (1 token) from f16 / q8 / q4 (rotated) K+V caches\n"
               "  -t        threads (default 2)\n"
               "  --ctx     context lengths (default 1024,4096,8192,16384)\n"
               "  --reps    timed passes, best is reported (default 5)\n"
               "  --ws-mb   least cache bytes cycled through per configuration (default 1024)\n"
               "  --shape   llama3-8b or llama2-7b (default both)\n"
               "  --backend cpu (default) or vulkan: device time from timestamps, vs a copy shader's bandwidth\n"
               "  KVQ_ISA=scalar|avx2|avx512 caps the kernels\n");
    return f == stderr ? 1 : 0;
}

int kvq_bench_attn(int argc, char **argv) {
    long nt = 2, reps = 5, ws_mb = 1024;
    int ctxs[16] = {1024, 4096, 8192, 16384}, n_ctx = 4;
    const char *only = NULL, *backend = NULL;
    /* argv[0] is the subcommand ("attn"); options follow. */
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) return usage(stdout);
        if (!val) return usage(stderr);
        i++;
        if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            if (kvq_tool_parse_int(val, 1, 1024, &nt)) return kvq_tool_die(PROG, "-t needs a number in 1..1024");
        } else if (!strcmp(o, "--reps")) {
            if (kvq_tool_parse_int(val, 1, 1000, &reps)) return kvq_tool_die(PROG, "--reps needs a number in 1..1000");
        } else if (!strcmp(o, "--ws-mb")) {
            if (kvq_tool_parse_int(val, 1, 1 << 20, &ws_mb)) return kvq_tool_die(PROG, "--ws-mb needs a number of MB");
        } else if (!strcmp(o, "--backend")) {
            backend = val;
        } else if (!strcmp(o, "--shape")) {
            only = val;
            int found = 0;
            for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++) found |= !strcmp(val, SHAPES[k].name);
            if (!found) return kvq_tool_die(PROG, "unknown shape '%s' (llama3-8b, llama2-7b)", val);
        } else if (!strcmp(o, "--ctx")) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", val);
            n_ctx = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                long c;
                if (n_ctx == 16 || kvq_tool_parse_int(tok, 1, 1 << 22, &c))
                    return kvq_tool_die(PROG, "--ctx wants up to 16 numbers separated by commas");
                ctxs[n_ctx++] = (int)c;
            }
        } else {
            return usage(stderr);
        }
    }

    if (backend && strcmp(backend, "cpu") != 0)
        return kvq_bench_attn_device(backend, ctxs, n_ctx, only, (int)reps, (size_t)ws_mb << 20);
    const double bw = kvq_bench_mem_bw_gbs((int)nt);
    printf("attn: decode attention for 1 token, %ld threads, kernels %s\n", nt, kvq_isa_name(kvq_cpu_isa()));
    printf("memory bandwidth (streaming read, %ld threads, best of 5): %.1f GB/s\n", nt, bw);
    printf("timed: one layer's attention (all heads) per call, cycling through >= %ld MB of cache; "
           "ms/token = 32 layers\n\n",
           ws_mb);
    printf("%-10s %6s %4s %10s %10s %10s %8s %7s %8s\n", "shape", "ctx", "kv", "ms/layer", "ms/token", "MB/token",
           "GB/s", "bw%", "vs f16");

    result last[N_TYPES] = {{0}};
    const shape *last_s = NULL;
    int last_ctx = 0, have_target = 0;
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const shape *s = &SHAPES[si];
        if (only && strcmp(only, s->name)) continue;
        for (int ci = 0; ci < n_ctx; ci++) {
            result r[N_TYPES] = {{0}};
            for (int ti = 0; ti < N_TYPES; ti++) {
                if (bench_one(s, ctxs[ci], TYPES[ti], (int)nt, (int)reps, (size_t)ws_mb << 20, &r[ti])) return 1;
                const double gbs = r[ti].bytes_layer / (r[ti].ms_layer * 1e-3) / 1e9;
                char vs[16] = "";
                if (ti > 0) snprintf(vs, sizeof vs, "%.2fx", r[0].ms_layer / r[ti].ms_layer);
                printf("%-10s %6d %4s %10.4f %10.3f %10.1f %8.1f %6.0f%% %8s\n", s->name, ctxs[ci],
                       TYPE_NAMES[ti], r[ti].ms_layer, r[ti].ms_layer * s->n_layer,
                       r[ti].bytes_layer * s->n_layer / 1e6, gbs, bw > 0 ? 100.0 * gbs / bw : 0.0, vs);
                fflush(stdout);
            }
            /* the summary line reports ctx 8192 on llama3-8b when measured, else the last row */
            if (!have_target) {
                memcpy(last, r, sizeof last);
                last_s = s;
                last_ctx = ctxs[ci];
                have_target = ctxs[ci] == 8192 && si == 0;
            }
        }
    }
    if (!last_s) return kvq_tool_die(PROG, "nothing to run");
    const double q4_gbs = last[2].bytes_layer / (last[2].ms_layer * 1e-3) / 1e9;
    printf("\nattn ctx=%d shape=%s f16_ms=%.3f q8_ms=%.3f q4_ms=%.3f q4_bw_ratio=%.2f\n", last_ctx, last_s->name,
           last[0].ms_layer * last_s->n_layer, last[1].ms_layer * last_s->n_layer, last[2].ms_layer * last_s->n_layer,
           bw > 0 ? q4_gbs / bw : 0.0);
    return 0;
}
