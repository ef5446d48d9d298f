/* Memory bandwidth yardstick for the kvq-bench subcommands. */
#include "bench_common.h"

#include <omp.h>
#include <stdint.h>

#include "common.h"
#include "model.h"
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
