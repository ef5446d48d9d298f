/* Fuzz target: model.safetensors.index.json of a sharded checkpoint. The two
 * shards are fixed small files written once; the input is the index. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "model/safetensors.h"

/* [u64 header length][header][data], header padded with spaces to 8 bytes. */
static void write_shard(const char *dir, const char *name, const char *header, size_t data_len) {
    size_t hl = (strlen(header) + 7) & ~(size_t)7;
    size_t n = 8 + hl + data_len;
    uint8_t *b = calloc(1, n);
    if (!b) abort();
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memset(b + 8, ' ', hl);
    memcpy(b + 8, header, strlen(header));
    fz_write(dir, name, b, n);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *dir;
    if (!dir) {
        dir = fz_tmpdir();
        write_shard(dir, "model-00001-of-00002.safetensors",
                    "{\"model.embed_tokens.weight\":{\"dtype\":\"F16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
                    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
                    24);
        write_shard(dir, "model-00002-of-00002.safetensors",
                    "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]}}",
                    16);
    }
    fz_write(dir, "model.safetensors.index.json", data, size);
    kvq_st st;
    kvq_status s = kvq_st_open_dir(&st, dir);
    if (s != KVQ_OK) fz_check_error(dir);
    else kvq_st_close(&st);
    return 0;
}
