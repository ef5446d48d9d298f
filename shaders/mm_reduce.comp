#version 450
// Sums the partial matvec results of a chunk-split AQLM dispatch (mm_lut/mm_gather)
// and applies the row scale and bias: y[t][row0+r] = scale[r] * sum_s part[s][t][r] + bias.
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer P { float part[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer S { float scales[]; };
layout(std430, binding = 5) readonly buffer B { float bias[]; };

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, n, nsplit, flags;
} pc;

void main() {
    uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
    if (r >= pc.rows_p || t >= pc.n) return;
    float s = 0.0;
    for (uint k = 0u; k < pc.nsplit; k++) s += part[(k * pc.n + t) * pc.rows_p + r];
    float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
    y[t * pc.rows_total + pc.row0 + r] = s * scales[pc.row0 + r] + bv;
}
