#version 450
// mm_lut.glsl with the lookup table in shared memory as fp16, scaled per chunk and token
// (picked when b->caps.fp16 and the model is not loaded --exact; the bound is in mm_lut.glsl).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define LUT_F16 1
#include "mm_lut.glsl"
