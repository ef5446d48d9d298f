#version 450
#extension GL_GOOGLE_include_directive : require
// Dense matvec (f32/f16/bf16 weight, NT tokens): the LM head and unquantized
// projections at decode. 64 invocations per row, 4 rows per workgroup; lane l reads
// 8-value runs l, l+64, ... so a row team reads 1 KiB (f16) of consecutive memory
// per step. Partial sums meet in shared memory.
#include "mm_common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint FMT = 1;
layout(constant_id = 1) const uint NT = 1;

layout(std430, binding = 0) readonly buffer Wt { uint w[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer X4 { vec4 x4[]; }; // same buffer, 16-byte loads
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 5) readonly buffer B { float bias[]; };

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, cols, stride, n, flags;
} pc;

shared float red[NT * 256];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint team = tid / 64u, lane = tid % 64u;
    uint r = gl_WorkGroupID.x * 4u + team;
    float acc[NT];
    for (uint t = 0u; t < NT; t++) acc[t] = 0.0;
    if (r < pc.rows_p) {
        uint nrun = pc.stride / 8u;
        for (uint q = lane; q < nrun; q += 64u) {
            float v[8];
            DENSE8(w, FMT, r * pc.stride + q * 8u, v)
            uint k = q * 8u;
            if (k + 8u <= pc.cols && (pc.cols & 3u) == 0u) {
                for (uint t = 0u; t < NT; t++) {
                    uint xo = (t * pc.cols + k) >> 2;
                    acc[t] += dot(vec4(v[0], v[1], v[2], v[3]), x4[xo]) + dot(vec4(v[4], v[5], v[6], v[7]), x4[xo + 1u]);
                }
            } else if (k + 8u <= pc.cols) {
                for (uint t = 0u; t < NT; t++) {
                    uint xo = t * pc.cols + k;
                    float s = 0.0;
                    for (uint i = 0u; i < 8u; i++) s += v[i] * x[xo + i];
                    acc[t] += s;
                }
            } else {
                for (uint t = 0u; t < NT; t++)
                    for (uint i = 0u; i < 8u; i++)
                        if (k + i < pc.cols) acc[t] += v[i] * x[t * pc.cols + k + i];
            }
        }
    }
    for (uint t = 0u; t < NT; t++) red[t * 256u + tid] = acc[t];
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (lane < h)
            for (uint t = 0u; t < NT; t++) red[t * 256u + tid] += red[t * 256u + tid + h];
        barrier();
    }
    if (lane == 0u && r < pc.rows_p) {
        float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
        for (uint t = 0u; t < NT; t++)
            if (t < pc.n) y[t * pc.rows_total + pc.row0 + r] = red[t * 256u + tid] + bv;
    }
}
