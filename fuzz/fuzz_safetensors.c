/* Fuzz target: one safetensors image (header length, JSON header, tensor table).
 * Every tensor the parser accepts must lie inside the image. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvq_st st;
    memset(&st, 0, sizeof st);
    kvq_status s = kvq_st_parse(&st, data, size, "fuzz.safetensors", 0);
    if (s != KVQ_OK) fz_check_error("fuzz.safetensors");
    volatile uint8_t sink = 0;
    char shape[256];
    for (int i = 0; i < st.n_tensors; i++) {
        const kvq_st_tensor *t = &st.tensors[i];
        if (kvq_st_find(&st, t->name) != t) abort();
        if (t->nbytes) {
            if (t->data < data || t->data + t->nbytes > data + size) abort();
            sink ^= t->data[0] ^ t->data[t->nbytes - 1];
        }
        kvq_shape_str(t, shape, sizeof shape);
    }
    (void)sink;
    kvq_st_close(&st);
    return 0;
}
