/* Fuzz target: tokenizer.json (+ tokenizer_config.json, config.json) loading.
 * The input holds the three files separated by NUL bytes; a missing part means
 * the file is absent. A tokenizer that loads is run on a few texts and ids. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

static const char *const NAMES[3] = {"tokenizer.json", "tokenizer_config.json", "config.json"};

static void exercise(const kvq_tokenizer *t) {
    static const char *const texts[] = {"Hello world", " <s>a\n\n b</s>", "caf\xc3\xa9 \xe2\x82\xac 12345 \xff\xfe", ""};
    int32_t ids[256];
    char out[512];
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int n = kvq_tokenize(t, texts[i], strlen(texts[i]), 1, ids, 256);
        if (n < 0) fz_check_error(NULL);
        int nv = kvq_vocab_size(t);
        for (int k = 0; k < n && k < 256; k++)
            if (ids[k] < 0 || ids[k] >= nv) abort();
        if (n > 0 && kvq_detokenize(t, ids, n < 256 ? n : 256, (int)i & 1, out, sizeof out) < 0) fz_check_error(NULL);
    }
    int nv = kvq_vocab_size(t);
    for (int k = 0; k < 64; k++) ids[k] = k < nv ? k : nv - 1 - k;
    kvq_detokenize(t, ids, 64, 0, out, sizeof out);
    kvq_detok *d = kvq_detok_new(t, 1);
    for (int k = 0; d && k < 64; k++) kvq_detok_push(d, ids[k], out, sizeof out);
    if (d) kvq_detok_flush(d, out, sizeof out);
    kvq_detok_free(d);
    kvq_token_is_eog(t, kvq_token_bos(t));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fz_tmpdir();
    const uint8_t *p = data ? data : (const uint8_t *)"";
    size_t left = size;
    int more = 1;
    for (int i = 0; i < 3; i++) {
        if (!more) {
            fz_write(dir, NAMES[i], NULL, 0);
            continue;
        }
        const uint8_t *z = i < 2 && left ? memchr(p, 0, left) : NULL;
        size_t n = z ? (size_t)(z - p) : left;
        fz_write(dir, NAMES[i], p, n);
        if (z) {
            p = z + 1;
            left -= n + 1;
        } else {
            more = 0;
        }
    }
    kvq_tokenizer *t;
    if (kvq_tokenizer_load(dir, &t) != KVQ_OK) {
        fz_check_error(dir);
        return 0;
    }
    exercise(t);
    kvq_tokenizer_free(t);
    return 0;
}
