#version 450
// layer_norm with subgroup arithmetic (picked when b->caps.subgroup_arith).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define WG_SUBGROUP 1
#include "layer_norm.glsl"
