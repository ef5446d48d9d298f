#version 450
// attn_dec without optional features: f32 q.k, shared-memory block max (see attn_dec.glsl).
#extension GL_GOOGLE_include_directive : require
#include "attn_dec.glsl"
