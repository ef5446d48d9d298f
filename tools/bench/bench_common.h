/* Pieces shared by the kvq-bench subcommands (tools/bench/bench_*.c). */
#ifndef KVQ_BENCH_COMMON_H
#define KVQ_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* This machine's memory read bandwidth in GB/s (1e9 B/s) with n_threads
 * threads: best of 5 threaded streaming reads (sums) of a 1 GiB buffer,
 * far larger than any LLC, each thread reading the slice it first touched.
 * 0 if the buffer cannot be allocated. */
double kvq_bench_mem_bw_gbs(int n_threads);

/* The bandwidth the model's backend streams weights from: the host's (above) for the
 * CPU, the device's (a copy shader timed on the device, 256 MiB) for a GPU backend. */
struct kvq_model;
double kvq_bench_model_bw_gbs(const struct kvq_model *m, int n_threads);

/* Bandwidth sampled several times in one run (before the timed work, after each
 * repetition, after the rest): on a shared machine it drifts by tens of percent within
 * a minute, so a bound from one sample made tg_bw_ratio wander (0.45-0.79 run to run at
 * the same tok/s). Bounds use the best sample; the spread shows how much it moved. */
typedef struct {
    double best, worst; /* GB/s */
    int n;
} kvq_bench_bw;
/* Adds one kvq_bench_model_bw_gbs sample (a failed one, 0, is not counted). */
void kvq_bench_bw_sample(kvq_bench_bw *bw, const struct kvq_model *m, int n_threads);
/* (best - worst) / best; 0 before two samples. */
double kvq_bench_bw_spread(const kvq_bench_bw *bw);

/* bench_synth.c: the directory of a synthetic real-shape AQLM checkpoint
 * (name: llama2-7b | llama3-8b | mistral-7b, scheme: 2x8 | 1x16) under root
 * (NULL: $TMPDIR/kvq-synth), written first if it is not there yet; *file_bytes
 * gets the tensor bytes it holds. 0, or 1 after an error line on stderr. */
int kvq_bench_synth_dir(const char *name, const char *scheme, const char *root, char *dir, size_t dir_size,
                        double *file_bytes);
/* The same checkpoint with its data left as holes in sparse files (instant, no disk): for
 * `--plan`, which reads only the headers. */
int kvq_bench_synth_plan_dir(const char *name, const char *scheme, const char *root, char *dir, size_t dir_size,
                             double *file_bytes);

/* xorshift64 random numbers for bench data: 32 bits, and a float in [-1, 1). */
uint32_t kvq_bench_rnd(uint64_t *state);
float kvq_bench_rndf(uint64_t *state);

/* Attention shapes kvq-bench attn measures (CPU and device): one layer's heads. */
typedef struct {
    const char *name;
    int n_head, n_head_kv, head_dim, n_layer;
} kvq_bench_attn_shape;
extern const kvq_bench_attn_shape KVQ_BENCH_ATTN_SHAPES[2];

#endif
