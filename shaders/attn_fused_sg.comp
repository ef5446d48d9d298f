#version 450
// attn_fused with subgroup arithmetic for the softmax max/sum (picked when b->caps.subgroup_arith).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define ATTN_SUBGROUP 1
#include "attn_fused.glsl"
