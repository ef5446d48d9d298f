#version 450
#extension GL_GOOGLE_include_directive : require
// AQLM decode matvec for 8-bit codebooks (1x8, 2x8, 4x8, 8x8; in_group 8 or 16),
// NT tokens at once. A workgroup owns 256*RPT rows of a piece and a range of
// 16-byte code chunks (16 codes = 16/M groups). Per chunk it stages the x values
// the chunk covers, then per token builds the lookup table
// lut[p][c] = dot(x group of code slot p, codebook(p % M)[c]) in shared memory
// (invocation c owns codeword c of every codebook, kept in registers for the whole
// dispatch) and sums 16 table entries per row. Codes are read as one uvec4 per row
// and chunk, consecutive rows by consecutive invocations.
// Output (mm_store.glsl): final rows, or split over chunks partial sums that the
// last workgroup (or mm_reduce.comp) adds up.
#include "mm_common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint M = 2;
layout(constant_id = 1) const uint IG = 8;
layout(constant_id = 2) const uint NT = 1;

const uint RPT = 4;            // rows per invocation
const uint CG = 16 / M;        // groups per chunk
const uint CW = CG * IG;       // x values per chunk
const uint HW = IG / 2;        // uint words per codeword

layout(std430, binding = 0) readonly buffer Codes { uvec4 codes[]; };
layout(std430, binding = 1) readonly buffer Cb { uint cb[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) coherent buffer Y { float y[]; }; // rows, or the partial sums
layout(std430, binding = 4) readonly buffer S { float scales[]; };
layout(std430, binding = 5) readonly buffer B { float bias[]; };
layout(std430, binding = 6) writeonly buffer YF { float yf[]; };  // rows, when the last workgroup reduces
layout(std430, binding = 7) coherent buffer Cnt { uint cnt[]; }; // workgroups done per row block

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, cols, n_chunks, chunks_per_split, flags, n; // flags: bit0 bias, bit1 partial, bit2 last workgroup reduces
} pc;

shared float lut[16 * 256];
shared float xs[NT * CW];

shared uint last_wg;

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint rbase = gl_WorkGroupID.x * 256u * RPT + tid;
    uint c0 = gl_WorkGroupID.y * pc.chunks_per_split;
    uint c1 = min(c0 + pc.chunks_per_split, pc.n_chunks);

    uint cw[M * HW];
    [[unroll]] for (uint m = 0u; m < M; m++)
        [[unroll]] for (uint i = 0u; i < HW; i++) cw[m * HW + i] = cb[(m * 256u + tid) * HW + i];

    float acc[RPT * NT];
    [[unroll]] for (uint i = 0u; i < RPT * NT; i++) acc[i] = 0.0;

    for (uint c = c0; c < c1; c++) {
        barrier(); // the previous chunk's readers of xs / lut are done
        for (uint i = tid; i < NT * CW; i += 256u) {
            uint t = i / CW, k = c * CW + i % CW;
            xs[i] = (t < pc.n && k < pc.cols) ? x[t * pc.cols + k] : 0.0;
        }
        uvec4 cd[RPT];
        [[unroll]] for (uint j = 0u; j < RPT; j++) {
            uint r = rbase + j * 256u;
            cd[j] = r < pc.rows_p ? codes[c * pc.rows_p + r] : uvec4(0u);
        }
        [[unroll]] for (uint t = 0u; t < NT; t++) {
            barrier(); // xs written; lut of the previous token consumed
            [[unroll]] for (uint p = 0u; p < 16u; p++) {
                uint g = p / M, m = p % M;
                uint xo = t * CW + g * IG;
                float s = 0.0;
                [[unroll]] for (uint i = 0u; i < HW; i++) {
                    vec2 h = unpackHalf2x16(cw[m * HW + i]);
                    s += h.x * xs[xo + 2u * i] + h.y * xs[xo + 2u * i + 1u];
                }
                lut[p * 256u + tid] = s;
            }
            barrier();
            [[unroll]] for (uint j = 0u; j < RPT; j++) {
                float s = 0.0;
                [[unroll]] for (uint p = 0u; p < 16u; p++) s += lut[p * 256u + bitfieldExtract(cd[j][p / 4u], int((p % 4u) * 8u), 8)];
                acc[j * NT + t] += s;
            }
        }
    }
#include "mm_store.glsl"
}
