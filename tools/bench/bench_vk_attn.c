/* `kvq-bench attn --backend NAME` for a device backend (Vulkan): decode
 * attention for one token from f16, q8 and q4 (rotated) caches, timed by the
 * device's own timers (device_ms), against the device's memory bandwidth
 * measured in the same run with a streaming copy shader (shaders/bw_copy.comp).
 *
 * As on the CPU (bench_attn.c): each configuration allocates enough layers
 * that their caches total at least --ws-mb, so rows come from device memory
 * rather than a cache; one submit holds one query's attention over every
 * layer; per-layer time = device time / layers (best of --reps submits);
 * ms/token = that x 32 layers. Caches are filled through kv_store. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bench_common.h"
#include "common.h"
#include "util.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_internal.h"
#endif

int kvq_bench_attn_device(const char *backend, const int *ctxs, int n_ctx, const char *only, int reps, size_t ws_bytes);

static const char *PROG = "kvq-bench attn";

typedef kvq_bench_attn_shape shape;
#define SHAPES KVQ_BENCH_ATTN_SHAPES
static const kvq_cache_type TYPES[] = {KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};

/* Read+write GB/s of a streaming copy of `bytes` (best of 5), 0 if unavailable. */
static double device_bw_gbs(const kvq_backend *be, kvq_bctx *b, size_t bytes) {
#ifdef KVQ_HAVE_VULKAN
    if (strcmp(be->name, "vulkan") != 0) return 0;
    kvq_buf *s = be->buf_new(b, bytes), *d = be->buf_new(b, bytes);
    double best = 0;
    if (s && d) {
        const struct {
            uint32_t count;
        } pc = {(uint32_t)(bytes / 16)};
        vk_bind bind[2] = {vk_whole(s), vk_whole(d)};
        const vk_pipe *p = vk_pipe_get(b, "bw_copy", NULL, 0);
        for (int rep = -1; rep < 5; rep++) {
            vk_dispatch(b, p, bind, 2, &pc, sizeof pc, 1024, 1, 1);
            if (be->flush(b) != KVQ_OK) break;
            const double ms = be->device_ms(b);
            if (rep >= 0 && ms > 0 && 2.0 * bytes / (ms * 1e6) > best) best = 2.0 * bytes / (ms * 1e6);
        }
    }
    be->buf_free(b, s);
    be->buf_free(b, d);
    return best;
#else
    (void)be, (void)b, (void)bytes;
    return 0;
#endif
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float rndf(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static kvq_buf *random_buf(const kvq_backend *be, kvq_bctx *b, size_t count) {
    float *x = malloc(count * sizeof *x);
    kvq_buf *buf = x ? be->buf_new(b, count * sizeof *x) : NULL;
    if (buf) {
        for (size_t i = 0; i < count; i++) x[i] = rndf();
        be->buf_write(b, buf, 0, x, count * sizeof *x);
    }
    free(x);
    return buf;
}

/* ms per layer of one decode step at position ctx-1; < 0 on failure (message printed). */
static double bench_one(const kvq_backend *be, kvq_bctx *b, const shape *s, int ctx, kvq_cache_type t, int reps,
                        size_t ws_bytes, double *layer_bytes) {
    const int hd = s->head_dim, rot = t == KVQ_CACHE_Q4;
    kvq_kv_desc d = {.n_layer = 1, .n_ctx = ctx, .n_head_kv = s->n_head_kv, .head_dim = hd, .type_k = t,
                     .type_v = t, .rotate_k = rot, .rotate_v = rot, .n_head = s->n_head};
    const size_t layer = be->kv_bytes(b, &d, ctx);
    d.n_layer = (int)((ws_bytes + layer - 1) / layer);
    if (d.n_layer < 1) d.n_layer = 1;
    *layer_bytes = (double)layer;
    const int chunk = ctx < 512 ? ctx : 512;
    kvq_kvbuf *kv = be->kv_new(b, &d);
    kvq_buf *k = random_buf(be, b, (size_t)chunk * s->n_head_kv * hd), *v = random_buf(be, b, (size_t)chunk * s->n_head_kv * hd);
    kvq_buf *q = random_buf(be, b, (size_t)s->n_head * hd), *out = be->buf_new(b, (size_t)s->n_head * hd * sizeof(float));
    double best = -1;
    if (!kv || !k || !v || !q || !out) {
        fprintf(stderr, "%s: %s\n", PROG, kvq_last_error());
        goto done;
    }
    for (int l = 0; l < d.n_layer; l++) {
        for (int p = 0; p < ctx; p += chunk) be->kv_store(b, kv, l, k, v, p, ctx - p < chunk ? ctx - p : chunk);
        if (be->flush(b) != KVQ_OK) {
            fprintf(stderr, "%s: %s\n", PROG, kvq_last_error());
            goto done;
        }
    }
    const kvq_attn_desc a = {.n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = hd,
                             .scale = 1.0f / sqrtf((float)hd)};
    for (int rep = -1; rep < reps; rep++) { /* rep -1 warms up (pipelines, scratch) */
        for (int l = 0; l < d.n_layer; l++) be->attention(b, kv, l, &a, q, out, ctx - 1, 1);
        if (be->flush(b) != KVQ_OK) {
            fprintf(stderr, "%s: %s\n", PROG, kvq_last_error());
            best = -1;
            goto done;
        }
        const double ms = be->device_ms(b) / d.n_layer;
        if (rep >= 0 && ms > 0 && (best < 0 || ms < best)) best = ms;
    }
    float o[8];
    if (be->buf_read(b, out, 0, o, sizeof o) != KVQ_OK || !isfinite(o[0])) {
        fprintf(stderr, "%s: attention failed or not finite\n", PROG);
        best = -1;
    }
done:
    be->buf_free(b, k);
    be->buf_free(b, v);
    be->buf_free(b, q);
    be->buf_free(b, out);
    be->kv_free(b, kv);
    return best;
}

int kvq_bench_attn_device(const char *backend, const int *ctxs, int n_ctx, const char *only, int reps, size_t ws_bytes) {
    const kvq_backend *be = kvq_backend_find(backend);
    if (!be) return kvq_tool_die(PROG, "backend '%s' is not built in (%s)", backend, kvq_backend_names());
    if (!be->device_ms || !be->flush) return kvq_tool_die(PROG, "backend '%s' has no device timers", backend);
    const char *dev = getenv("KVQ_VK_DEVICE");
    kvq_backend_opts o = {.n_threads = 2, .device = dev, .allow_software = 1};
    kvq_bctx *b = NULL;
    if (be->init(&o, &b) != KVQ_OK) return kvq_tool_die(PROG, "%s", kvq_last_error());
    const double bw = device_bw_gbs(be, b, ws_bytes / 4 < (256u << 20) ? ws_bytes / 4 : (256u << 20));
    printf("attn: decode attention for 1 token on %s\n", be->describe(b));
    printf("device memory bandwidth (copy shader, read+write, best of 5): %.1f GB/s\n", bw);
    printf("timed: device time of one query's attention over every layer of >= %zu MB of cache; ms/token = 32 layers\n\n",
           ws_bytes >> 20);
    printf("%-10s %6s %4s %10s %10s %10s %8s %7s %8s\n", "shape", "ctx", "kv", "ms/layer", "ms/token", "MB/token",
           "GB/s", "bw%", "vs f16");
    int rc = 0;
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0] && !rc; si++) {
        const shape *s = &SHAPES[si];
        if (only && strcmp(only, s->name)) continue;
        for (int ci = 0; ci < n_ctx && !rc; ci++) {
            double f16_ms = 0;
            for (int ti = 0; ti < 3; ti++) {
                double lb = 0, ms = bench_one(be, b, s, ctxs[ci], TYPES[ti], reps, ws_bytes, &lb);
                if (ms <= 0) {
                    rc = 1;
                    break;
                }
                if (ti == 0) f16_ms = ms;
                const double gbs = lb / (ms * 1e-3) / 1e9;
                char vs[16] = "";
                if (ti > 0) snprintf(vs, sizeof vs, "%.2fx", f16_ms / ms);
                printf("%-10s %6d %4s %10.4f %10.3f %10.1f %8.1f %6.0f%% %8s\n", s->name, ctxs[ci],
                       kvq_cache_type_name(TYPES[ti]), ms, ms * s->n_layer, lb * s->n_layer / 1e6, gbs,
                       bw > 0 ? 100.0 * gbs / bw : 0.0, vs);
                fflush(stdout);
            }
        }
    }
    be->release(b);
    return rc;
}
