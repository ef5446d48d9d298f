#version 450
// attn_fused baseline: nothing optional (see attn_fused.glsl).
#extension GL_GOOGLE_include_directive : require
#include "attn_fused.glsl"
