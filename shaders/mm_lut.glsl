// AQLM decode matvec for 8-bit codebooks (1x8, 2x8, 4x8, 8x8; in_group 8 or 16),
// NT tokens at once; included by mm_lut.comp (f32 table) and mm_lut_h.comp (LUT_F16).
// A workgroup owns 256*RPT rows of a piece and a range of 16-byte code chunks
// (16 codes = 16/M groups). Per chunk it stages the x values the chunk covers, then
// per token builds the lookup table
// lut[p][c] = dot(x group of code slot p, codebook(p % M)[c]) in shared memory
// (invocation c owns codeword c of every codebook, kept in registers for the whole
// dispatch) and sums 16 table entries per row. Codes are read as one uvec4 per row
// and chunk, consecutive rows by consecutive invocations.
//
// LUT_F16: the table is kept as fp16 (8 KiB instead of 16 KiB of shared memory, so
// twice the workgroups fit beside each other on a GPU core; the table build and the
// lookups are the same instructions). Each entry is computed in f32 as above, then
// stored as fp16(T * 2^e), where 2^e is a power of two per chunk and token chosen from
// B = max|x of the chunk| * pc.cb_l1 (cb_l1: the weight's largest codeword L1 norm,
// from the host), so every |T| <= B lands in [0, 2^15): no overflow of fp16's 65504
// whatever the activations, and small values stay off fp16's subnormals (for
// 2^-85 <= B < 2^115: e is clamped to [-100, 100]). Rows add
// the entries in f32 and multiply by 2^-e (exact). Error per entry, against the f32
// table: |dT| <= u*|T| + 2^-28*B, u = 2^-11 when the conversion rounds to nearest
// (lavapipe, the GPUs we know of), 2^-10 when a driver truncates (Vulkan allows
// either); the 2^-28*B term covers fp16 subnormals even when flushed to zero. So per
// output: |dy| <= |scale| * sum over its entries of (u*|T| + 2^-28*B), plus f32
// rounding (tests/test_backend_matmul.c test_matvec_lut16 holds outputs to it).
// Output (mm_store.glsl): final rows, or split over chunks partial sums that the
// last workgroup (or mm_reduce.comp) adds up.
#include "mm_common.glsl"
#include "mm_sum.glsl"

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
layout(std430, binding = 6) coherent buffer YF { float yf[]; };  // rows, when the last workgroup reduces
layout(std430, binding = 7) coherent buffer Cnt { uint cnt[]; }; // workgroups done per row block

layout(push_constant) uniform PC {
    uint rows_p, row0, rows_total, cols, n_chunks, chunks_per_split, flags, n; // flags: bit0 bias, bit1 partial, bit2 last workgroup reduces
    float cb_l1; // max over codewords of sum |c_j| (LUT_F16's scale)
    float eps;   // MM_NORM's
    uint t0;     // first token of this piece in x and y (vk_matmul.c: pieces of at most 4)
} pc;
#include "mm_fuse.glsl"

#ifdef LUT_F16
shared float16_t lut[16 * 256];
shared uint xmax[2 * NT]; // max |x| per token of the chunk, as float bits; two slots by chunk parity

// 2^e for a power e in [-100, 100] (built from the bits: exact, unlike exp2)
float pow2(int e) { return uintBitsToFloat(uint(127 + e) << 23); }

// e such that B * 2^e < 2^15 (B = 0: 15); 0 when B is inf or NaN (an inf/NaN x or codeword,
// which then reaches the rows as in f32)
int lut_exp(uint xbits) {
    float bnd = uintBitsToFloat(xbits) * pc.cb_l1;
    if (!(bnd <= 3.0e38)) return 0;
    int eb;
    frexp(bnd, eb); // bnd < 2^eb
    return clamp(15 - eb, -100, 100);
}
#else
shared float lut[16 * 256];
#endif
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
#ifdef LUT_F16
    if (tid < 2u * NT) xmax[tid] = 0u;
#endif

    for (uint c = c0; c < c1; c++) {
        barrier(); // the previous chunk's readers of xs / lut are done
#ifdef LUT_F16
        uint par = (c - c0) & 1u;
        // the next chunk's slot: its readers (two chunks back) are past the barrier above
        if (tid < NT) xmax[(par ^ 1u) * NT + tid] = 0u;
#endif
        for (uint i = tid; i < NT * CW; i += 256u) {
            uint t = i / CW, k = c * CW + i % CW;
            float v = (t < pc.n && k < pc.cols) ? mm_x((pc.t0 + t) * pc.cols + k) : 0.0;
            xs[i] = v;
#ifdef LUT_F16
            atomicMax(xmax[par * NT + t], floatBitsToUint(abs(v)));
#endif
        }
        uvec4 cd[RPT];
        [[unroll]] for (uint j = 0u; j < RPT; j++) {
            uint r = rbase + j * 256u;
            cd[j] = r < pc.rows_p ? codes[c * pc.rows_p + r] : uvec4(0u);
        }
        [[unroll]] for (uint t = 0u; t < NT; t++) {
            barrier(); // xs written; lut of the previous token consumed
#ifdef LUT_F16
            int e = lut_exp(xmax[par * NT + t]);
            float up = pow2(e), down = pow2(-e);
#endif
            [[unroll]] for (uint p = 0u; p < 16u; p++) {
                uint g = p / M, m = p % M;
                uint xo = t * CW + g * IG;
                float s = 0.0;
                [[unroll]] for (uint i = 0u; i < HW; i++) {
                    vec2 h = unpackHalf2x16(cw[m * HW + i]);
                    s += h.x * xs[xo + 2u * i] + h.y * xs[xo + 2u * i + 1u];
                }
#ifdef LUT_F16
                lut[p * 256u + tid] = float16_t(s * up);
#else
                lut[p * 256u + tid] = s;
#endif
            }
            barrier();
            [[unroll]] for (uint j = 0u; j < RPT; j++) {
                float s = 0.0;
                [[unroll]] for (uint p = 0u; p < 16u; p++) s += float(lut[p * 256u + bitfieldExtract(cd[j][p / 4u], int((p % 4u) * 8u), 8)]);
#ifdef LUT_F16
                acc[j * NT + t] += s * down;
#else
                acc[j * NT + t] += s;
#endif
            }
        }
    }
#include "mm_store.glsl"
}
