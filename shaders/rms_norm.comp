#version 450
// rms_norm baseline: nothing optional (tree sum in shared memory).
#extension GL_GOOGLE_include_directive : require
#include "rms_norm.glsl"
