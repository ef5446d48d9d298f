/* Pieces shared by the kvq-bench subcommands (tools/bench_*.c). */
#ifndef KVQ_BENCH_COMMON_H
#define KVQ_BENCH_COMMON_H

#include <stddef.h>

/* This machine's memory read bandwidth in GB/s (1e9 B/s) with n_threads
 * threads: best of 5 threaded streaming reads (sums) of a 1 GiB buffer,
 * far larger than any LLC, each thread reading the slice it first touched.
 * 0 if the buffer cannot be allocated. */
double kvq_bench_mem_bw_gbs(int n_threads);

/* The bandwidth the model's backend streams weights from: the host's (above) for the
 * CPU, the device's (a copy shader timed on the device, 256 MiB) for a GPU backend. */
struct kvq_model;
double kvq_bench_model_bw_gbs(const struct kvq_model *m, int n_threads);

#endif
