#version 450
// layer_norm baseline: nothing optional (tree sums in shared memory).
#extension GL_GOOGLE_include_directive : require
#include "layer_norm.glsl"
