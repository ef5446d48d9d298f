#version 450
#extension GL_GOOGLE_include_directive : require
// AQLM decode matvec for codebooks of more than 8 bits (1x16, in_group 8 or 16),
// NT tokens at once: each invocation owns RPT rows; per 16-byte code chunk (8 codes of
// 16 bits = 8/M groups) it gathers the codewords (the codebook, 1-2 MiB, stays in the
// device caches) and dots them with x values staged in shared memory.
// Why this shape suits a GPU (the loads are what bounds it):
// - codes: one 16-byte load per row and chunk; consecutive rows are consecutive
//   invocations and adjacent blocks, so a subgroup reads one contiguous run.
// - codewords: IG fp16 values, 16 bytes (in_group 8) or 32 bytes (in_group 16), at an
//   offset aligned to their size, read as one 16-byte load or two 16-byte loads of the
//   same 32-byte sector (16 bytes is the widest per-invocation load SPIR-V gives; 32
//   bytes is the unit the caches move), so a gather fetches only sectors it uses whole.
// - x: per code slot, the group's x values (IG per token) are read from shared memory
//   once into registers and serve all RPT rows, whose codeword loads are independent and
//   issued together. Rows outer (the earlier order) read them again for every row, RPT
//   times the shared-memory traffic, and behind a per-row bounds branch a compiler could
//   not reuse them. Rows past the piece use code 0 (a cached codeword) instead of a
//   branch and are not stored. Each row still adds its terms in the same order.
// Output as in mm_lut.comp: final rows or partial sums over a chunk range.
#include "mm_common.glsl"
#include "mm_sum.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 1) const uint IG = 8;
layout(constant_id = 2) const uint NT = 1;
layout(constant_id = 3) const uint NB = 16;

const uint RPT = 2;
const uint CG = 8 / M;   // groups per chunk
const uint CW = CG * IG; // x values per chunk
const uint QW = IG / 8;  // uvec4 per codeword

layout(std430, binding = 0) readonly buffer Codes { uvec4 codes[]; };
layout(std430, binding = 1) readonly buffer Cb { uvec4 cb[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) coherent buffer Y { float y[]; }; // rows, or the partial sums
layout(std430, binding = 4) readonly buffer S { float scales[]; };
layout(std430, binding = 5) readonly buffer B { float bias[]; };
layout(std430, binding = 6) coherent buffer YF { float yf[]; };  // rows, when the last workgroup reduces
layout(std430, binding = 7) coherent buffer Cnt { uint cnt[]; }; // workgroups done per row block

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, cols, n_chunks, chunks_per_split, flags, n;
    float cb_l1, eps; // cb_l1: mm_lut's (unused here); eps: MM_NORM's
    uint t0;          // first token of this piece in x and y
} pc;
#include "mm_fuse.glsl"

shared vec4 xs[NT * CW / 4];

shared uint last_wg;

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint rbase = gl_WorkGroupID.x * 256u * RPT + tid;
    uint c0 = gl_WorkGroupID.y * pc.chunks_per_split;
    uint c1 = min(c0 + pc.chunks_per_split, pc.n_chunks);

    float acc[RPT * NT];
    [[unroll]] for (uint i = 0u; i < RPT * NT; i++) acc[i] = 0.0;

    for (uint c = c0; c < c1; c++) {
        uvec4 cd[RPT]; // before the barrier: the loads overlap the staging
        [[unroll]] for (uint j = 0u; j < RPT; j++) {
            uint r = rbase + j * 256u;
            cd[j] = r < pc.rows_p ? codes[c * pc.rows_p + r] : uvec4(0u);
        }
        barrier(); // the previous chunk's readers of xs are done
        for (uint i = tid; i < NT * CW / 4u; i += 256u) {
            uint t = (4u * i) / CW, k = c * CW + (4u * i) % CW;
            vec4 v = vec4(0.0);
            if (t < pc.n)
                [[unroll]] for (uint e = 0u; e < 4u; e++)
                    if (k + e < pc.cols) v[e] = mm_x((pc.t0 + t) * pc.cols + k + e);
            xs[i] = v;
        }
        barrier();
        [[unroll]] for (uint p = 0u; p < 8u; p++) {
            uint g = p / M, m = p % M;
            vec4 xv[NT * 2u * QW]; // group g's x values, every token
            [[unroll]] for (uint t = 0u; t < NT; t++)
                [[unroll]] for (uint i = 0u; i < 2u * QW; i++) xv[t * 2u * QW + i] = xs[(t * CW + g * IG) / 4u + i];
            [[unroll]] for (uint j = 0u; j < RPT; j++) {
                uint code = bitfieldExtract(cd[j][p / 2u], int((p % 2u) * 16u), 16);
                uint cbase = ((m << NB) + code) * QW;
                [[unroll]] for (uint q = 0u; q < QW; q++) {
                    uvec4 h = cb[cbase + q];
                    vec2 w0 = unpackHalf2x16(h.x), w1 = unpackHalf2x16(h.y);
                    vec2 w2 = unpackHalf2x16(h.z), w3 = unpackHalf2x16(h.w);
                    vec4 lo = vec4(w0, w1), hi = vec4(w2, w3);
                    [[unroll]] for (uint t = 0u; t < NT; t++)
                        acc[j * NT + t] += dot(lo, xv[t * 2u * QW + 2u * q]) + dot(hi, xv[t * 2u * QW + 2u * q + 1u]);
                }
            }
        }
    }
#include "mm_store.glsl"
}
