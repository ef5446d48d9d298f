/* Pieces shared by the kvq-bench subcommands (tools/bench_*.c). */
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
