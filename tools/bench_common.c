/* Memory bandwidth yardstick for the kvq-bench subcommands. */
#include "bench_common.h"

#include <omp.h>
#include <stdint.h>

#include "common.h"
#include "model/model.h"
#include "util.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_bench.h"
#endif

double kvq_bench_mem_bw_gbs(int n_threads) {
    const size_t bytes = (size_t)1 << 30, n = bytes / sizeof(uint64_t);
    uint64_t *buf = kvq_alloc_aligned(bytes);
    if (!buf) return 0.0;
    if (n_threads < 1) n_threads = 1;
    /* First touch on the thread (and so the NUMA node) that will read it. */
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = kvq_tool_now();
        uint64_t total = 0;
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
        {
            /* Same static slices as the first touch; four independent sums keep
             * many cache lines in flight and vectorize. */
            const int id = omp_get_thread_num(), nt = omp_get_num_threads();
            const size_t lo = n / 4 * (size_t)id / (size_t)nt * 4, hi = n / 4 * (size_t)(id + 1) / (size_t)nt * 4;
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = lo; i < hi; i += 4) {
                s0 += buf[i];
                s1 += buf[i + 1];
                s2 += buf[i + 2];
                s3 += buf[i + 3];
            }
            total += s0 + s1 + s2 + s3;
        }
        const double t = kvq_tool_now() - t0;
        sink += total;
        if (t < best) best = t;
    }
    (void)sink;
    kvq_free_aligned(buf);
    return (double)bytes / best / 1e9;
}

double kvq_bench_model_bw_gbs(const kvq_model *m, int n_threads) {
#ifdef KVQ_HAVE_VULKAN
    if (m->be == &kvq_backend_vulkan) return kvq_vk_bandwidth_gbs(m->bctx, (size_t)256 << 20, 5);
#endif
    return kvq_bench_mem_bw_gbs(n_threads);
}

void kvq_bench_bw_sample(kvq_bench_bw *bw, const kvq_model *m, int n_threads) {
    double g = kvq_bench_model_bw_gbs(m, n_threads);
    if (g <= 0) return;
    if (bw->n == 0 || g > bw->best) bw->best = g;
    if (bw->n == 0 || g < bw->worst) bw->worst = g;
    bw->n++;
}

double kvq_bench_bw_spread(const kvq_bench_bw *bw) { return bw->n > 1 && bw->best > 0 ? (bw->best - bw->worst) / bw->best : 0.0; }

const kvq_bench_attn_shape KVQ_BENCH_ATTN_SHAPES[2] = {
    {"llama3-8b", 32, 8, 128, 32},
    {"llama2-7b", 32, 32, 128, 32},
};

uint32_t kvq_bench_rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 32);
}

float kvq_bench_rndf(uint64_t *s) { return (float)(kvq_bench_rnd(s) >> 8) * (2.0f / 16777216.0f) - 1.0f; }
