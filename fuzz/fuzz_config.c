/* Fuzz target: config.json, including the AQLM quantization_config, and the
 * sizes derived from it (RoPE tables, context memory estimate). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "model/hparams.h"
#include "resources.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    kvq_hparams hp;
    kvq_status s = kvq_hparams_parse(text, "fuzz/config.json", &hp);
    free(text);
    if (s != KVQ_OK) {
        fz_check_error("fuzz/config.json");
    } else {
        float *f = malloc(sizeof(float) * (size_t)(hp.head_dim / 2));
        if (!f) abort();
        kvq_hparams_rope_freqs(&hp, f, 0);
        free(f);
        kvq_mem_need need;
        int ctx = size ? data[0] * 1000 + 1 : 1;
        if (kvq_mem_estimate(&hp, ctx, 512, 1, KVQ_CACHE_F32, KVQ_CACHE_Q4, &need) == KVQ_OK && need.total < need.kv)
            abort();
    }
    kvq_hparams_free(&hp);
    return 0;
}
