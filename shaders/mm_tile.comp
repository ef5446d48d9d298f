#version 450
#extension GL_GOOGLE_include_directive : require
// Batched matmul for prompts: y[t][row0+r] = sum_k W[r][k] x[t][k] (+ bias) for one
// row piece of a weight. Tiles of 64 rows x 64 tokens, stepping k by 32: the weight
// tile is converted (dense) or dequantized (AQLM, scale applied) into shared memory
// once and used by all 64 tokens. 256 invocations, each owning 4 rows x 4 tokens;
// rows follow the invocation index so the y stores are coalesced.
#include "mm_common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint FMT = 0;
layout(constant_id = 1) const uint M = 1;
layout(constant_id = 2) const uint IG = 8;
layout(constant_id = 3) const uint NB = 8;
layout(constant_id = 4) const uint CS = 1;

layout(std430, binding = 0) readonly buffer Wt { uint w[]; };   // dense values or AQLM codes
layout(std430, binding = 1) readonly buffer Cb { uint cb[]; };  // AQLM codebooks
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer X4 { vec4 x4[]; }; // same buffer, 16-byte loads
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer S { float scales[]; }; // whole weight, f32
layout(std430, binding = 5) readonly buffer B { float bias[]; };   // whole weight, f32

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, cols, stride, n, flags; // flags bit0: bias
} pc;

const uint TM = 64, TN = 64, TK = 32;
shared float ws[TM][TK + 1];
shared float xs[TN][TK + 1];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u, ty = tid / 16u;
    uint rt = gl_WorkGroupID.x * TM, tt = gl_WorkGroupID.y * TN;
    // loader role: one 8-value run of the weight tile and of the x tile
    uint lr = tid / 4u, lk = (tid % 4u) * 8u;
    uint wr = rt + lr, xt = tt + lr;
    float scale = 1.0;
    if (FMT == FMT_AQLM && wr < pc.rows_p) scale = scales[pc.row0 + wr];

    float acc[4][4];
    for (uint i = 0u; i < 4u; i++)
        for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;

    uint kend = FMT == FMT_AQLM ? pc.cols : pc.stride;
    for (uint k0 = 0u; k0 < kend; k0 += TK) {
        float v[8];
        uint k = k0 + lk;
        if (wr < pc.rows_p && k < kend) {
            if (FMT == FMT_AQLM) {
                AQLM_DEQ8(w, cb, M, NB, IG, CS, pc.rows_p, wr, k / IG, k % IG, v)
                for (uint i = 0u; i < 8u; i++) v[i] *= scale;
            } else {
                DENSE8(w, FMT, wr * pc.stride + k, v)
            }
        } else {
            for (uint i = 0u; i < 8u; i++) v[i] = 0.0;
        }
        for (uint i = 0u; i < 8u; i++) ws[lr][lk + i] = v[i];
        if (xt < pc.n && k + 8u <= pc.cols && (pc.cols & 3u) == 0u) {
            uint b = (xt * pc.cols + k) >> 2;
            vec4 a0 = x4[b], a1 = x4[b + 1u];
            for (uint i = 0u; i < 4u; i++) {
                xs[lr][lk + i] = a0[i];
                xs[lr][lk + 4u + i] = a1[i];
            }
        } else if (xt < pc.n && k + 8u <= pc.cols) {
            uint b = xt * pc.cols + k;
            for (uint i = 0u; i < 8u; i++) xs[lr][lk + i] = x[b + i];
        } else {
            for (uint i = 0u; i < 8u; i++)
                xs[lr][lk + i] = (xt < pc.n && k + i < pc.cols) ? x[xt * pc.cols + k + i] : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < TK; kk++) {
            float a[4], bb[4];
            for (uint i = 0u; i < 4u; i++) a[i] = ws[tx + 16u * i][kk];
            for (uint j = 0u; j < 4u; j++) bb[j] = xs[ty + 16u * j][kk];
            for (uint i = 0u; i < 4u; i++)
                for (uint j = 0u; j < 4u; j++) acc[i][j] += a[i] * bb[j];
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint r = rt + tx + 16u * i;
        if (r >= pc.rows_p) continue;
        float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
        for (uint j = 0u; j < 4u; j++) {
            uint t = tt + ty + 16u * j;
            if (t < pc.n) y[t * pc.rows_total + pc.row0 + r] = acc[i][j] + bv;
        }
    }
}
