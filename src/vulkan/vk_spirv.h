/* The SPIR-V of the shaders/ .comp files, embedded at build time (cmake/vk_embed.cmake). */
#ifndef KVQ_VK_SPIRV_H
#define KVQ_VK_SPIRV_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name; /* file name without .comp */
    const uint32_t *code;
    size_t bytes;
} kvq_vk_spirv;

extern const kvq_vk_spirv kvq_vk_spirv_table[];
extern const int kvq_vk_spirv_count;

#endif
