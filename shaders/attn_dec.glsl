// Decode attention (one query position) over the cache as stored, shaped for
// a GPU. One workgroup of 64 = up to G query heads of one KV head's GQA group
// (a tile of it, x) x one KV head (y) x one split of the positions (z).
// Positions go in blocks of BP:
//  1. staging: the whole workgroup copies the block's K rows and V rows (they
//     are contiguous in memory) into shared memory, consecutive invocations
//     reading consecutive words, so global reads coalesce for every format.
//     q8/q4 rows are realigned on the way (data words aligned, scales as
//     floats after them) and each staged row gets an odd word stride, so the
//     score pass below reads shared memory without bank conflicts.
//  2. scores: T = 64/BP invocations per key row; they split the heads, not
//     the row, so no cross-invocation sum is needed, and each K word read
//     from shared memory serves all of that invocation's heads (the q words
//     they pair with are the same for the whole row: broadcast reads).
//     ATTN_I8 (q8/q4 K where the device has integer dot products): q is
//     rounded to int8 per block of 32 once per workgroup (scale max|q|/127)
//     and each word is one OpSDot of 4 int8 pairs.
//  3. online softmax: 64/G invocations per head take the block's scores,
//     the block max goes through subgroupMax (ATTN_SUBGROUP) or shared memory.
//  4. V: invocations own words of the V row (dims) and a share of the block's
//     positions, and accumulate all heads from the staged rows.
// Each split writes unnormalised (max, sum, acc) per head like attn_fused,
// so attn_merge combines them and undoes the V rotation.
#include "kv_format.glsl"

#ifdef ATTN_I8
// OpSDot (SPV_KHR_integer_dot_product) on 4 packed int8 pairs: glslang here has no
// GL_EXT_integer_dot_product, so the instruction is named directly
// (capabilities DotProduct, DotProductInput4x8BitPacked; fmt 0 = PackedVectorFormat4x8Bit).
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
#endif

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint HD = 128; // head_dim (q8/q4: a multiple of 32; f16/f32: even)
layout(constant_id = 1) const uint G = 4;    // query heads a workgroup holds (1..8; pc.ng of them used)
layout(constant_id = 2) const uint TK = 2;   // K and V cache types (kv_format.glsl T_*)
layout(constant_id = 3) const uint TV = 2;
layout(constant_id = 4) const uint BP = 32;  // positions per block: 8..64, divides 64 (vk_kv.c attn_pick)

const uint WG = 64u;
const uint NB = HD / QK, NB1 = NB > 0u ? NB : 1u; // quantization blocks per row
// staged row: D data words, then SC scales (f32 bits), stride S words (odd)
const uint KD = TK == T_F32 ? HD : TK == T_F16 ? HD / 2u : TK == T_Q8 ? HD / 4u : HD / 8u;
const uint VD = TV == T_F32 ? HD : TV == T_F16 ? HD / 2u : TV == T_Q8 ? HD / 4u : HD / 8u;
const uint KSC = TK >= T_Q8 ? NB : 0u, VSC = TV >= T_Q8 ? NB : 0u;
const uint KS = (KD + KSC) | 1u, VS = (VD + VSC) | 1u;
const uint T = WG / BP;               // invocations per key row in the score pass
const uint HPL = (G + T - 1u) / T;    // heads per invocation there
const uint LH = WG / G;               // invocations per head in the softmax pass
const uint PPL = (BP + LH - 1u) / LH; // positions per invocation there
const uint VPW = TV == T_F32 ? 1u : TV == T_F16 ? 2u : TV == T_Q8 ? 4u : 8u; // V values per word
const uint VDL = VD < WG ? VD : WG;   // invocations across a V row's words
const uint PG = WG / VDL;             // position groups in the V pass
const uint UPW = (VD + WG - 1u) / WG; // V words per invocation
const float NEG = -3.0e38;            // "nothing seen yet" max; finite, so exp(NEG - m) = 0 without NaNs

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer KC { uint kc[]; };
layout(std430, binding = 2) readonly buffer VC { uint vc[]; };
layout(std430, binding = 3) writeonly buffer Part { float part[]; };

layout(push_constant) uniform PC {
    uint pos, lo;        // the query's position and the first one it sees (sliding window)
    uint n_ctx, n_head, n_rep, ng; // ng: heads per tile (x)
    uint rot_k;
    uint kbase, vbase, krow_words, vrow_words;
    uint blk_per_split;  // blocks of BP positions per split (z)
    uint ml_off;         // word offset of the (max, sum) pairs in part
    uint q_off;          // float offset of the q row
    float scale, hscale;
} pc;

shared uint kst[BP * KS];
shared uint vst[BP * VS];
shared float qs[G * HD]; // q rows (scaled, rotated); at the end the split's output
#ifdef ATTN_I8
shared uint qi[G * HD / 4u]; // q as int8, 4 per word
shared float qd[G * NB1];    // their scale per block
shared int qsum[G * NB1];    // their sum per block (q4's +8 offset)
#endif
shared float ss[G * BP]; // scores, then softmax weights
shared float fs[G];      // each head's accumulator rescale for this block
#ifdef ATTN_SUBGROUP
shared float red[WG * G]; // [subgroup][head] block max (64 subgroups: any size down to 1)
#else
shared float red[WG];
#endif

// Copies rows p0..p0+BP-1 (those in [va, vb], zeros elsewhere) of a cache into ST.
#define STAGE(ST, BUF, D, SC, S, TY, BASE, RW)                                                         \
    for (uint x = tid; x < BP * D; x += WG) {                                                          \
        const uint r = x / D, u = x % D, p = p0 + r;                                                   \
        uint w = 0u;                                                                                   \
        if (p >= va && p <= vb) {                                                                      \
            const uint rw0 = BASE + p * RW;                                                            \
            if (TY <= T_F16) w = BUF[rw0 + u];                                                         \
            else if (TY == T_Q8) w = KV_W4(BUF, rw0 * 4u + (u / 8u) * Q8_BYTES + 2u + (u % 8u) * 4u);  \
            else w = KV_W4(BUF, rw0 * 4u + (u / 4u) * Q4_BYTES + 2u + (u % 4u) * 4u);                  \
        }                                                                                              \
        ST[r * S + u] = w;                                                                             \
    }                                                                                                  \
    for (uint x = tid; x < BP * SC; x += WG) {                                                         \
        const uint r = x / NB1, c = x % NB1, p = p0 + r;                                               \
        float sc = 0.0;                                                                                \
        if (p >= va && p <= vb)                                                                        \
            sc = kv_f16_to_f32(KV_U16(BUF, (BASE + p * RW) * 4u + c * (TY == T_Q8 ? Q8_BYTES : Q4_BYTES))); \
        ST[r * S + D + c] = floatBitsToUint(sc);                                                       \
    }

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint g = gl_WorkGroupID.y, split = gl_WorkGroupID.z;
    const uint r0 = gl_WorkGroupID.x * pc.ng;    // first head of the group in this tile
    const uint nh = min(pc.ng, pc.n_rep - r0);   // heads in this tile (<= G)
    const uint h0 = g * pc.n_rep + r0;           // its first query head

    // ---- q rows, scaled, rotated when K is stored rotated ((Hq).(Hk) = q.k) ----
    for (uint x = tid; x < G * HD; x += WG) {
        const uint r = x / HD;
        qs[x] = r < nh ? q[pc.q_off + (h0 + r) * HD + x % HD] * pc.scale : 0.0;
    }
    barrier();
    if (pc.rot_k != 0u) KV_ROTATE_ROWS(qs, G, HD, tid, WG, pc.hscale)
#ifdef ATTN_I8
    // q -> int8 per block of 32: d = max|q|/127, qi = round(q/d) (|q - d qi| <= d/2; vk_kv.c states the bound)
    if (TK >= T_Q8) {
        for (uint x = tid; x < G * NB; x += WG) {
            const uint o = (x / NB) * HD + (x % NB) * QK;
            float amax = 0.0;
            for (uint j = 0u; j < QK; j++) amax = max(amax, abs(qs[o + j]));
            const float d = amax / 127.0;
            int sum = 0;
            for (uint w = 0u; w < QK / 4u; w++) {
                uint word = 0u;
                for (uint e = 0u; e < 4u; e++) {
                    const int v = d > 0.0 ? int(clamp(kv_round(qs[o + 4u * w + e] / d), -127.0, 127.0)) : 0;
                    sum += v;
                    word |= (uint(v) & 0xFFu) << (8u * e);
                }
                qi[o / 4u + w] = word;
            }
            qd[x] = d;
            qsum[x] = sum;
        }
        barrier();
    }
#endif

    const uint pos = pc.pos, lo = pc.lo;
    const uint b_first = lo / BP + split * pc.blk_per_split;
    const uint b_end = min(b_first + pc.blk_per_split, pos / BP + 1u);
    const uint kg = pc.kbase + g * pc.n_ctx * pc.krow_words, vg = pc.vbase + g * pc.n_ctx * pc.vrow_words;

    // softmax pass: invocation (sr, si) holds head sr's running max m and its share l of the sum
    const uint sr = tid / LH, si = tid % LH;
    const bool sact = sr < nh;
    float m = NEG, l = 0.0;
    // V pass: invocation (vpg, vu) owns V words vu, vu + 64, ... for positions vpg, vpg + PG, ...
    const uint vu = tid % VDL, vpg = tid / VDL;
    const bool vact = vpg < PG;
    float acc[G][UPW * VPW];
    for (uint r = 0u; r < G; r++)
        for (uint e = 0u; e < UPW * VPW; e++) acc[r][e] = 0.0;

    for (uint blk = b_first; blk < b_end; blk++) {
        const uint p0 = blk * BP;
        const uint va = max(p0, lo), vb = min(p0 + BP - 1u, pos); // visible positions of this block
        STAGE(kst, kc, KD, KSC, KS, TK, kg, pc.krow_words)
        STAGE(vst, vc, VD, VSC, VS, TV, vg, pc.vrow_words)
        barrier();

        // ---- scores: invocation (p, j) dots key row p with heads j, j + T, ... ----
        {
            const uint p = tid / T, j = tid % T, rb = p * KS;
            float s[HPL];
            for (uint k = 0u; k < HPL; k++) s[k] = 0.0;
            if (TK == T_F32) {
                for (uint u = 0u; u < HD; u++) {
                    const float kv = uintBitsToFloat(kst[rb + u]);
                    for (uint k = 0u; k < HPL; k++)
                        if (j + T * k < G) s[k] += qs[(j + T * k) * HD + u] * kv;
                }
            } else if (TK == T_F16) {
                for (uint u = 0u; u < HD / 2u; u++) {
                    const vec2 kv = unpackHalf2x16(kst[rb + u]);
                    for (uint k = 0u; k < HPL; k++)
                        if (j + T * k < G) {
                            const uint o = (j + T * k) * HD + 2u * u;
                            s[k] += qs[o] * kv.x + qs[o + 1u] * kv.y;
                        }
                }
            } else {
                const bool q8 = TK == T_Q8;
                const uint WPB = q8 ? 8u : 4u; // data words per block
                for (uint b = 0u; b < NB; b++) {
                    const float dk = uintBitsToFloat(kst[rb + KD + b]);
#ifdef ATTN_I8
                    int t[HPL];
                    for (uint k = 0u; k < HPL; k++) t[k] = 0;
                    for (uint w = 0u; w < WPB; w++) {
                        const uint x = kst[rb + b * WPB + w];
                        const uint lo4 = x & 0x0F0F0F0Fu, hi4 = (x >> 4) & 0x0F0F0F0Fu;
                        for (uint k = 0u; k < HPL; k++)
                            if (j + T * k < G) {
                                const uint o = (j + T * k) * (HD / 4u) + b * 8u + w;
                                if (q8) t[k] += sdot4x8(x, qi[o], 0);
                                else t[k] += sdot4x8(lo4, qi[o], 0) + sdot4x8(hi4, qi[o + 4u], 0);
                            }
                    }
                    for (uint k = 0u; k < HPL; k++)
                        if (j + T * k < G) {
                            const uint qb = (j + T * k) * NB1 + b;
                            s[k] += dk * qd[qb] * float(q8 ? t[k] : t[k] - 8 * qsum[qb]);
                        }
#else
                    float t[HPL];
                    for (uint k = 0u; k < HPL; k++) t[k] = 0.0;
                    for (uint w = 0u; w < WPB; w++) {
                        const uint x = kst[rb + b * WPB + w];
                        vec4 k0, k1 = vec4(0.0);
                        if (q8) {
                            k0 = vec4(bitfieldExtract(int(x), 0, 8), bitfieldExtract(int(x), 8, 8),
                                      bitfieldExtract(int(x), 16, 8), bitfieldExtract(int(x), 24, 8));
                        } else { // byte i: value 4w+i (low nibble) and 16+4w+i (high), stored +8
                            k0 = vec4(bitfieldExtract(x, 0, 4), bitfieldExtract(x, 8, 4), bitfieldExtract(x, 16, 4),
                                      bitfieldExtract(x, 24, 4)) - 8.0;
                            k1 = vec4(bitfieldExtract(x, 4, 4), bitfieldExtract(x, 12, 4), bitfieldExtract(x, 20, 4),
                                      bitfieldExtract(x, 28, 4)) - 8.0;
                        }
                        for (uint k = 0u; k < HPL; k++)
                            if (j + T * k < G) {
                                const uint o = (j + T * k) * HD + b * QK + 4u * w;
                                t[k] += dot(vec4(qs[o], qs[o + 1u], qs[o + 2u], qs[o + 3u]), k0);
                                if (!q8) t[k] += dot(vec4(qs[o + 16u], qs[o + 17u], qs[o + 18u], qs[o + 19u]), k1);
                            }
                    }
                    for (uint k = 0u; k < HPL; k++) s[k] += dk * t[k];
#endif
                }
            }
            const bool vis = p0 + p >= va && p0 + p <= vb;
            for (uint k = 0u; k < HPL; k++)
                if (j + T * k < G) ss[(j + T * k) * BP + p] = vis ? s[k] : NEG;
        }
        barrier();

        // ---- online softmax: block max per head, rescale, weights ----
        {
            float bm = NEG;
            for (uint k = 0u; k < PPL; k++)
                if (sact && si + LH * k < BP) bm = max(bm, ss[sr * BP + si + LH * k]);
#ifdef ATTN_SUBGROUP
            for (uint h = 0u; h < G; h++) { // every invocation, so control flow stays uniform
                const float t = subgroupMax(sact && sr == h ? bm : NEG);
                if (subgroupElect()) red[gl_SubgroupID * G + h] = t;
            }
            barrier();
            if (sact)
                for (uint x = 0u; x < gl_NumSubgroups; x++) bm = max(bm, red[x * G + sr]);
#else
            red[tid] = bm;
            barrier();
            if (sact)
                for (uint x = 0u; x < LH; x++) bm = max(bm, red[sr * LH + x]);
#endif
            if (sact) {
                const float mn = max(m, bm), f = exp(m - mn);
                m = mn;
                float lw = 0.0;
                for (uint k = 0u; k < PPL; k++) {
                    const uint p = si + LH * k;
                    if (p < BP) {
                        const float w = p0 + p >= va && p0 + p <= vb ? exp(ss[sr * BP + p] - m) : 0.0;
                        ss[sr * BP + p] = w;
                        lw += w;
                    }
                }
                l = l * f + lw;
                if (si == 0u) fs[sr] = f;
            }
        }
        barrier();

        // ---- acc = acc * f + weights . V ----
        if (vact) {
            for (uint r = 0u; r < G; r++)
                if (r < nh) {
                    const float f = fs[r];
                    for (uint e = 0u; e < UPW * VPW; e++) acc[r][e] *= f;
                }
            for (uint p = vpg; p < BP; p += PG) {
                if (p0 + p < va || p0 + p > vb) continue;
                for (uint k = 0u; k < UPW; k++) {
                    const uint u = vu + WG * k;
                    if (u >= VD) break;
                    const uint x = vst[p * VS + u];
                    float v[VPW];
                    if (TV == T_F32) {
                        v[0] = uintBitsToFloat(x);
                    } else if (TV == T_F16) {
                        const vec2 h2 = unpackHalf2x16(x);
                        v[0] = h2.x;
                        v[1 % VPW] = h2.y;
                    } else if (TV == T_Q8) {
                        const float dv = uintBitsToFloat(vst[p * VS + VD + u / 8u]);
                        for (uint e = 0u; e < VPW; e++) v[e] = float(bitfieldExtract(int(x), int(8u * e), 8)) * dv;
                    } else {
                        const float dv = uintBitsToFloat(vst[p * VS + VD + u / 4u]);
                        for (uint e = 0u; e < VPW; e++)
                            v[e] = (float(bitfieldExtract(x, int(8u * (e % 4u) + 4u * (e / 4u)), 4)) - 8.0) * dv;
                    }
                    for (uint r = 0u; r < G; r++)
                        if (r < nh) {
                            const float w = ss[r * BP + p];
                            for (uint e = 0u; e < VPW; e++) acc[r][k * VPW + e] += w * v[e];
                        }
                }
            }
        }
        barrier();
    }

    // ---- this split's partials: sum of l over each head's invocations, acc over position groups ----
    red[tid] = l;
    for (uint pg = 0u; pg < PG; pg++) {
        if (vact && vpg == pg)
            for (uint k = 0u; k < UPW; k++) {
                const uint u = vu + WG * k;
                if (u >= VD) break;
                for (uint e = 0u; e < VPW; e++) {
                    // dim of value e of word u (q4: low nibbles are 4w.., high ones 16+4w.. of the block)
                    const uint d = TV == T_Q4 ? (u / 4u) * QK + (u % 4u) * 4u + (e % 4u) + 16u * (e / 4u) : u * VPW + e;
                    for (uint r = 0u; r < G; r++)
                        if (r < nh) qs[r * HD + d] = (pg == 0u ? 0.0 : qs[r * HD + d]) + acc[r][k * VPW + e];
                }
            }
        barrier();
    }
    for (uint x = tid; x < nh * HD; x += WG) part[(split * pc.n_head + h0 + x / HD) * HD + x % HD] = qs[x];
    if (sact && si == 0u) {
        float sum = 0.0;
        for (uint x = 0u; x < LH; x++) sum += red[sr * LH + x];
        const uint o = pc.ml_off + (split * pc.n_head + h0 + sr) * 2u;
        part[o] = m;
        part[o + 1u] = sum;
    }
}
