/* Fuzz target: kvq_tokenize on arbitrary bytes with the fixture tokenizers.
 * Byte 0 picks the tokenizer and add_bos, the rest is the text. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const kvq_tokenizer **toks;
    int nt = fz_tokenizers(&toks);
    if (size < 1) return 0;
    const kvq_tokenizer *t = toks[(data[0] >> 1) % nt];
    int bos = data[0] & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int n = kvq_tokenize(t, text, len, bos, NULL, 0);
    if (n < 0) {
        fz_check_error(NULL);
        return 0;
    }
    /* exact-size buffers so ASan sees any write past max_ids */
    int half = n / 2;
    int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    int32_t *part = malloc(sizeof *part * (size_t)(half ? half : 1));
    if (!ids || !part) abort();
    if (kvq_tokenize(t, text, len, bos, ids, n) != n || kvq_tokenize(t, text, len, bos, part, half) != n) abort();
    if (half && memcmp(ids, part, sizeof *ids * (size_t)half)) abort();
    int nv = kvq_vocab_size(t);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv) abort();
    int k = kvq_detokenize(t, ids, n, 0, NULL, 0);
    if (k < 0) fz_check_error(NULL);
    free(part);
    free(ids);
    return 0;
}
