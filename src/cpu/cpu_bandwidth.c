/* How fast this machine's cores read memory: the yardstick -ngl auto compares a GPU that
 * shares that memory against (a laptop's integrated GPU is worth offloading to only when it
 * reads faster than the cores do). */
#include <omp.h>
#include <stdint.h>

#include "cpu/cpu_kernels.h"
#include "util.h"

double kvq_cpu_read_bw_gbs(size_t bytes, int n_threads, int reps) {
    size_t n = bytes / sizeof(uint64_t) / 4 * 4;
    uint64_t *buf = n ? kvq_alloc_aligned(n * sizeof *buf) : NULL;
    if (!buf) return -1.0;
    if (n_threads < 1) n_threads = 1;
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = i; /* first touch by the thread that reads it */
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = omp_get_wtime();
        uint64_t total = 0;
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
        {
            int id = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t lo = n / 4 * (size_t)id / (size_t)nt * 4, hi = n / 4 * (size_t)(id + 1) / (size_t)nt * 4;
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0; /* independent sums: many lines in flight */
            for (size_t i = lo; i < hi; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
            total += s0 + s1 + s2 + s3;
        }
        double t = omp_get_wtime() - t0;
        sink += total;
        if (t < best) best = t;
    }
    (void)sink;
    kvq_free_aligned(buf);
    return (double)(n * sizeof(uint64_t)) / best / 1e9;
}
