/* `kvq-bench aqlm --backend vulkan`: AQLM (and dense f16) matmul speed of the
 * Vulkan backend, through the kvq_backend table. Decode (n = 1) is timed against
 * the device's bandwidth (the core's streaming copy shader, vk_bench.h, read +
 * write counted; the backend's copy op where the device has no timestamps),
 * prompt batches (-n) in TFLOP/s. Times are the device's own
 * (timestamps, backend device_ms) when it has them, wall clock otherwise.
 * Each shape is uploaded in enough copies to span --mb megabytes, cycled, so
 * decode is not a cache benchmark. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common.h"
#include "bench_common.h"
#include "util.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_bench.h"
#endif

int kvq_bench_vk_aqlm(int argc, char **argv);

static const char *PROG = "kvq-bench aqlm --backend vulkan";

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return kvq_bench_rnd(&g_rng); }
static float rndf(void) { return kvq_bench_rndf(&g_rng); }

typedef struct {
    const char *name;
    kvq_wformat fmt;
    int M, nbits, ig;
} scheme;

static const scheme SCHEMES[] = {
    {"2x8", KVQ_W_AQLM, 2, 8, 8},
    {"1x16", KVQ_W_AQLM, 1, 16, 8},
    {"f16", KVQ_W_F16, 0, 0, 0},
};
#define N_SCHEMES 3

typedef struct {
    const kvq_backend *be;
    kvq_bctx *b;
} dev;

/* ms of the work submitted by fn(i) for i < count, per call: device time when known. */
static double time_calls(dev *d, void (*fn)(dev *, void *, int), void *arg, int count, const kvq_buf *sync) {
    float probe;
    double best = 1e30, t_start = kvq_tool_now();
    int passes = 0;
    do {
        double t0 = kvq_tool_now();
        for (int i = 0; i < count; i++) fn(d, arg, i);
        if (d->be->buf_read(d->b, sync, 0, &probe, sizeof probe) != KVQ_OK) return -1;
        double wall = (kvq_tool_now() - t0) * 1e3, dev_ms = d->be->device_ms ? d->be->device_ms(d->b) : -1;
        double ms = (dev_ms > 0 ? dev_ms : wall) / count;
        if (passes > 0 && ms < best) best = ms; /* pass 0 warms up (pipelines, caches) */
        passes++;
    } while ((kvq_tool_now() - t_start < 1.0 || passes < 3) && passes < 1000);
    return best;
}

typedef struct {
    kvq_buf *a, *b;
    size_t bytes;
} copy_arg;

static void do_copy(dev *d, void *arg, int i) {
    copy_arg *c = arg;
    d->be->copy(d->b, i % 2 ? c->b : c->a, 0, i % 2 ? c->a : c->b, 0, c->bytes);
}

typedef struct {
    kvq_wt **w;
    int copies, n;
    kvq_buf *x, *y;
} mm_arg;

static void do_matmul(dev *d, void *arg, int i) {
    mm_arg *m = arg;
    d->be->matmul(d->b, m->w[i % m->copies], m->x, m->y, m->n);
}

/* A random weight of scheme s (host arrays freed by the caller via *blocks). */
static kvq_weight_desc make_weight(const scheme *s, int rows, int cols, void **blocks) {
    kvq_weight_desc d = {.fmt = s->fmt, .rows = rows, .cols = cols, .name = "bench.weight"};
    if (s->fmt != KVQ_W_AQLM) {
        uint16_t *p = malloc((size_t)rows * cols * 2);
        if (p)
            for (size_t i = 0; i < (size_t)rows * cols; i++) p[i] = kvq_f32_to_f16(rndf() * 0.1f);
        d.data = blocks[0] = p;
        return d;
    }
    int cb = s->nbits > 8 ? 2 : 1;
    size_t K = (size_t)1 << s->nbits, n_codes = (size_t)rows * (size_t)(cols / s->ig) * (size_t)s->M;
    uint8_t *codes = malloc(n_codes * cb);
    uint16_t *books = malloc((size_t)s->M * K * (size_t)s->ig * 2), *scales = malloc((size_t)rows * 2);
    if (codes && books && scales) {
        for (size_t i = 0; i < n_codes * cb; i++) codes[i] = (uint8_t)rnd();
        for (size_t i = 0; i < (size_t)s->M * K * (size_t)s->ig; i++) books[i] = kvq_f32_to_f16(rndf() * 0.1f);
        for (int o = 0; o < rows; o++) scales[o] = kvq_f32_to_f16(0.5f + rndf() * 0.25f);
    }
    blocks[0] = codes, blocks[1] = books, blocks[2] = scales;
    d.n_codebooks = s->M, d.nbits = s->nbits, d.in_group = s->ig, d.code_bytes = cb;
    d.codes = codes, d.codebooks = books, d.scales = scales;
    return d;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kvq-bench aqlm --backend vulkan [--device N] [--rows R --cols C] [--mb MB] [-n N] [--scheme S]\n"
               "  default shapes: 4096x4096 and 11008x4096 (Llama-2-7B); MB: weight copies cycled per shape\n"
               "  (256, 32 on a software device); N: prompt batch timed besides decode (128; 0: none);\n"
               "  S: only scheme 2x8, 1x16 or f16\n");
}

int kvq_bench_vk_aqlm(int argc, char **argv) {
    long rows = 0, cols = 0, mb = 0, n_prompt = 128;
    const char *device = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *dst = NULL, lo = 1, hi = 1 << 20;
        if (!strcmp(a, "--backend")) {
            if (i + 1 >= argc || strcmp(argv[++i], "vulkan")) return kvq_tool_die(PROG, "--backend must be vulkan here");
            continue;
        } else if (!strcmp(a, "--device")) {
            if (i + 1 >= argc) return kvq_tool_die(PROG, "--device needs a value");
            device = argv[++i];
            continue;
        } else if (!strcmp(a, "--scheme")) {
            if (i + 1 >= argc) return kvq_tool_die(PROG, "--scheme needs 2x8, 1x16 or f16");
            only = argv[++i];
            continue;
        } else if (!strcmp(a, "--rows")) dst = &rows;
        else if (!strcmp(a, "--cols")) dst = &cols, lo = 8;
        else if (!strcmp(a, "--mb")) dst = &mb, hi = 1 << 16;
        else if (!strcmp(a, "-n")) dst = &n_prompt, lo = 0, hi = 4096;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
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
    if (cols % 8) return kvq_tool_die(PROG, "--cols must be a multiple of 8");
    if (n_prompt > 0 && n_prompt < 5) return kvq_tool_die(PROG, "-n must be 0 (no prompt timing) or 5..4096");
    int shapes[2][2] = {{4096, 4096}, {11008, 4096}}, n_shapes = 2;
    if (rows) shapes[0][0] = (int)rows, shapes[0][1] = (int)cols, n_shapes = 1;

    dev d = {kvq_backend_find("vulkan"), NULL};
    if (!d.be) return kvq_tool_die(PROG, "this build has no Vulkan backend");
    kvq_backend_opts o = {.n_threads = 0, .device = device, .allow_software = 1};
    if (d.be->init(&o, &d.b) != KVQ_OK) return kvq_tool_die(PROG, "%s", kvq_last_error());
    const char *desc = d.be->describe(d.b);
    int software = strstr(desc, "software") != NULL;
    if (!mb) mb = software ? 32 : 256;
    printf("%s\ntimes: %s\n", desc, d.be->device_ms ? "device timestamps (wall clock where unknown)" : "wall clock");
    fflush(stdout);

    /* device bandwidth: copy of a buffer well beyond any cache, read + write counted */
    size_t cbytes = (size_t)(software ? 64 : 512) << 20;
    double bw = -1;
#ifdef KVQ_HAVE_VULKAN
    bw = kvq_vk_bandwidth_gbs(d.b, cbytes, 5);
#endif
    if (bw <= 0) {
        copy_arg ca = {d.be->buf_new(d.b, cbytes), d.be->buf_new(d.b, cbytes), cbytes};
        if (!ca.a || !ca.b) return kvq_tool_die(PROG, "%s", kvq_last_error());
        double copy_ms = time_calls(&d, do_copy, &ca, 4, ca.a);
        if (copy_ms <= 0) return kvq_tool_die(PROG, "%s", kvq_last_error());
        bw = 2.0 * (double)cbytes / (copy_ms * 1e-3) / 1e9;
        d.be->buf_free(d.b, ca.a), d.be->buf_free(d.b, ca.b);
    }
    printf("device bandwidth (streaming copy, read+write): %.1f GB/s\n", bw);

    for (int si = 0; si < n_shapes; si++) {
        int R = shapes[si][0], C = shapes[si][1];
        for (int k = 0; k < N_SCHEMES; k++) {
            const scheme *s = &SCHEMES[k];
            if (only && strcmp(only, s->name)) continue;
            void *blocks[3] = {0};
            kvq_weight_desc wd = make_weight(s, R, C, blocks);
            if (!blocks[0] || (s->fmt == KVQ_W_AQLM && (!blocks[1] || !blocks[2])))
                return kvq_tool_die(PROG, "out of host memory");
            mm_arg m = {NULL, 0, 1, NULL, NULL};
            m.w = calloc(4096, sizeof *m.w);
            if (!m.w) return kvq_tool_die(PROG, "out of host memory");
            size_t wbytes = 0;
            do {
                if (!(m.w[m.copies] = d.be->weight_upload(d.b, &wd))) return kvq_tool_die(PROG, "%s", kvq_last_error());
                wbytes = d.be->weight_bytes(d.b, m.w[m.copies]);
                m.copies++;
            } while ((size_t)m.copies * wbytes < ((size_t)mb << 20) && m.copies < 4096);
            size_t nx = n_prompt > 0 ? (size_t)n_prompt : 1;
            float *x = malloc(sizeof(float) * nx * C);
            if (!x) return kvq_tool_die(PROG, "out of host memory");
            for (size_t i = 0; i < nx * C; i++) x[i] = rndf();
            m.x = d.be->buf_new(d.b, sizeof(float) * nx * C);
            m.y = d.be->buf_new(d.b, sizeof(float) * nx * R);
            if (!m.x || !m.y) return kvq_tool_die(PROG, "%s", kvq_last_error());
            d.be->buf_write(d.b, m.x, 0, x, sizeof(float) * nx * C);
            m.n = 1;
            double dec = time_calls(&d, do_matmul, &m, m.copies, m.y), pr = 1e30;
            if (n_prompt > 0) {
                m.n = (int)n_prompt;
                pr = time_calls(&d, do_matmul, &m, m.copies < 8 ? m.copies : 8, m.y);
            }
            if (dec <= 0 || pr <= 0) return kvq_tool_die(PROG, "%s", kvq_last_error());
            double gbs = (double)wbytes / (dec * 1e-3) / 1e9;
            double tflops = 2.0 * R * (double)C * (double)n_prompt / (pr * 1e-3) / 1e12;
            printf("%5dx%-5d %-4s: decode %8.4f ms  %7.1f MB  %7.1f GB/s  %.2f of bandwidth", R, C, s->name, dec,
                   (double)wbytes / 1e6, gbs, gbs / bw);
            if (n_prompt > 0) printf(" | n=%ld %8.3f ms  %6.3f TFLOP/s", n_prompt, pr, tflops);
            printf("\n");
            printf("vk_aqlm rows=%d cols=%d fmt=%s decode_ms=%.5f bw_ratio=%.3f prompt_n=%ld prompt_ms=%.4f\n", R, C,
                   s->name, dec, gbs / bw, n_prompt, n_prompt > 0 ? pr : 0.0);
            fflush(stdout);
            for (int i = 0; i < m.copies; i++) d.be->weight_free(d.b, m.w[i]);
            d.be->buf_free(d.b, m.x), d.be->buf_free(d.b, m.y);
            free(m.w), free(x);
            for (int i = 0; i < 3; i++) free(blocks[i]);
        }
    }
    d.be->release(d.b);
    return 0;
}
