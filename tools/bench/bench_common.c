/* Memory bandwidth yardstick for the kvq-bench subcommands. */
#include "bench_common.h"

#include <stdint.h>

#include "common.h"
#include "cpu/cpu_kernels.h"
#include "model/model.h"
#include "util.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_bench.h"
#endif

double kvq_bench_mem_bw_gbs(int n_threads) {
    /* the library's probe (-ngl auto uses it too) over 1 GiB, best of 5 */
    double bw = kvq_cpu_read_bw_gbs((size_t)1 << 30, n_threads, 5);
    return bw > 0 ? bw : 0.0;
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
