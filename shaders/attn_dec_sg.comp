#version 450
// attn_dec with subgroupMax for the block max (picked when b->caps.subgroup_arith).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define ATTN_SUBGROUP 1
#include "attn_dec.glsl"
