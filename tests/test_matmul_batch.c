/* Small batches (2-16 tokens: a server step, a speculative verification)
 * on the CPU AQLM paths: every token's outputs must be the same bits as when
 * that token is evaluated alone, and close to the scalar reference. Greedy
 * speculative decoding relies on the first (issue 34). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "ref/ref.h"
#include "util.h"

static uint64_t rng = 0x5eed34;

typedef struct {
    kvq_weight_desc d;
    void *codes, *cb, *scales;
} wmade;

/* Random AQLM weight; `exact` keeps batches off the int8 tiles. */
static void make_aqlm(wmade *w, int rows, int cols, int M, int nbits, int ig, int exact) {
    size_t K = (size_t)1 << nbits, n_codes = (size_t)rows * (cols / ig) * M, cbytes = nbits > 8 ? 2 : 1;
    w->codes = malloc(n_codes * cbytes);
    w->cb = malloc((size_t)M * K * ig * 2);
    w->scales = malloc((size_t)rows * 2);
    assert_true(w->codes && w->cb && w->scales);
    for (size_t i = 0; i < n_codes; i++) {
        uint16_t c = (uint16_t)(tu_randf(&rng) * 70000.0f);
        if (cbytes == 1) ((uint8_t *)w->codes)[i] = (uint8_t)c;
        else memcpy((char *)w->codes + 2 * i, &c, 2);
    }
    for (size_t i = 0; i < (size_t)M * K * ig; i++) ((uint16_t *)w->cb)[i] = kvq_f32_to_f16(tu_randf(&rng));
    for (int o = 0; o < rows; o++) ((uint16_t *)w->scales)[o] = kvq_f32_to_f16(0.5f + tu_randf(&rng));
    w->d = (kvq_weight_desc){.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = M, .nbits = nbits,
                             .in_group = ig, .code_bytes = (int)cbytes, .codes = w->codes, .codebooks = w->cb,
                             .scales = w->scales, .name = "batch.weight", .exact = exact};
}

static void wmade_free(wmade *w) {
    free(w->codes);
    free(w->cb);
    free(w->scales);
}

/* Tokens [0, NMAX) of x one at a time into out, on nt threads. */
static void one_by_one(const kvq_cpu_weight *cw, const float *x, float *out, int cols, int rows, int nt) {
    for (int t = 0; t < 16; t++) kvq_cpu_matmul(cw, x + (size_t)t * cols, out + (size_t)t * rows, 1, nt);
}

/* For every ISA here: n = 1..16 tokens at once against each token alone
 * (bit for bit) and against the reference (rel L2 <= tol). Threads: with
 * `per_nt` 0, each token alone on one thread and the batches on 1..max_nt
 * (the result may not depend on the thread count); with `per_nt` 1, for
 * each nt in 1..max_nt the tokens alone and the batches on nt threads (the
 * table paths: a thread count fixes how the work is chunked, and the
 * result must not depend on which thread took which chunk). */
static void check_batches(const wmade *w, double tol, int max_nt, int per_nt, const char *what) {
    enum { NMAX = 16 };
    int rows = w->d.rows, cols = w->d.cols;
    float *x = malloc(sizeof(float) * NMAX * cols), *alone = malloc(sizeof(float) * NMAX * rows);
    float *y = malloc(sizeof(float) * NMAX * rows), *yr = malloc(sizeof(float) * NMAX * rows);
    assert_true(x && alone && y && yr);
    tu_rand_fill(x, (size_t)NMAX * cols, &rng);
    kvq_ref_matmul(&w->d, x, yr, NMAX);
    kvq_isa saved = kvq_cpu_isa();
    for (int isa = KVQ_ISA_SCALAR; isa <= KVQ_ISA_NEON; isa++) {
        if (!kvq_cpu_isa_available((kvq_isa)isa)) continue;
        kvq_cpu_set_isa((kvq_isa)isa);
        kvq_cpu_weight *cw = kvq_cpu_weight_new(&w->d);
        if (!cw) fail_msg("%s: weight_new failed: %s", what, kvq_last_error());
        for (int pass = 1; pass <= (per_nt ? max_nt : 1); pass++) {
            one_by_one(cw, x, alone, cols, rows, pass);
            double e = tu_rel_l2(alone, yr, (size_t)NMAX * rows);
            if (!(e <= tol)) fail_msg("%s isa=%s alone: rel L2 %.3g > %.1g", what, kvq_isa_name((kvq_isa)isa), e, tol);
            for (int n = 2; n <= NMAX; n++) {
                int nt = per_nt ? pass : 1 + n % max_nt; /* rows split unevenly too */
                memset(y, 0xff, sizeof(float) * (size_t)n * rows);
                kvq_cpu_matmul(cw, x, y, n, nt);
                tu_same_as_alone(y, alone, n, rows, what, kvq_isa_name((kvq_isa)isa), nt);
            }
        }
        kvq_cpu_weight_free(cw);
    }
    kvq_cpu_set_isa(saved);
    free(x);
    free(alone);
    free(y);
    free(yr);
}

/* Codeword gathers (nbits > 8): each row's codewords serve the whole step. */
static void test_gather_batches(void **state) {
    (void)state;
    wmade w;
    make_aqlm(&w, 37, 104, 1, 16, 8, 1); /* 1x16, 13 groups: an odd one at the end */
    check_batches(&w, 1e-5, 3, 0, "1x16 37x104");
    wmade_free(&w);
    make_aqlm(&w, 70, 208, 1, 16, 16, 1); /* 1x16 with 16-value groups */
    check_batches(&w, 1e-5, 3, 0, "1x16g16 70x208");
    wmade_free(&w);
    make_aqlm(&w, 33, 120, 2, 12, 8, 1); /* two codebooks of 12 bits */
    check_batches(&w, 1e-5, 3, 0, "2x12 33x120");
    wmade_free(&w);
    make_aqlm(&w, 301, 1024, 1, 16, 8, 0); /* default (non-exact) 1x16: batches below the int8 tiles */
    check_batches(&w, 1e-5, 3, 0, "1x16 301x1024");
    wmade_free(&w);
}

/* 8-bit codes through tables: a step's tokens share each chunk of codes,
 * and on 2-3 threads the chunks go to whichever thread asks first; each
 * chunk's partial has its own slot, so the same call gives the same bits
 * (before, with one partial per thread, it did not, for one token too). */
static void test_table_batches(void **state) {
    (void)state;
    wmade w;
    make_aqlm(&w, 37, 104, 2, 8, 8, 1); /* 2x8 */
    check_batches(&w, KVQ_LUT_I16_REL_L2, 3, 1, "2x8 37x104");
    wmade_free(&w);
    make_aqlm(&w, 70, 1000, 3, 8, 8, 1); /* odd M: group pairs, chunks with a remainder */
    check_batches(&w, KVQ_LUT_I16_REL_L2, 3, 1, "3x8 70x1000");
    wmade_free(&w);
    make_aqlm(&w, 301, 2048, 2, 8, 8, 0); /* default 2x8: several chunks */
    check_batches(&w, KVQ_LUT_I16_REL_L2, 3, 1, "2x8 301x2048");
    wmade_free(&w);
}

/* Dense fp16 (an AQLM model's LM head, every linear of a plain checkpoint):
 * a pass over the weight per 4 tokens, up to 16 tokens. */
static void test_dense_batches(void **state) {
    (void)state;
    int rows = 203, cols = 328;
    uint16_t *h = malloc(sizeof *h * (size_t)rows * cols);
    assert_non_null(h);
    for (size_t i = 0; i < (size_t)rows * cols; i++) h[i] = kvq_f32_to_f16(tu_randf(&rng) - 0.5f);
    wmade w = {.d = {.fmt = KVQ_W_F16, .rows = rows, .cols = cols, .data = h, .name = "batch.dense"}};
    check_batches(&w, 1e-5, 3, 0, "f16 203x328");
    free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_batches),
        cmocka_unit_test(test_table_batches),
        cmocka_unit_test(test_dense_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
