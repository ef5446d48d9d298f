/* Helpers shared by the cmocka tests. */
#ifndef KVQ_TESTUTIL_H
#define KVQ_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Path under ../shared/fixtures (static buffer), or NULL when shared/ is absent. */
const char *tu_fixture(const char *rel);
/* Skips the current test (cmocka skip) with a message when the fixture is missing. */
#define TU_NEED_FIXTURE(path)                                                   \
    do {                                                                        \
        if (!(path)) {                                                          \
            print_message("shared fixtures not found, skipping\n");             \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* Whole file into malloc'd memory (NUL-terminated); aborts the test on failure. */
char *tu_read_file(const char *path, size_t *len);
/* Deterministic random floats in [-1,1) (xorshift). */
void tu_rand_fill(float *x, size_t n, uint64_t *state);
float tu_randf(uint64_t *state);
/* ||a-b|| / ||b||. */
double tu_rel_l2(const float *a, const float *b, size_t n);
double tu_max_abs_diff(const float *a, const float *b, size_t n);
/* Runs a shell command, capturing stdout (malloc'd) and exit status. */
char *tu_run(const char *cmd, int *status);
/* Starts backend i of the registry for a test (2 threads, software devices allowed);
 * NULL, with a printed reason, when it cannot start on this machine. */
struct kvq_backend;
struct kvq_bctx;
struct kvq_bctx *tu_backend_start(int i, const struct kvq_backend **be);
/* BOS + the first ctx-1 tokens of brown-valid.txt (no BOS inside), malloc'd; *targets
 * (malloc'd) gets the ctx next-token targets. Needs the fixture (callers check first). */
struct kvq_tokenizer;
int32_t *tu_valid_tokens(const struct kvq_tokenizer *tok, int ctx, int32_t **targets);
/* -log softmax(row)[target] over n logits, in double. */
double tu_nll(const float *row, int n, int target);
/* Temp directory unique to this process (created once). */
const char *tu_tmpdir(void);

/* 1 when backend `name` starts here (software devices allowed), else 0 after a
 * "[  SKIPPED ]" line saying why. */
int tu_backend_starts(const char *name);
/* The backend named by $KVQ_TEST_BACKEND (NULL: the automatic choice) in *name. Returns 0,
 * after a "[  SKIPPED ]" line, when that backend does not start on this machine. */
int tu_env_backend(const char **name);

/* $KVQ_TEST_NGL: layers offloaded to the GPU backend (kvq_model_params.n_gpu_layers), -1 unset. */
int tu_env_gpu_layers(void);

/* Indices of the 3 largest of x[0..n), largest first. */
void tu_top3(const float *x, int n, int *out);

/* The stated error bound of one int8-tile output (row wo against token xt, cols long): each
 * block of kb columns quantized to int8 with scale max|.|/127 on both sides. */
double tu_i8_block_bound(const float *wo, const float *xt, int cols, int kb);

struct kvq_context;
/* Index of the largest of x[0..n) (the first on ties). */
int32_t tu_argmax(const float *x, int n);
/* n greedy tokens from c's current logits, each evaluated in turn (asserts every eval). */
void tu_greedy(struct kvq_context *c, int n_vocab, int32_t *out, int n);

/* Fails unless each of the n tokens' rows of outputs in a batch (y, token t at y + t*rows)
 * are the same bits as that token's alone; `what` names the weight, isa and nt the run. */
void tu_same_as_alone(const float *y, const float *alone, int n, int rows, const char *what, const char *isa, int nt);

#endif
