#version 450
#extension GL_GOOGLE_include_directive : require
// Embedding lookup for one row piece: out[i] = row ids[i] of the weight as f32, for
// the ids that fall in this piece (rows row0..row0+rows_p-1). One invocation per
// 8 values; AQLM rows are dequantized (row scale applied).
#include "mm_common.glsl"

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint FMT = 1;
layout(constant_id = 1) const uint M = 1;
layout(constant_id = 2) const uint IG = 8;
layout(constant_id = 3) const uint NB = 8;
layout(constant_id = 4) const uint CS = 1;

layout(std430, binding = 0) readonly buffer Wt { uint w[]; };
layout(std430, binding = 1) readonly buffer Cb { uint cb[]; };
layout(std430, binding = 2) readonly buffer Ids { int ids[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
layout(std430, binding = 4) readonly buffer S { float scales[]; };

layout(push_constant) uniform PC {
    uint rows_p, row0, cols, stride, n;
} pc;

void main() {
    uint k = gl_GlobalInvocationID.x * 8u, i = gl_GlobalInvocationID.y;
    if (i >= pc.n || k >= pc.cols) return;
    int id = ids[i] - int(pc.row0);
    if (id < 0 || uint(id) >= pc.rows_p) return;
    uint r = uint(id);
    float v[8];
    if (FMT == FMT_AQLM) {
        AQLM_DEQ8(w, cb, M, NB, IG, CS, pc.rows_p, r, k / IG, k % IG, v)
        float sc = scales[pc.row0 + r];
        [[unroll]] for (uint e = 0u; e < 8u; e++) v[e] *= sc;
    } else {
        DENSE8(w, FMT, r * pc.stride + k, v)
    }
    [[unroll]] for (uint e = 0u; e < 8u && k + e < pc.cols; e++) o[i * pc.cols + k + e] = v[e];
}
