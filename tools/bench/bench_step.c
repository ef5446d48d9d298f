/* `kvq-bench step`: what one matmul of a step of N = 1, 2, 4, 8, 16 tokens
 * costs on one AQLM weight (issue 34: a 2-16 token step for little more than
 * one), for the default (1x16: int8 codewords), --exact and --no-aqlm-i8 paths, and the ceilings that
 * bound it: codes per second of the one-token call (the decode: gathers or
 * lookups) and multiply-adds per second of each extra token, beside the
 * int8 tile kernel's (the fastest integer dot product here, kvq_i8t panel).
 *
 * Times are the calling thread's CPU time (one thread, best of --reps): on a
 * shared 2-vCPU machine wall time mostly measures the neighbours, and a
 * longer call is preempted more often, which skews exactly the ratios asked
 * for. The weight is small enough to stay in L2/L3, so this is the kernels'
 * cost, not the memory's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "common.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "cpu/i8tile/i8tile_kernels.h"
#include "util.h"

int kvq_bench_step(int argc, char **argv);

static const char *PROG = "kvq-bench step";

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t g_rng = 0x34a1b2c3d4e5f607ull;

/* The int8 tile kernel on a 64-row panel of random bytes, 16 tokens over
 * cols: GMAC/s of one thread (0 when this CPU has none). */
static double dot_ceiling(int cols, int reps) {
    const kvq_i8t_kernel *ik = kvq_i8t_kernel_for_cpu();
    if (!ik) return 0.0;
    int kp = kvq_i8t_cols_pad(cols), nb = kp / KVQ_I8T_KB, n = 16;
    int8_t *wp = kvq_alloc_aligned((size_t)KVQ_I8T_PR * kp), *xq = kvq_alloc_aligned((size_t)n * kp);
    float *sw = kvq_alloc_aligned((size_t)nb * KVQ_I8T_PR * 4), *sa = kvq_alloc_aligned((size_t)n * nb * 4);
    int32_t *wsum = kvq_alloc_aligned((size_t)nb * KVQ_I8T_PR * 4);
    float *yt = kvq_alloc_aligned((size_t)n * KVQ_I8T_PR * 4);
    if (!wp || !xq || !sw || !sa || !wsum || !yt) return 0.0;
    for (size_t i = 0; i < (size_t)KVQ_I8T_PR * kp; i++) wp[i] = (int8_t)(kvq_bench_rnd(&g_rng) % 255 - 127);
    for (size_t i = 0; i < (size_t)n * kp; i++) xq[i] = (int8_t)(kvq_bench_rnd(&g_rng) % 255 - 127);
    for (size_t i = 0; i < (size_t)nb * KVQ_I8T_PR; i++) sw[i] = 1e-3f, wsum[i] = 0;
    for (size_t i = 0; i < (size_t)n * nb; i++) sa[i] = 1e-3f;
    double best = 1e30;
    for (int r = 0; r < reps * 20; r++) {
        memset(yt, 0, (size_t)n * KVQ_I8T_PR * 4);
        double t0 = cpu_now();
        ik->panel(wp, sw, wsum, 0, nb, xq, (size_t)kp, sa, (size_t)nb, n, yt);
        double dt = cpu_now() - t0;
        best = dt < best ? dt : best;
    }
    kvq_free_aligned(wp), kvq_free_aligned(xq), kvq_free_aligned(sw), kvq_free_aligned(sa);
    kvq_free_aligned(wsum), kvq_free_aligned(yt);
    return (double)KVQ_I8T_PR * kp * n / best / 1e9;
}

#if defined(__x86_64__)
#include <immintrin.h>
/* The floor of any 1x16 kernel that gathers each codeword once per step:
 * one vpgatherqq of 8 int8 codewords per 64 values from a 512 KiB codebook,
 * then one vpdpbusd per token into int32 sums, no scales at all (what a
 * codebook with one scale and activations with one scale per row would
 * need). Returns the CPU seconds of one pass over rows x cols for T tokens. */
#define BARE(T)                                                                                                        \
    static __attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) double bare_##T(                           \
        const uint16_t *codes, const int8_t *cbq, const uint8_t *xu, int rows, int steps) {                            \
        double t0 = cpu_now();                                                                                         \
        __m512i sink = _mm512_setzero_si512();                                                                         \
        for (int o = 0; o < rows; o++) {                                                                               \
            __m512i acc[T];                                                                                            \
            for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();                                              \
            const uint16_t *c = codes + (size_t)o * steps * 8;                                                         \
            for (int u = 0; u < steps; u++) {                                                                          \
                __m512i gi = _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(c + 8 * u)));                    \
                __m512i cw = _mm512_i64gather_epi64(gi, (const long long *)(const void *)cbq, 8);                     \
                for (int t = 0; t < T; t++)                                                                            \
                    acc[t] = _mm512_dpbusd_epi32(acc[t], _mm512_loadu_si512(xu + ((size_t)t * (steps + 1) + u) * 64), cw);\
            }                                                                                                          \
            for (int t = 0; t < T; t++) sink = _mm512_add_epi32(sink, acc[t]);                                         \
        }                                                                                                              \
        volatile int keep = _mm512_reduce_add_epi32(sink);                                                             \
        (void)keep;                                                                                                    \
        return cpu_now() - t0;                                                                                         \
    }
BARE(1)
BARE(8)
#undef BARE
/* The same with the --aqlm-i8 kernel's widths: the gathered codewords
 * widened to int16 once per step, then two vpdpwssd per token on int16
 * activations (twice the bytes of the int8 loop's). */
#define BARE16(T)                                                                                                      \
    static __attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) double bare16_##T(                         \
        const uint16_t *codes, const int8_t *cbq, const uint8_t *xu, int rows, int steps) {                            \
        double t0 = cpu_now();                                                                                         \
        __m512i sink = _mm512_setzero_si512();                                                                         \
        for (int o = 0; o < rows; o++) {                                                                               \
            __m512i acc[T];                                                                                            \
            for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();                                              \
            const uint16_t *c = codes + (size_t)o * steps * 8;                                                         \
            for (int u = 0; u < steps; u++) {                                                                          \
                __m512i gi = _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(c + 8 * u)));                    \
                __m512i cw = _mm512_i64gather_epi64(gi, (const long long *)(const void *)cbq, 8);                     \
                __m512i w0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(cw));                                        \
                __m512i w1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(cw, 1));                                  \
                for (int t = 0; t < T; t++) {                                                                          \
                    const uint8_t *xt = xu + ((size_t)t * (steps + 1) + u) * 128;                                      \
                    acc[t] = _mm512_dpwssd_epi32(acc[t], _mm512_loadu_si512(xt), w0);                                  \
                    acc[t] = _mm512_dpwssd_epi32(acc[t], _mm512_loadu_si512(xt + 64), w1);                             \
                }                                                                                                      \
            }                                                                                                          \
            for (int t = 0; t < T; t++) sink = _mm512_add_epi32(sink, acc[t]);                                         \
        }                                                                                                              \
        volatile int keep = _mm512_reduce_add_epi32(sink);                                                             \
        (void)keep;                                                                                                    \
        return cpu_now() - t0;                                                                                         \
    }
BARE16(1)
BARE16(8)
#undef BARE16

/* n=8 over n=1 time of the bare loop, int8 or (wide) int16 (0 where there
 * is no AVX-512 VNNI). */
static double bare_ratio(int rows, int cols, int reps, int wide) {
    if (!kvq_cpu_isa_available(KVQ_ISA_AVX512) || !kvq_cpu_has_vnni()) return 0.0;
    int steps = cols / 64;
    uint16_t *codes = malloc((size_t)rows * steps * 8 * 2);
    int8_t *cbq = kvq_alloc_aligned((size_t)65536 * 8);
    uint8_t *xu = kvq_alloc_aligned((size_t)8 * (steps + 1) * 128); /* a token's stride off 4 KiB multiples */
    if (!codes || !cbq || !xu) return 0.0;
    for (size_t i = 0; i < (size_t)rows * steps * 8; i++) codes[i] = (uint16_t)kvq_bench_rnd(&g_rng);
    for (size_t i = 0; i < (size_t)65536 * 8; i++) cbq[i] = (int8_t)kvq_bench_rnd(&g_rng);
    for (size_t i = 0; i < (size_t)8 * (steps + 1) * 128; i++) xu[i] = (uint8_t)kvq_bench_rnd(&g_rng);
    double b1 = 1e30, b8 = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = (wide ? bare16_1 : bare_1)(codes, cbq, xu, rows, steps);
        b1 = t < b1 ? t : b1;
        t = (wide ? bare16_8 : bare_8)(codes, cbq, xu, rows, steps);
        b8 = t < b8 ? t : b8;
    }
    free(codes), kvq_free_aligned(cbq), kvq_free_aligned(xu);
    return b8 / b1;
}
#else
static double bare_ratio(int rows, int cols, int reps, int wide) {
    return (void)rows, (void)cols, (void)reps, (void)wide, 0.0;
}
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: kvq-bench step [--rows R] [--cols C] [--scheme 1x16|2x8] [--exact] [--no-aqlm-i8] [--reps N]\n"
               "  1x16 runs the default int8 codewords (mode=aqlm-i8); --no-aqlm-i8 the fp16 codebook's gathers (mode=gather)\n"
               "  one thread, CPU time: prints `step scheme= mode= rows= cols= n= cpu_ms= ratio_to_1= per_extra_ms=`\n"
               "  for n = 1, 2, 4, 8, 16, then `ceiling codes_per_s= extra_gmacs= dot_gmacs=` (one-token call's codes/s,\n"
               "  multiply-adds/s of an extra token at n = 8, the int8 tile kernel's at 16 tokens, and n=8 over n=1 of a bare\n"
               "  1x16 loop: one codeword gather per 8 codes and one vpdpbusd per token, no scales, and of the same loop with\n"
               "  the codewords widened to int16 and two vpdpwssd per token, as --aqlm-i8 does; AVX-512 VNNI only)\n");
}

int kvq_bench_step(int argc, char **argv) {
    int rows = 4096, cols = 4096, exact = 0, i8 = 1, reps = 20, m = 1, nbits = 16;
    const char *scheme = "1x16";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--exact")) exact = 1;
        else if (!strcmp(a, "--aqlm-i8")) i8 = 1;
        else if (!strcmp(a, "--no-aqlm-i8")) i8 = 0;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout), 0;
        else if (i + 1 < argc && !strcmp(a, "--scheme")) {
            scheme = argv[++i];
            if (!strcmp(scheme, "2x8")) m = 2, nbits = 8;
            else if (strcmp(scheme, "1x16")) return kvq_tool_die(PROG, "--scheme takes 1x16 or 2x8");
        } else if (i + 1 < argc && (!strcmp(a, "--rows") || !strcmp(a, "--cols") || !strcmp(a, "--reps"))) {
            int v = atoi(argv[++i]);
            if (v < 1 || v > (1 << 16)) return kvq_tool_die(PROG, "%s: bad value %s", a, argv[i]);
            *(!strcmp(a, "--rows") ? &rows : !strcmp(a, "--cols") ? &cols : &reps) = v;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (cols % 32) return kvq_tool_die(PROG, "--cols must be a multiple of 32");
    int ig = 8, cb = nbits > 8 ? 2 : 1;
    size_t K = (size_t)1 << nbits, n_codes = (size_t)rows * (cols / ig) * m;
    uint8_t *codes = malloc(n_codes * cb);
    uint16_t *cbk = malloc((size_t)m * K * ig * 2), *scales = malloc((size_t)rows * 2);
    float *x = malloc(sizeof(float) * 16 * cols), *y = malloc(sizeof(float) * 16 * rows);
    if (!codes || !cbk || !scales || !x || !y) return kvq_tool_die(PROG, "out of memory");
    for (size_t i = 0; i < n_codes * cb; i++) codes[i] = (uint8_t)kvq_bench_rnd(&g_rng);
    for (size_t i = 0; i < (size_t)m * K * ig; i++) cbk[i] = kvq_f32_to_f16(kvq_bench_rndf(&g_rng) * 0.1f);
    for (int o = 0; o < rows; o++) scales[o] = kvq_f32_to_f16(0.5f + kvq_bench_rndf(&g_rng) * 0.25f);
    for (int k = 0; k < 16 * cols; k++) x[k] = kvq_bench_rndf(&g_rng);
    kvq_weight_desc d = {.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = m, .nbits = nbits,
                         .in_group = ig, .code_bytes = cb, .codes = codes, .codebooks = cbk, .scales = scales,
                         .name = "bench.step", .i8 = i8 && !exact, .exact = exact};
    kvq_cpu_weight *w = kvq_cpu_weight_new(&d);
    if (!w) return kvq_tool_die(PROG, "%s", kvq_last_error());
    const char *mode = exact ? "exact" : i8 && m == 1 ? "aqlm-i8" : m == 1 ? "gather" : "default";
    static const int ns[] = {1, 2, 4, 8, 16};
    double t1 = 0.0, t8 = 0.0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k];
        double best = 1e30;
        kvq_cpu_matmul(w, x, y, n, 1); /* scratch, caches */
        for (int r = 0; r < reps; r++) {
            double t0 = cpu_now();
            kvq_cpu_matmul(w, x, y, n, 1);
            double dt = cpu_now() - t0;
            best = dt < best ? dt : best;
        }
        if (n == 1) t1 = best;
        if (n == 8) t8 = best;
        printf("step scheme=%s mode=%s rows=%d cols=%d n=%d cpu_ms=%.3f ratio_to_1=%.2f per_extra_ms=%.3f\n", scheme, mode,
               rows, cols, n, best * 1e3, best / t1, n > 1 ? (best - t1) / (n - 1) * 1e3 : 0.0);
    }
    double macs = (double)rows * cols;
    printf("ceiling scheme=%s mode=%s codes_per_s=%.3g extra_gmacs=%.1f dot_gmacs=%.1f bare_gather_dot_ratio8=%.2f "
           "bare_gather_i16_ratio8=%.2f\n",
           scheme, mode, (double)n_codes / t1, macs / ((t8 - t1) / 7.0) / 1e9, dot_ceiling(cols, reps),
           bare_ratio(rows, cols / 64 * 64, reps, 0), bare_ratio(rows, cols / 64 * 64, reps, 1));
    kvq_cpu_weight_free(w);
    free(codes), free(cbk), free(scales), free(x), free(y);
    return 0;
}
