/* Names of the KV cache element types (kv_format.h describes their layout). */
#include <string.h>

#include "kv_format.h"

static const char *const NAMES[] = {"f32", "f16", "q8", "q4"};

int kvq_cache_type_parse(const char *s) {
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, NAMES[i]) == 0) return i;
    return -1;
}

const char *kvq_cache_type_name(kvq_cache_type t) {
    return (unsigned)t < 4 ? NAMES[t] : "?";
}

