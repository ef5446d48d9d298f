#version 450
// mm_lut.glsl with the lookup table in f32 (devices without fp16 arithmetic, --exact,
// KVQ_VK_DISABLE=fp16).
#extension GL_GOOGLE_include_directive : require
#include "mm_lut.glsl"
