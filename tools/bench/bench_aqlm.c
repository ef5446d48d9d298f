/* `kvq-bench aqlm`: AQLM decode GEMV speed against this machine's memory
 * bandwidth. Decode streams every weight once per token, so the goal is a
 * GEMV that reads codes + scales as fast as a plain streaming read does.
 *
 * Bandwidth comes from kvq_bench_mem_bw_gbs (bench_common.c, shared with the
 * other subcommands). Each AQLM shape is uploaded in enough copies to span
 * --mb megabytes (1024) and the copies are cycled, so the GEMV is not a cache
 * benchmark either. Every copy has its own codes: 16-bit codes are used in
 * place, so copies sharing one buffer would share the memory too. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "util.h"

int kvq_bench_aqlm(int argc, char **argv);

static const char *PROG = "kvq-bench aqlm";

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) { return kvq_bench_rnd(&g_rng); }
static float rndf(void) { return kvq_bench_rndf(&g_rng); }

typedef struct {
    double ms, gbs, bytes, med_ms; /* best call, its GB/s, bytes per call, median call */
} result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int g_cb8;  /* --cb8: the 1x16 weights keep int8 codebooks */
static int g_lut8; /* --lut8: the 2x8 weights are looked up through int8 tables */
static int g_m8 = 2; /* --codebooks M: codebooks of the 8-bit-code format (2x8; 8x8 = Llama-2-7b's catalog entry) */

/* bench_format's int8 codeword option (desc i8) for the next call */
static int g_i8;

/* Times n=1 matmuls over enough uploads of one random AQLM weight to span min_bytes. */
static int bench_format(int rows, int cols, int M, int nbits, size_t min_bytes, int nt, result *res) {
    int ig = 8, G = cols / ig, cbytes = nbits > 8 ? 2 : 1;
    size_t n_codes = (size_t)rows * G * M, K = (size_t)1 << nbits;
    uint16_t *cb = malloc(M * K * ig * sizeof *cb), *scales = malloc((size_t)rows * sizeof *scales);
    float *x = malloc((size_t)cols * sizeof *x), *y = malloc((size_t)rows * sizeof *y);
    if (!cb || !scales || !x || !y) return kvq_tool_die(PROG, "out of memory");
    for (size_t i = 0; i < M * K * ig; i++) cb[i] = kvq_f32_to_f16(rndf() * 0.1f);
    for (int o = 0; o < rows; o++) scales[o] = kvq_f32_to_f16(0.5f + rndf() * 0.25f);
    for (int k = 0; k < cols; k++) x[k] = rndf();
    kvq_weight_desc d = {.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = M, .nbits = nbits,
                         .in_group = ig, .code_bytes = cbytes, .codebooks = cb, .scales = scales, .name = "bench.aqlm",
                         .cb8 = g_cb8, .lut8 = g_lut8, .i8 = g_i8};

    /* What one GEMV must stream: codes plus (f32) scales. Codebooks are not
     * counted (2x8: 16 KB; 1x16: 1 MB fp16), but as in a model every copy has
     * its own, so a 1x16 GEMV finds its codebook cold too. */
    double bytes = (double)n_codes * cbytes + (double)rows * sizeof(float);
    int copies = (int)((double)min_bytes / bytes) + 1;
    kvq_cpu_weight **w = calloc((size_t)copies, sizeof *w);
    uint8_t **codes = calloc((size_t)copies, sizeof *codes);
    uint16_t **cbs = calloc((size_t)copies, sizeof *cbs);
    if (!w || !codes || !cbs) return kvq_tool_die(PROG, "out of memory");
    for (int i = 0; i < copies; i++) {
        if (!(codes[i] = kvq_alloc_aligned(n_codes * cbytes))) return kvq_tool_die(PROG, "out of memory");
        if (!(cbs[i] = kvq_alloc_aligned(M * K * ig * sizeof *cb))) return kvq_tool_die(PROG, "out of memory");
        memcpy(cbs[i], cb, M * K * ig * sizeof *cb);
        d.codebooks = cbs[i];
        for (size_t j = 0; j < n_codes * cbytes; j += 4) { /* n_codes is a multiple of 4: rows x (cols/8), cols % 32 == 0 */
            uint32_t r = rnd();
            memcpy(codes[i] + j, &r, 4);
        }
        d.codes = codes[i];
        if (!(w[i] = kvq_cpu_weight_new(&d))) return kvq_tool_die(PROG, "%s", kvq_last_error());
    }

    for (int i = 0; i < copies; i++) kvq_cpu_matmul(w[i], x, y, 1, nt); /* warm-up: page in, fill scratch */
    /* Best single GEMV: each copy was last touched a whole cycle (>= --mb MB)
     * ago, so every call reads its codes from memory; the machine may be
     * shared, and a descheduled thread stalls a whole matmul, so the best call
     * is what the code can do (a best pass over 1 GiB rarely sees a quiet spell). */
    /* The median call is kept too: in a model every call counts, and the
     * typical one was 1.2-1.3x the best on the shared VMs here. */
    double best = 1e30, t_start = kvq_tool_now(), *times = NULL;
    size_t n_times = 0, cap = 0;
    int passes = 0;
    do {
        for (int i = 0; i < copies; i++) {
            double t0 = kvq_tool_now();
            kvq_cpu_matmul(w[i], x, y, 1, nt);
            double dt = kvq_tool_now() - t0;
            if (dt < best) best = dt;
            if (n_times == cap) {
                double *nt2 = realloc(times, sizeof *times * (cap = cap ? 2 * cap : 1024));
                if (!nt2) return kvq_tool_die(PROG, "out of memory");
                times = nt2;
            }
            times[n_times++] = dt;
        }
        passes++;
    } while ((kvq_tool_now() - t_start < 2.0 || passes < 3) && passes < 10000);
    qsort(times, n_times, sizeof *times, cmp_double);
    res->med_ms = times[n_times / 2] * 1e3;
    free(times);
    res->ms = best * 1e3;
    res->bytes = bytes;
    res->gbs = bytes / best / 1e9;

    for (int i = 0; i < copies; i++) kvq_cpu_weight_free(w[i]), kvq_free_aligned(codes[i]), kvq_free_aligned(cbs[i]);
    free(w);
    free(codes);
    free(cbs);
    free(cb);
    free(scales);
    free(x);
    free(y);
    return 0;
}

/* Read bandwidth measured the way the GEMVs are: the best time to stream one
 * `chunk`-byte piece of a 1 GiB buffer (each piece last read 1 GiB ago), with
 * nt threads summing their slices. On a shared machine a whole-buffer pass is
 * rarely undisturbed; a best piece is, just as a best GEMV is. 0 on no memory. */
static double chunk_bw_gbs(int nt, size_t chunk) {
    const size_t total = (size_t)1 << 30, n = total / sizeof(uint64_t), cn = chunk / sizeof(uint64_t) / 64 * 64;
    uint64_t *buf = kvq_alloc_aligned(total);
    if (!buf || cn == 0) return kvq_free_aligned(buf), 0.0;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 1e30, t_start = kvq_tool_now();
    volatile uint64_t sink = 0;
    int passes = 0;
    do {
        for (size_t c0 = 0; c0 + cn <= n; c0 += cn) {
            uint64_t total_sum = 0;
            double t0 = kvq_tool_now();
#pragma omp parallel num_threads(nt) reduction(+ : total_sum)
            {
                int id = omp_get_thread_num(), T = omp_get_num_threads();
                size_t lo = c0 + cn / 8 * (size_t)id / (size_t)T * 8, hi = c0 + cn / 8 * (size_t)(id + 1) / (size_t)T * 8;
                uint64_t s[8] = {0};
                for (size_t i = lo; i < hi; i += 8)
                    for (int k = 0; k < 8; k++) s[k] += buf[i + (size_t)k];
                for (int k = 0; k < 8; k++) total_sum += s[k];
            }
            double dt = kvq_tool_now() - t0;
            sink += total_sum;
            if (dt < best) best = dt;
        }
        passes++;
    } while (kvq_tool_now() - t_start < 2.0 || passes < 3);
    (void)sink;
    kvq_free_aligned(buf);
    return (double)(cn * sizeof(uint64_t)) / best / 1e9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kvq-bench aqlm [-t THREADS] [--rows R --cols C] [--mb MB] [--no-vbmi] [--f32-lut] [--lut8] [--cb8] [--codebooks M] [--avx2-lut L]\n"
               "  default shapes: 4096x4096, 11008x4096 (Llama-2-7B), 4096x14336, 14336x4096 (Llama-3-8B); MB: weight copies cycled per shape (1024: past any LLC)\n"
               "  KVQ_ISA=scalar|avx2|avx512 caps the kernels; --no-vbmi skips the AVX-512 VBMI lookups,\n"
               "  --f32-lut uses them with f32 tables instead of int16 tables, --lut8 with int8 tables (--aqlm-lut8);\n"
               "  --cb8: 1x16 with int8 codebooks (--aqlm-cb8); every run also times 1x16 through int8 codewords and\n"
               "  int8 dot products (--aqlm-i8) as 1x16i8, with its speedup over the exact 1x16 of the same run\n"
               "  --codebooks M: the 8-bit-code format with M codebooks instead of 2 (8 for 8x8)\n"
               "  --avx2-lut gathers|loads: how the AVX2 kernel looks tables up (default: loads on AMD, gathers elsewhere)\n");
}

int kvq_bench_aqlm(int argc, char **argv) {
    long nt = omp_get_max_threads(), rows = 0, cols = 0, mb = 1024, m8 = 2;
    int no_vbmi = 0, f32_lut = 0;
    /* argv[0] is the subcommand ("aqlm"); options follow. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *dst = NULL, lo = 1, hi = 1 << 20;
        if (!strcmp(a, "-t") || !strcmp(a, "--threads")) dst = &nt, hi = 1024;
        else if (!strcmp(a, "--rows")) dst = &rows;
        else if (!strcmp(a, "--cols")) dst = &cols, lo = 32;
        else if (!strcmp(a, "--mb")) dst = &mb, hi = 1 << 16;
        else if (!strcmp(a, "--codebooks")) dst = &m8, hi = 8;
        else if (!strcmp(a, "--no-vbmi")) {
            no_vbmi = 1;
            continue;
        } else if (!strcmp(a, "--f32-lut")) {
            f32_lut = 1;
            continue;
        } else if (!strcmp(a, "--avx2-lut")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (strcmp(v, "gathers") && strcmp(v, "loads")) return kvq_tool_die(PROG, "--avx2-lut needs gathers or loads");
            kvq_cpu_set_avx2_lut(!strcmp(v, "gathers") ? 1 : 2);
            continue;
        } else if (!strcmp(a, "--lut8")) {
            g_lut8 = 1;
            continue;
        } else if (!strcmp(a, "--cb8")) {
            g_cb8 = 1;
            continue;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 1;
        }
        if (i + 1 >= argc || kvq_tool_parse_int(argv[++i], lo, hi, dst) != 0)
            return kvq_tool_die(PROG, "%s needs a number in %ld..%ld", a, lo, hi);
    }
    if ((rows == 0) != (cols == 0)) return kvq_tool_die(PROG, "give both --rows and --cols");
    g_m8 = (int)m8;
    if (cols % 32) return kvq_tool_die(PROG, "--cols must be a multiple of 32");

    int shapes[4][2] = {{4096, 4096}, {11008, 4096}, {4096, 14336}, {14336, 4096}}, n_shapes = 4;
    if (rows) shapes[0][0] = (int)rows, shapes[0][1] = (int)cols, n_shapes = 1;

    int vbmi = kvq_cpu_isa() == KVQ_ISA_AVX512 && kvq_cpu_has_vbmi() && !no_vbmi ? (f32_lut ? 1 : 2) : 0;
    if (no_vbmi) kvq_cpu_set_vbmi(0);
    else if (f32_lut) kvq_cpu_set_vbmi(1);
    const char *lut = vbmi == 2 && g_lut8 ? "+vbmi, int8 tables"
                      : vbmi == 2 ? "+vbmi, int16 tables"
                      : vbmi       ? "+vbmi, f32 tables"
                      : kvq_cpu_isa() != KVQ_ISA_AVX2 ? ""
                      : kvq_cpu_avx2_lut_loads()      ? ", lookups by plain loads"
                                                      : ", lookups by gathers";
    printf("threads %ld, isa %s%s%s\n", nt, kvq_isa_name(kvq_cpu_isa()), lut, g_cb8 ? ", 1x16 with int8 codebooks" : "");
    fflush(stdout);

    /* Bandwidth before the GEMVs, after each shape and at the end; the ratios
     * use the best sample (on a shared machine one may land in someone else's
     * busy second) and the spread is printed. Measured in pieces the size of
     * the largest GEMV's codes, like the GEMVs themselves. */
    double piece = 0;
    for (int s = 0; s < n_shapes; s++) {
        double b = (double)shapes[s][0] * shapes[s][1] / 4;
        if (b > piece) piece = b;
    }
    double bw = chunk_bw_gbs((int)nt, (size_t)piece), bw_pass = kvq_bench_mem_bw_gbs((int)nt);
    if (bw <= 0) return kvq_tool_die(PROG, "cannot allocate the bandwidth test buffer");
    double bw_worst = bw;
    int bw_n = 1;
    result r[4][3]; /* [shape][2x8, 1x16, 1x16 with int8 codewords] */
    for (int s = 0; s < n_shapes; s++) {
        if (bench_format(shapes[s][0], shapes[s][1], g_m8, 8, (size_t)mb << 20, (int)nt, &r[s][0])) return 1;
        /* exact and int8 1x16 twice in turn, the best of each: on a shared
         * machine a busy spell then hits both, not one */
        for (int round = 0; round < 2; round++)
            for (int f = 1; f < 3; f++) {
                result t;
                g_i8 = f == 2;
                int st = bench_format(shapes[s][0], shapes[s][1], 1, 16, (size_t)mb << 20, (int)nt, &t);
                g_i8 = 0;
                if (st) return 1;
                if (round == 0 || t.ms < r[s][f].ms) r[s][f] = t;
            }
        double b = chunk_bw_gbs((int)nt, (size_t)piece);
        if (b > 0) {
            bw = b > bw ? b : bw, bw_worst = b < bw_worst ? b : bw_worst;
            bw_n++;
        }
    }
    double bw_pass2 = kvq_bench_mem_bw_gbs((int)nt);
    if (bw_pass2 > bw_pass) bw_pass = bw_pass2;
    printf("memory bandwidth (streaming read): %.2f GB/s best %.1f MB piece, %.2f GB/s best whole 1 GiB pass\n", bw,
           piece / 1e6, bw_pass);
    printf("bandwidth best_gbs=%.2f worst_gbs=%.2f spread=%.3f samples=%d (before, after each shape; ratios use the "
           "best)\n", bw, bw_worst, (bw - bw_worst) / bw, bw_n);

    char m8name[16];
    snprintf(m8name, sizeof m8name, "%dx8", g_m8);
    const char *fmt_name[3] = {m8name, "1x16", "1x16i8"};
    for (int s = 0; s < n_shapes; s++)
        for (int f = 0; f < 3; f++)
            printf("%5dx%-5d %-6s: %8.3f ms/token  %6.1f MB codes+scales  %7.2f GB/s  %.2f of bandwidth"
                   "  (median call %.3f ms)\n",
                   shapes[s][0], shapes[s][1], fmt_name[f], r[s][f].ms, r[s][f].bytes / 1e6, r[s][f].gbs,
                   r[s][f].gbs / bw, r[s][f].med_ms);
    /* One summary line per shape; the last stdout line is the last shape's. */
    for (int s = 0; s < n_shapes; s++)
        printf("aqlm rows=%d cols=%d %s_ms=%.4f 1x16_ms=%.4f %s_bw_ratio=%.3f 1x16_bw_ratio=%.3f %s_med_ms=%.4f "
               "1x16_med_ms=%.4f 1x16i8_ms=%.4f 1x16i8_speedup=%.3f\n", shapes[s][0], shapes[s][1], m8name, r[s][0].ms,
               r[s][1].ms, m8name, r[s][0].gbs / bw, r[s][1].gbs / bw, m8name, r[s][0].med_ms, r[s][1].med_ms,
               r[s][2].ms, r[s][1].ms / r[s][2].ms);
    return 0;
}
