/* `kvq-bench isa`: every CPU class this machine can run (KVQ_ISA=scalar|avx2|avxvnni|avx512), side
 * by side: the AQLM GEMV bandwidth ratios of each scheme (a `kvq-bench aqlm` child per class and
 * shape), optionally the 7B decode/prompt (`--model`: a `kvq-bench model --synthetic` child per class
 * and scheme), and for the AVX2 classes the lookup ceiling of the 8-bit-code kernels: how many table
 * lookups per second a core does with codes and tables already in L1, and so the best bandwidth ratio
 * any lookup kernel could reach on the GEMV shapes (one lookup per code byte). Children, not calls:
 * the kernel choice is made once per process. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "util.h"

int kvq_bench_isa(int argc, char **argv);

static const char *PROG = "kvq-bench isa";

/* The number after " key=" in line, or -1. */
static double field(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    return p ? atof(p + strlen(pat)) : -1.0;
}

/* Runs `KVQ_ISA=cls <this program> args`, keeping the last stdout lines that start with want1 / want2. */
static int child(const char *cls, const char *args, const char *want1, char *out1, const char *want2, char *out2,
                 size_t n) {
    char exe[4096], cmd[8192], line[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return 1;
    exe[len] = 0;
    snprintf(cmd, sizeof cmd, "KVQ_ISA=%s '%s' %s 2>/dev/null", cls, exe, args);
    FILE *f = popen(cmd, "r");
    if (!f) return 1;
    out1[0] = out2[0] = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, want1, strlen(want1))) snprintf(out1, n, "%s", line);
        if (want2 && !strncmp(line, want2, strlen(want2))) snprintf(out2, n, "%s", line);
    }
    return pclose(f) != 0 || !out1[0];
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__)
/* Lookups per second on nt threads together, each thread running the AVX2 kernel (loads or
 * gathers) over its own 16 steps of 1024 rows (16 KB of codes, 16 KB of tables: all in L1),
 * best of 20 calls per thread. */
static double lookup_rate(int loads, int nt) {
    enum { ROWS = 1024, STEPS = 16, REPS = 20 };
    double best = 0;
#pragma omp parallel num_threads(nt) reduction(+ : best)
    {
        uint8_t *codes = kvq_alloc_aligned((size_t)ROWS * STEPS);
        float *lut = kvq_alloc_aligned(sizeof(float) * 256 * STEPS), *acc = kvq_alloc_aligned(sizeof(float) * ROWS);
        if (codes && lut && acc) {
            uint64_t r = 0x9e3779b97f4a7c15ull + (uint64_t)omp_get_thread_num();
            for (size_t i = 0; i < (size_t)ROWS * STEPS; i++) codes[i] = (uint8_t)kvq_bench_rnd(&r);
            for (int i = 0; i < 256 * STEPS; i++) lut[i] = kvq_bench_rndf(&r);
            memset(acc, 0, sizeof(float) * ROWS);
            kvq_cpu_weight w = {.kind = KVQ_CW_AQLM_LUT, .rows = ROWS, .rows_pad = ROWS, .M = 2, .G = STEPS / 2,
                                .nbits = 8, .codes = codes};
            double t_best = 1e9;
            for (int rep = 0; rep < REPS; rep++) {
#pragma omp barrier
                double t0 = now_s();
                (loads ? kvq_aqlm_lut_gemv_rows : kvq_aqlm_lut_gemv_avx2)(&w, lut, 0, STEPS, acc, 0, ROWS);
                double dt = now_s() - t0;
                if (dt < t_best) t_best = dt;
            }
            best = (double)ROWS * STEPS / t_best;
        }
        kvq_free_aligned(codes), kvq_free_aligned(lut), kvq_free_aligned(acc);
    }
    return best;
}
#endif

static int usage(FILE *f) {
    fprintf(f, "usage: kvq-bench isa [-t N] [--model] [-p N] [-n N] [--classes LIST]\n"
               "  for every CPU class this machine runs (scalar, avx2, avxvnni, avx512; LIST: comma-separated),\n"
               "  the AQLM GEMV bandwidth ratios (4096x14336, 14336x4096; kvq-bench aqlm), with --model the 7B\n"
               "  decode and prompt (kvq-bench model --synthetic llama2-7b, -p N -n N, default 64 / 16; not for\n"
               "  scalar), and for avx2 the lookup ceiling of the 8-bit-code kernels (codes and tables in L1)\n");
    return f == stdout ? 0 : 1;
}

int kvq_bench_isa(int argc, char **argv) {
    long nt = 2, pp = 64, tg = 16;
    int model = 0;
    const char *classes = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!strcmp(a, "--model")) model = 1;
        else if (i + 1 < argc && !strcmp(a, "-t")) nt = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "-p")) pp = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "-n")) tg = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--classes")) classes = argv[++i];
        else return kvq_tool_die(PROG, "unknown option '%s' (see --help)", a);
    }
    if (nt < 1 || pp < 1 || tg < 1) return kvq_tool_die(PROG, "-t, -p and -n take positive numbers");
    const char *all[] = {"scalar", "avx2", "avxvnni", "avx512", "neon"};
    int can[] = {1, kvq_cpu_isa_available(KVQ_ISA_AVX2), kvq_cpu_isa_available(KVQ_ISA_AVX2) && kvq_cpu_has_avxvnni(),
                 kvq_cpu_isa_available(KVQ_ISA_AVX512), kvq_cpu_isa_available(KVQ_ISA_NEON)};
    printf("isa: threads %ld; CPU classes here:", nt);
    for (int c = 0; c < 5; c++)
        if (can[c]) printf(" %s", all[c]);
    printf("\n");
    double bw = 0;
    static const int shapes[2][2] = {{4096, 14336}, {14336, 4096}};
    for (int c = 0; c < 5; c++) {
        if (!can[c] || (classes && !strstr(classes, all[c]))) continue;
        if (!classes && c == 0 && model) continue; /* scalar: minutes per GEMV shape; ask for it by name */
        char args[256], l1[4096], l2[4096], ml[4096];
        for (int s = 0; s < 2; s++) {
            snprintf(args, sizeof args, "aqlm -t %ld --rows %d --cols %d", nt, shapes[s][0], shapes[s][1]);
            if (child(all[c], args, "aqlm rows=", l1, "bandwidth best_gbs=", l2, sizeof l1)) {
                printf("isa %s %dx%d: the aqlm child failed\n", all[c], shapes[s][0], shapes[s][1]);
                continue;
            }
            double b = field(l2, "best_gbs");
            if (b > bw) bw = b;
            double r16 = field(l1, "1x16_bw_ratio"), sp = field(l1, "1x16i8_speedup");
            printf("isa class=%s rows=%d cols=%d 2x8_bw_ratio=%.3f 1x16_bw_ratio=%.3f 1x16i8_bw_ratio=%.3f "
                   "2x8_ms=%.3f 1x16_ms=%.3f 1x16i8_ms=%.3f bw_gbs=%.1f\n", all[c], shapes[s][0], shapes[s][1],
                   field(l1, "2x8_bw_ratio"), r16, r16 * sp, field(l1, "2x8_ms"), field(l1, "1x16_ms"),
                   field(l1, "1x16i8_ms"), b);
            fflush(stdout);
        }
        if (model && c != 0)
            for (int k = 0; k < 2; k++) {
                const char *sch = k ? "1x16" : "2x8";
                snprintf(args, sizeof args, "model --synthetic llama2-7b --scheme %s -t %ld -p %ld -n %ld --reps 2", sch,
                         nt, pp, tg);
                if (child(all[c], args, "model ", ml, NULL, NULL, sizeof ml)) {
                    printf("isa %s model %s: the model child failed\n", all[c], sch);
                    continue;
                }
                printf("isa class=%s model=llama2-7b scheme=%s pp_tps=%.2f tg_tps=%.2f tg_bw_ratio=%.3f", all[c], sch,
                       field(ml, "pp_tps"), field(ml, "tg_tps"), field(ml, "tg_bw_ratio"));
                if (k) printf(" tg_i8_speedup=%.3f", field(ml, "tg_i8_speedup"));
                printf("\n");
                fflush(stdout);
            }
    }
#if defined(__x86_64__)
    if (can[1] && (!classes || strstr(classes, "avx2"))) {
        /* One lookup per code byte: at the L1 rate of the faster kernel, a GEMV of rows x cols 2x8
         * (rows * cols / 4 lookups, as many bytes of codes) takes at least this long. */
        double g = lookup_rate(0, (int)nt), l = lookup_rate(1, (int)nt), best = g > l ? g : l;
        printf("isa avx2 lookups in L1 (%ld threads): gathers %.2f G/s, plain loads %.2f G/s\n", nt, g / 1e9, l / 1e9);
        for (int s = 0; s < 2 && bw > 0; s++) {
            double lookups = (double)shapes[s][0] * shapes[s][1] / 4, t = lookups / best, t_mem = lookups / (bw * 1e9);
            printf("isa ceiling class=avx2 rows=%d cols=%d 2x8_min_ms=%.3f 2x8_bw_ratio_max=%.3f (lookups alone, "
                   "codes and tables in L1, bandwidth %.1f GB/s)\n", shapes[s][0], shapes[s][1], t * 1e3, t_mem / t, bw);
        }
    }
#endif
    return 0;
}
