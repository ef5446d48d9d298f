#version 450
#extension GL_GOOGLE_include_directive : require
// Batched AQLM matmul for prompts through int8 tiles (the CPU's recipe, src/cpu/i8tile):
// y[t][row0+r] = sum_b (float)(q_w . q_x)_b * sw[r][b] * sa[t][b] (+ bias), one fused
// multiply-add per 256-column block b in block order, the dot products exact in int32
// (OpSDot on four packed int8 pairs). q_w = round(W * 127 / max|W_b|) per output row and
// block, from the decoded row (scale applied); q_x and sa come from mm_quant_i8.comp.
// Each weight is off by at most sw/2 and each activation by sa/2, so per output
//   |y - W.x| <= sum_b ( sw/2 |x_b|_1 + sa/2 |W_b|_1 + 256 sw sa / 4 )  (+ f32 rounding).
// Tiles of 64 rows x 64 tokens as mm_tile; invocation i decodes weight row i of the tile
// twice per block (once for max|W_b|, once to quantize half a block at a time), since a
// block of 64 decoded f32 rows (64 KiB) would not fit in shared memory. Shared memory:
// half a block of int8 weights and activations, 8 KiB each, and the block scales: 16.5 KiB,
// under the 20 KiB the AQLM matvecs already need (docs/vulkan.md).
#include "mm_common.glsl"

// OpSDot (SPV_KHR_integer_dot_product), as attn_dec.glsl names it: glslang here lacks
// GL_EXT_integer_dot_product (capabilities DotProduct, DotProductInput4x8BitPacked).
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 1) const uint IG = 8;
layout(constant_id = 2) const uint NB = 8;
layout(constant_id = 3) const uint CS = 1;

layout(std430, binding = 0) readonly buffer Wt { uint w[]; };   // AQLM codes (repacked)
layout(std430, binding = 1) readonly buffer Cb { uint cb[]; };  // codebooks
layout(std430, binding = 2) readonly buffer Xq { uint xq[]; };  // [n][nb * 64] packed int8
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer S { float scales[]; }; // whole weight, f32
layout(std430, binding = 5) readonly buffer B { float bias[]; };   // whole weight, f32
layout(std430, binding = 6) readonly buffer Sa { float sa[]; };    // [n][nb]

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, cols, n, flags, nb; // flags bit0: bias
} pc;

const uint TM = 64, TN = 64, HW = 32; // HW: words (4 columns each) per half block
shared uint ws[HW][TM];
shared uint xs[HW][TN];
shared float sws[TM], sas[TN];

uint pack4(float a, float b, float c, float d) {
    return (uint(int(a)) & 0xffu) | ((uint(int(b)) & 0xffu) << 8) | ((uint(int(c)) & 0xffu) << 16) |
           (uint(int(d)) << 24);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 8u, ty = tid / 8u;
    uint rt = gl_WorkGroupID.x * TM, tt = gl_WorkGroupID.y * TN;
    uint wr = rt + tid, xt = tt + tid; // the row this invocation decodes, the token it loads
    bool row_ok = wr < pc.rows_p, tok_ok = xt < pc.n;
    float scale = row_ok ? scales[pc.row0 + wr] : 0.0;
    uint kpw = pc.nb * 64u;

    float acc[8][8];
    [[unroll]] for (uint i = 0u; i < 8u; i++)
        [[unroll]] for (uint j = 0u; j < 8u; j++) acc[i][j] = 0.0;

    for (uint b = 0u; b < pc.nb; b++) {
        uint k0 = b * 256u, k1 = min(k0 + 256u, pc.cols);
        // pass 1: max |W_b| of this invocation's row (a NaN or infinity: NaN scale, zero q)
        float mx = 0.0;
        bool bad = false;
        for (uint k = k0; row_ok && k < k1; k += 8u) {
            float v[8];
            AQLM_DEQ8(w, cb, M, NB, IG, CS, pc.rows_p, wr, k / IG, k % IG, v)
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                float s = v[i] * scale;
                bad = bad || isnan(s) || isinf(s);
                mx = max(mx, abs(s));
            }
        }
        float inv = mx > 0.0 && !bad ? 127.0 / mx : 0.0;
        sws[tid] = bad ? uintBitsToFloat(0x7fc00000u) : mx / 127.0;
        sas[tid] = tok_ok ? sa[xt * pc.nb + b] : 0.0;

        int dots[8][8];
        [[unroll]] for (uint i = 0u; i < 8u; i++)
            [[unroll]] for (uint j = 0u; j < 8u; j++) dots[i][j] = 0;
        for (uint h = 0u; h < 2u; h++) {
            uint kh = k0 + h * 128u;
            if (kh >= pc.cols) break; // uniform: the whole workgroup leaves together
            // pass 2: this half block of the row as int8, four columns per word
            for (uint g = 0u; g < HW / 2u; g++) {
                uint k = kh + 8u * g;
                float v[8];
                if (row_ok && k < pc.cols) {
                    AQLM_DEQ8(w, cb, M, NB, IG, CS, pc.rows_p, wr, k / IG, k % IG, v)
                    [[unroll]] for (uint i = 0u; i < 8u; i++) v[i] = roundEven(clamp(v[i] * scale * inv, -127.0, 127.0));
                } else {
                    [[unroll]] for (uint i = 0u; i < 8u; i++) v[i] = 0.0;
                }
                ws[2u * g][tid] = pack4(v[0], v[1], v[2], v[3]);
                ws[2u * g + 1u][tid] = pack4(v[4], v[5], v[6], v[7]);
            }
            uint xb = xt * kpw + b * 64u + h * HW;
            [[unroll]] for (uint q = 0u; q < HW; q++) xs[q][tid] = tok_ok ? xq[xb + q] : 0u;
            barrier();
            for (uint q = 0u; q < HW; q++) {
                uint a[8], c[8];
                [[unroll]] for (uint i = 0u; i < 8u; i++) a[i] = ws[q][tx + 8u * i];
                [[unroll]] for (uint j = 0u; j < 8u; j++) c[j] = xs[q][ty + 8u * j];
                [[unroll]] for (uint i = 0u; i < 8u; i++)
                    [[unroll]] for (uint j = 0u; j < 8u; j++) dots[i][j] += sdot4x8(a[i], c[j], 0);
            }
            barrier();
        }
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            float swi = sws[tx + 8u * i];
            [[unroll]] for (uint j = 0u; j < 8u; j++) acc[i][j] = fma(float(dots[i][j]), swi * sas[ty + 8u * j], acc[i][j]);
        }
        barrier(); // sws / sas are rewritten by the next block
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
