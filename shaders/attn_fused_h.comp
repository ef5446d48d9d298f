#version 450
// attn_fused with 16-bit storage reads of f16 K/V (picked for f16 caches when b->caps.storage16).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_16bit_storage : require
#define ATTN_F16_STORAGE 1
#include "attn_fused.glsl"
