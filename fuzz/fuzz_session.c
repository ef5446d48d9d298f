/* Fuzz target: KV session files (kvq_context_restore) into contexts of the demo model.
 * Byte 0: bit 0 rewrites the file's trailing checksum to match the mutated bytes first, so
 * the checks after it (model, shape, types, size, tokens) and the cache writes are reached;
 * bit 1 picks the f16 context instead of the q4 one. The rest is the file. A restore either
 * fails with one line, leaving n_past as it was, or gives a context that evaluates on. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "kv_format.h"
#include "util.h"

static kvq_model *g_model;
static kvq_context *g_ctx[2]; /* q4, f16 */

static void setup(void) {
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 1;
    if (kvq_model_load(KVQ_SOURCE_DIR "/models/demo", &mp, &g_model) != KVQ_OK) abort();
    for (int i = 0; i < 2; i++) {
        kvq_context_params cp = kvq_context_default_params();
        cp.n_ctx = 64;
        cp.type_k = cp.type_v = i ? KVQ_CACHE_F16 : KVQ_CACHE_Q4;
        if (kvq_context_new(g_model, &cp, &g_ctx[i]) != KVQ_OK) abort();
    }
}

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* The checksum session.c writes (sections: header, tokens, per layer K and V) put at the end,
 * when the header's sizes add up to the file's; otherwise the bytes stay as they are. */
static void fix_checksum(uint8_t *f, size_t n) {
    if (n < 72) return;
    uint32_t layers = rd32(f + 16), heads = rd32(f + 20), hd = rd32(f + 24), n_past = rd32(f + 40);
    if (f[32] > KVQ_CACHE_Q4 || f[33] > KVQ_CACHE_Q4 || layers > 64 || heads > 64 || hd > 4096 || n_past > 4096) return;
    size_t k = (size_t)heads * n_past * kvq_kv_row_bytes((kvq_cache_type)f[32], (int)hd);
    size_t v = (size_t)heads * n_past * kvq_kv_row_bytes((kvq_cache_type)f[33], (int)hd);
    if (64 + (size_t)n_past * 4 + layers * (k + v) + 8 != n) return;
    uint64_t sum = kvq_fnv1a(KVQ_FNV_SEED, f, 64);
    size_t off = 64;
    sum = kvq_fnv1a(sum, f + off, (size_t)n_past * 4);
    off += (size_t)n_past * 4;
    for (uint32_t l = 0; l < layers; l++) {
        sum = kvq_fnv1a(sum, f + off, k);
        off += k;
        sum = kvq_fnv1a(sum, f + off, v);
        off += v;
    }
    for (int i = 0; i < 8; i++) f[off + i] = (uint8_t)(sum >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_model) setup();
    if (size < 1) return 0;
    uint8_t *file = malloc(size);
    if (!file) abort();
    memcpy(file, data + 1, size - 1);
    if (data[0] & 1) fix_checksum(file, size - 1);
    const char *dir = fz_tmpdir();
    fz_write(dir, "s.kvqs", file, size - 1);
    free(file);
    char path[4096];
    kvq_path_join(path, sizeof path, dir, "s.kvqs");
    kvq_context *c = g_ctx[(data[0] >> 1) & 1];
    kvq_kv_truncate(c, 0);
    int32_t one = 1, toks[64];
    if (kvq_eval(c, &one, 1) != KVQ_OK) abort(); /* a position to keep when the file is refused */
    int got = -1;
    if (kvq_context_restore(c, path, toks, 64, &got) != KVQ_OK) {
        fz_check_error("s.kvqs");
        if (kvq_n_past(c) != 1 || got != 0) abort();
        return 0;
    }
    if (got != kvq_n_past(c) || got > 64) abort();
    for (int i = 0; i < got; i++)
        if (toks[i] < 0 || toks[i] >= kvq_model_n_vocab(g_model)) abort();
    /* whatever the rows hold (NaN included), the context evaluates on */
    if (got < 64 && kvq_eval(c, &one, 1) != KVQ_OK) abort();
    return 0;
}
