#version 450
#extension GL_GOOGLE_include_directive : require
// Dense matvec (f32/f16/bf16 weight, NT tokens): the LM head and unquantized
// projections at decode. 64 invocations = 8 teams of 8 lanes; a team owns RT rows
// (the workgroup 8*RT) and its lanes read 8-value runs lane, lane+8, ... of each,
// so a team reads 128 consecutive bytes (f16) per step. Partial sums stay in
// registers until the end: one shared-memory exchange (one barrier) per workgroup,
// which keeps CPU devices (lavapipe), where barriers are expensive, fast too.
#include "mm_common.glsl"

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint FMT = 1;
layout(constant_id = 1) const uint NT = 1;

const uint LANES = 8, RT = 8, ROWS = 8 * RT; // rows per workgroup

layout(std430, binding = 0) readonly buffer Wt { uint w[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer X4 { vec4 x4[]; }; // same buffer, 16-byte loads
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 5) readonly buffer B { float bias[]; };

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, cols, stride, n, flags;
    uint t0; // first token of this piece in x and y (vk_matmul.c)
} pc;

shared float red[ROWS * NT * LANES];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint team = tid / LANES, lane = tid % LANES;
    uint rbase = gl_WorkGroupID.x * ROWS + team * RT;
    uint nrun = pc.stride / 8u;
    bool x16 = (pc.cols & 3u) == 0u;
    float acc[RT * NT];
    [[unroll]] for (uint i = 0u; i < RT * NT; i++) acc[i] = 0.0;
    [[unroll]] for (uint rr = 0u; rr < RT; rr++) {
        uint r = rbase + rr;
        uint qend = r < pc.rows_p ? nrun : 0u;
        for (uint q = lane; q < qend; q += LANES) {
            float v[8];
            DENSE8(w, FMT, r * pc.stride + q * 8u, v)
            uint k = q * 8u;
            if (k + 8u <= pc.cols && x16) {
                [[unroll]] for (uint t = 0u; t < NT; t++) {
                    uint xo = ((pc.t0 + t) * pc.cols + k) >> 2;
                    acc[rr * NT + t] += dot(vec4(v[0], v[1], v[2], v[3]), x4[xo]) +
                                        dot(vec4(v[4], v[5], v[6], v[7]), x4[xo + 1u]);
                }
            } else {
                [[unroll]] for (uint t = 0u; t < NT; t++)
                    [[unroll]] for (uint i = 0u; i < 8u; i++)
                        if (k + i < pc.cols) acc[rr * NT + t] += v[i] * x[(pc.t0 + t) * pc.cols + k + i];
            }
        }
    }
    // red[(row in workgroup * NT + t) * LANES + lane]
    [[unroll]] for (uint rr = 0u; rr < RT; rr++)
        [[unroll]] for (uint t = 0u; t < NT; t++) red[((team * RT + rr) * NT + t) * LANES + lane] = acc[rr * NT + t];
    barrier();
    uint r = gl_WorkGroupID.x * ROWS + tid; // invocation tid finishes row tid of the workgroup
    if (r < pc.rows_p) {
        float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
        [[unroll]] for (uint t = 0u; t < NT; t++) {
            float s = 0.0;
            [[unroll]] for (uint l = 0u; l < LANES; l++) s += red[(tid * NT + t) * LANES + l];
            if (t < pc.n) y[(pc.t0 + t) * pc.rows_total + pc.row0 + r] = s + bv;
        }
    }
}
