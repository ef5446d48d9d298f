#version 450
#extension GL_GOOGLE_include_directive : require
// Batched matmul for prompts: y[t][row0+r] = sum_k W[r][k] x[t][k] (+ bias) for one
// row piece of a weight. Tiles of 64 rows x 64 tokens, stepping k by 16: the weight
// tile is converted (dense) or dequantized (AQLM, scale applied) into shared memory
// once and used by all 64 tokens. 64 invocations, each owning 8 rows x 8 tokens
// (16 shared loads per 64 multiply-adds); rows follow the invocation index so the
// y stores of 8 neighbours are adjacent.
#include "mm_common.glsl"

layout(local_size_x = 64) in;
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

const uint TM = 64, TN = 64, TK = 16;
// k-major, so a step's 8 row (token) reads of neighbouring invocations are adjacent
// (or the same word)
shared float ws[TK][TM];
shared float xs[TK][TN];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 8u, ty = tid / 8u;
    uint rt = gl_WorkGroupID.x * TM, tt = gl_WorkGroupID.y * TN;
    // loader role: weight row rt+tid and token tt+tid, 16 values each per k step
    uint wr = rt + tid, xt = tt + tid;
    float scale = 1.0;
    if (FMT == FMT_AQLM && wr < pc.rows_p) scale = scales[pc.row0 + wr];
    bool x16 = (pc.cols & 3u) == 0u;

    float acc[8][8];
    [[unroll]] for (uint i = 0u; i < 8u; i++)
        [[unroll]] for (uint j = 0u; j < 8u; j++) acc[i][j] = 0.0;

    uint kend = FMT == FMT_AQLM ? pc.cols : pc.stride;
    for (uint k0 = 0u; k0 < kend; k0 += TK) {
        [[unroll]] for (uint h = 0u; h < TK; h += 8u) {
            float v[8];
            uint k = k0 + h;
            if (wr < pc.rows_p && k < kend) {
                if (FMT == FMT_AQLM) {
                    AQLM_DEQ8(w, cb, M, NB, IG, CS, pc.rows_p, wr, k / IG, k % IG, v)
                    [[unroll]] for (uint i = 0u; i < 8u; i++) v[i] *= scale;
                } else {
                    DENSE8(w, FMT, wr * pc.stride + k, v)
                }
            } else {
                [[unroll]] for (uint i = 0u; i < 8u; i++) v[i] = 0.0;
            }
            [[unroll]] for (uint i = 0u; i < 8u; i++) ws[h + i][tid] = v[i];
            if (xt < pc.n && k + 8u <= pc.cols && x16) {
                uint b = (xt * pc.cols + k) >> 2;
                vec4 a0 = x4[b], a1 = x4[b + 1u];
                [[unroll]] for (uint i = 0u; i < 4u; i++) {
                    xs[h + i][tid] = a0[i];
                    xs[h + 4u + i][tid] = a1[i];
                }
            } else {
                [[unroll]] for (uint i = 0u; i < 8u; i++)
                    xs[h + i][tid] = (xt < pc.n && k + i < pc.cols) ? x[xt * pc.cols + k + i] : 0.0;
            }
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < TK; kk++) {
            float a[8], bb[8];
            [[unroll]] for (uint i = 0u; i < 8u; i++) a[i] = ws[kk][tx + 8u * i];
            [[unroll]] for (uint j = 0u; j < 8u; j++) bb[j] = xs[kk][ty + 8u * j];
            [[unroll]] for (uint i = 0u; i < 8u; i++)
                [[unroll]] for (uint j = 0u; j < 8u; j++) acc[i][j] += a[i] * bb[j];
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        uint r = rt + tx + 8u * i;
        if (r >= pc.rows_p) continue;
        float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            uint t = tt + ty + 8u * j;
            if (t < pc.n) y[t * pc.rows_total + pc.row0 + r] = acc[i][j] + bv;
        }
    }
}
