#version 450
// attn_fused with 16-bit storage reads of f16 K/V and subgroup softmax reductions (picked for f16 caches when b->caps.storage16 and subgroup_arith).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define ATTN_SUBGROUP 1
#define ATTN_F16_STORAGE 1
#include "attn_fused.glsl"
