/* A tiny synthetic Llama checkpoint (config.json, tokenizer, safetensors, single
 * or sharded, AQLM or dense) written from a description the malformed-model tests
 * change before writing: each case breaks one thing in an otherwise loadable model. */
#ifndef KVQ_TESTS_MALFORMED_MODEL_H
#define KVQ_TESTS_MALFORMED_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char name[176];
    char dtype[8];
    int nd;
    int64_t shape[4];
    uint8_t *data;
    size_t nbytes;
    int64_t offs[2]; /* header data_offsets when has_offs (else laid out in order) */
    int has_offs;
} mm_tensor;

typedef struct {
    /* config.json */
    long long hidden, ff, layers, heads, kv_heads, vocab, ctx;
    int aqlm, n_codebooks, nbits, in_group;
    const char *extra_config; /* raw JSON members appended to config.json, or NULL */
    /* tokenizer.json */
    const char *extra_merge;  /* one more merge rule, e.g. "a zz" */
    const char *extra_vocab;  /* raw JSON members appended to model.vocab, or NULL */
    int sharded;              /* two shards + model.safetensors.index.json */
    mm_tensor t[96];
    int n;
} mm_model;

/* Defaults: AQLM 2x8 (in_group 8), hidden 64, 1 layer, 2 heads / 1 KV head, vocab 272. */
void mm_init(mm_model *m, int aqlm);
/* Fills the tensor list from the config fields (call after changing them). */
void mm_build(mm_model *m);
mm_tensor *mm_find(mm_model *m, const char *name);
void mm_remove(mm_model *m, const char *name);
/* Replaces a tensor's data with n bytes of value fill. */
void mm_set_data(mm_tensor *t, size_t n, uint8_t fill);
/* Writes the model into a new directory tmp/<name>; returns its path (static buffer). */
const char *mm_write(mm_model *m, const char *name);
void mm_free(mm_model *m);

/* File surgery on a written model. */
void mm_truncate(const char *dir, const char *file, long size);
void mm_set_header_len(const char *dir, const char *file, uint64_t hlen);
long mm_file_size(const char *dir, const char *file);

#endif
