/* Fuzz target: decoding arbitrary ids (negative, past the vocabulary, specials)
 * one-shot and streaming. Byte 0 picks the tokenizer, skip_special and the output
 * buffer size; the rest is int32 ids (little-endian). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const kvq_tokenizer **toks;
    int nt = fz_tokenizers(&toks);
    if (size < 1) return 0;
    const kvq_tokenizer *t = toks[(data[0] >> 1) % nt];
    int skip = data[0] & 1;
    int n = (int)((size - 1) / 4);
    int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    if (!ids) abort();
    for (int i = 0; i < n; i++) {
        uint32_t u = 0;
        for (int b = 3; b >= 0; b--) u = (u << 8) | data[1 + 4 * i + b];
        ids[i] = (int32_t)u;
    }
    int len = kvq_detokenize(t, ids, n, skip, NULL, 0);
    if (len < 0) {
        fz_check_error(NULL);
    } else {
        char *full = malloc((size_t)len + 1), *cut = malloc(8);
        if (!full || !cut) abort();
        if (kvq_detokenize(t, ids, n, skip, full, (size_t)len + 1) != len || strlen(full) > (size_t)len) abort();
        if (kvq_detokenize(t, ids, n, skip, cut, 8) != len || strncmp(full, cut, strlen(cut))) abort();
        free(full);
        free(cut);
    }
    /* streaming: pieces land in a small exact-size buffer */
    kvq_detok *d = kvq_detok_new(t, skip);
    char piece[16];
    for (int i = 0; d && i < n; i++)
        if (kvq_detok_push(d, ids[i], piece, sizeof piece) < 0) fz_check_error(NULL);
    if (d && kvq_detok_flush(d, piece, sizeof piece) < 0) fz_check_error(NULL);
    kvq_detok_free(d);
    free(ids);
    return 0;
}
