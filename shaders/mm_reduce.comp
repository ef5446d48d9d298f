#version 450
// Sums the partial matvec results of a chunk-split AQLM dispatch (mm_lut/mm_gather)
// and applies the row scale and bias: y[t][row0+r] = scale[r] * sum_s part[s][t][r] + bias.
// RR rows per invocation, their partials loaded in batches (mm_sum.glsl: the loads of a
// batch are in flight together instead of one round trip per split).
#extension GL_GOOGLE_include_directive : require
#include "mm_common.glsl"
#include "mm_sum.glsl"
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer P { float part[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer S { float scales[]; };
layout(std430, binding = 5) readonly buffer B { float bias[]; };

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, n, nsplit, flags, t0; // t0: the piece's first token in y
} pc;

const uint RR = 2u;

void main() {
    uint r0 = gl_WorkGroupID.x * 256u * RR + gl_LocalInvocationID.x, t = gl_GlobalInvocationID.y;
    if (t >= pc.n) return;
    float s[RR];
    MM_SUM_SPLITS(part, RR, r0, 256u, t, pc.nsplit, pc.rows_p, pc.n, s)
    [[unroll]] for (uint j = 0u; j < RR; j++) {
        uint r = r0 + j * 256u;
        if (r >= pc.rows_p) continue;
        float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
        y[(pc.t0 + t) * pc.rows_total + pc.row0 + r] = s[j] * scales[pc.row0 + r] + bv;
    }
}
