#version 450
// attn_dec with int8 q . K integer dot products and subgroupMax (b->caps.int_dot and subgroup_arith).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define ATTN_SUBGROUP 1
#define ATTN_I8 1
#include "attn_dec.glsl"
