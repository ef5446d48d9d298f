/* Host-side description of one weight as the loader found it in the checkpoint.
 * Pointers point into the memory-mapped safetensors file (no alignment promised:
 * read them with the kvq_rd_* helpers or memcpy). Backends turn a description
 * into their own uploaded copy (kvq_backend.weight_upload). */
#ifndef KVQ_WEIGHTS_H
#define KVQ_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KVQ_W_F32 = 0,
    KVQ_W_F16,
    KVQ_W_BF16,
    KVQ_W_AQLM, /* additive codebooks, see below */
} kvq_wformat;

typedef struct {
    kvq_wformat fmt;
    int rows; /* output features (1 for a norm vector) */
    int cols; /* input features */

    /* dense (F32/F16/BF16): rows*cols values, row-major */
    const void *data;

    /* AQLM: W[o, g*ig + j] = scales[o] * sum_m codebooks[m, codes[o,g,m] mod 2^nbits, j] */
    int n_codebooks;        /* M, 1..8 */
    int nbits;              /* 8..16 */
    int in_group;           /* ig: 8 or 16 */
    int code_bytes;         /* 1 (int8) or 2 (int16) */
    const void *codes;      /* [rows][cols/ig][M] */
    const void *codebooks;  /* fp16 [M][2^nbits][ig] */
    const void *scales;     /* fp16 [rows] */

    /* optional bias [rows] (any dense format), NULL if none */
    const void *bias;
    kvq_wformat bias_fmt;

    const char *name; /* checkpoint name, for messages */

    /* 1: the pointers are into a read-only file mapping (the checkpoint), so a
     * backend that made its own copy of a tensor may drop the mapping's pages
     * (madvise); 0: plain memory, which must not be touched that way. */
    int in_mapping;

    /* 1: only single rows will be read (an untied embedding table), so a
     * backend should not copy it for the sake of streaming it faster. */
    int rows_only;

    /* 1: an AQLM weight with one codebook of 9..16-bit codes may keep that
     * codebook as int8 with one scale (lossy; the CPU backend's opt-in). */
    int cb8;
    /* 1: an AQLM weight with 8-bit codes may be looked up through int8 tables
     * (lossy; the CPU backend's opt-in, AVX-512 VBMI only). */
    int lut8;
    /* 1: an AQLM weight with one codebook of 9..16-bit codes (1x16) may keep
     * int8 codewords with a scale each and multiply them with int8-quantized
     * activations (lossy; the CPU backend's opt-in). */
    int i8;
    /* 1: no lossy batched paths (int8 tiles or tables for prompts) either;
     * kvq_model_params.exact. */
    int exact;
} kvq_weight_desc;

/* Code value for (row o, group g, codebook m), already reduced mod 2^nbits. */
static inline uint32_t kvq_aqlm_code(const kvq_weight_desc *w, size_t o, size_t g, int m) {
    size_t i = (o * (size_t)(w->cols / w->in_group) + g) * (size_t)w->n_codebooks + (size_t)m;
    uint32_t v;
    if (w->code_bytes == 1) {
        v = ((const uint8_t *)w->codes)[i];
    } else {
        uint16_t h;
        __builtin_memcpy(&h, (const char *)w->codes + 2 * i, 2);
        v = h;
    }
    return v & ((1u << w->nbits) - 1u);
}

#endif
