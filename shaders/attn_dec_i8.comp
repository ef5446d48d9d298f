#version 450
// attn_dec with int8 q and integer dot products for q8/q4 K (picked when b->caps.int_dot).
#extension GL_GOOGLE_include_directive : require
#define ATTN_I8 1
#include "attn_dec.glsl"
