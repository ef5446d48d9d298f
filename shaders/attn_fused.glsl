// Fused attention over the cache as stored (f32/f16/q8/q4 K and V, no
// dequantized copy). One workgroup = R query rows of one KV head g (rows are
// (query i, head j of g's GQA group), so decode puts a whole group in one
// workgroup and every K/V row is read once for all its heads; a prompt tile
// holds several queries) x one split of the positions. Positions go in
// blocks of BP with an online softmax; each split writes its unnormalised
// (max, sum, acc) per row, and attn_merge combines the splits.
// Included by attn_fused.comp (baseline: R invocations scan each row's scores
// in shared memory for its max and sum) and attn_fused_sg.comp (ATTN_SUBGROUP:
// subgroupMax/subgroupAdd on the scores in registers, then one shared step
// across subgroups; any subgroup size). attn_fused_h*.comp (ATTN_F16_STORAGE) read
// f16 K/V as 16-bit values (GL_EXT_shader_16bit_storage) instead of unpacking words.
#include "kv_format.glsl"

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint HD = 128; // head_dim, multiple of 32
layout(constant_id = 1) const uint R = 8;    // query rows per workgroup
layout(constant_id = 2) const uint TK = 0;   // K and V cache types (kv_format.glsl T_*): one pipeline per
layout(constant_id = 3) const uint TV = 0;   // pair, so only that pair's loads are compiled

const uint RG = R == 1u ? 1u : 2u; // row groups in the q.k phase (one row: all 64 on positions)
const uint BP = 64u / RG;          // positions per block (vk_kv.c attn_bp)
const uint RPT = (R + RG - 1u) / RG; // q.k rows per invocation
const uint DPT = (HD + 63u) / 64u; // output dims per invocation
const float NEG = -3.0e38;        // "no position yet" max; finite, so exp(NEG - m) = 0 without NaNs

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer KC { uint kc[]; };
layout(std430, binding = 2) readonly buffer VC { uint vc[]; };
#ifdef ATTN_F16_STORAGE // the same f16 K/V rows seen as half pairs / halves (16-bit storage)
layout(std430, binding = 1) readonly buffer KH { f16vec2 kh2[]; };
layout(std430, binding = 2) readonly buffer VH { float16_t vh[]; };
#endif
layout(std430, binding = 3) writeonly buffer Part { float part[]; };

layout(push_constant) uniform PC {
    uint n, pos0, n_ctx, n_head, n_rep, window;
    uint rot_k;
    uint kbase, vbase, krow_words, vrow_words;
    uint blk_per_split; // blocks of BP positions per split (z)
    uint ml_off;        // word offset of the (max, sum) pairs in part
    uint q_off;         // float offset of this call's first q row
    float scale, hscale;
} pc;

shared float qs[R * HD];
shared float ss[R * BP]; // scores, then softmax weights
shared float fs[R];      // rescale factor of each row's accumulator for this block
shared float mx[R];      // each row's running max
shared uint vlo[R], vhi[R]; // each row's visible positions in this block (vlo > vhi: none)
#ifdef ATTN_SUBGROUP
shared float red[64u * R];  // [subgroup][row] partial max, then sum (64 subgroups: any size down to 1)
#endif

uint lo_of(uint i) { // first position query i sees
    const uint p = pc.pos0 + i;
    return pc.window > 0u && p + 1u > pc.window ? p + 1u - pc.window : 0u;
}

#ifdef ATTN_SUBGROUP
// red[subgroup][r] = OP of row r's values over this subgroup, where this invocation holds
// v[k] for row rg + RG*k (ID: OP's identity). Every invocation runs it (uniform control flow).
#define ROW_REDUCE(v, rg, OP, ID)                                          \
    for (uint k = 0u; k < RPT; k++)                                        \
        for (uint q = 0u; q < RG; q++) {                                   \
            const float t = OP(q == rg ? v[k] : ID);                       \
            if (subgroupElect()) red[gl_SubgroupID * R + q + RG * k] = t;  \
        }
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint g = gl_WorkGroupID.y, split = gl_WorkGroupID.z;
    const uint rows = pc.n * pc.n_rep, r0 = gl_WorkGroupID.x * R;
    const uint nr = min(R, rows - r0); // valid rows in this tile
    const uint NR = pc.n * pc.n_head;  // output rows (all heads)

    // q rows, scaled, rotated when K is stored rotated ((Hq).(Hk) = q.k)
    for (uint x = tid; x < R * HD; x += 64u) {
        const uint r = x / HD, d = x % HD;
        float v = 0.0;
        if (r < nr) {
            const uint rg = r0 + r, i = rg / pc.n_rep, h = g * pc.n_rep + rg % pc.n_rep;
            v = q[pc.q_off + (i * pc.n_head + h) * HD + d] * pc.scale;
        }
        qs[x] = v;
    }
    barrier();
    if (pc.rot_k != 0u) KV_ROTATE_ROWS(qs, R, HD, tid, 64u, pc.hscale)

    // positions this workgroup covers: its rows' union, cut to its split
    const uint i_first = r0 / pc.n_rep, i_last = (r0 + nr - 1u) / pc.n_rep;
    const uint lo_t = lo_of(i_first), hi_t = pc.pos0 + i_last;
    const uint b_first = lo_of(0u) / BP + split * pc.blk_per_split;
    const uint b_lo = max(b_first, lo_t / BP), b_hi = min(b_first + pc.blk_per_split, hi_t / BP + 1u);

    // per-row online softmax state (held by invocation r < R)
    float m = NEG, l = 0.0;
    uint row_lo = 0u, row_hi = 0u;
    if (tid < nr) {
        const uint i = (r0 + tid) / pc.n_rep;
        row_lo = lo_of(i);
        row_hi = pc.pos0 + i;
    }
    float acc[R][DPT];
    for (uint r = 0u; r < R; r++)
        for (uint k = 0u; k < DPT; k++) acc[r][k] = 0.0;

    const uint kg = pc.kbase + g * pc.n_ctx * pc.krow_words, vg = pc.vbase + g * pc.n_ctx * pc.vrow_words;
    for (uint blk = b_lo; blk < b_hi; blk++) {
        const uint p0 = blk * BP;
        // ---- scores: invocation (p, row group) dots K row p0+p with its rows ----
        float s[RPT];
        bool vis[RPT]; // row rg + RG*k sees position p0 + p
        {
            const uint p = tid % BP, rg = tid / BP, pos = p0 + p;
            for (uint k = 0u; k < RPT; k++) s[k] = 0.0;
            if (pos >= lo_t && pos <= hi_t) {
                const uint kw = kg + pos * pc.krow_words;
                if (TK == T_F32) {
                    for (uint d = 0u; d < HD; d++) {
                        const float kv = uintBitsToFloat(kc[kw + d]);
                        for (uint k = 0u; k < RPT; k++)
                            if (rg + RG * k < R) s[k] += qs[(rg + RG * k) * HD + d] * kv;
                    }
                } else if (TK == T_F16) {
                    for (uint d = 0u; d < HD; d += 2u) {
#ifdef ATTN_F16_STORAGE
                        const vec2 kv = vec2(kh2[kw + d / 2u]);
#else
                        const vec2 kv = unpackHalf2x16(kc[kw + d / 2u]);
#endif
                        for (uint k = 0u; k < RPT; k++)
                            if (rg + RG * k < R) {
                                const uint o = (rg + RG * k) * HD + d;
                                s[k] += qs[o] * kv.x + qs[o + 1u] * kv.y;
                            }
                    }
                } else if (TK == T_Q8) {
                    for (uint b = 0u; b < HD / QK; b++) {
                        const uint by = kw * 4u + b * Q8_BYTES;
                        const float dk = unpackHalf2x16(KV_U16(kc, by)).x;
                        float t[RPT];
                        for (uint k = 0u; k < RPT; k++) t[k] = 0.0;
                        for (uint w = 0u; w < QK / 4u; w++) {
                            const int x = int(KV_W4(kc, by + 2u + 4u * w));
                            const vec4 kv = vec4(bitfieldExtract(x, 0, 8), bitfieldExtract(x, 8, 8),
                                                 bitfieldExtract(x, 16, 8), bitfieldExtract(x, 24, 8));
                            for (uint k = 0u; k < RPT; k++)
                                if (rg + RG * k < R) {
                                    const uint o = (rg + RG * k) * HD + b * QK + 4u * w;
                                    t[k] += dot(vec4(qs[o], qs[o + 1u], qs[o + 2u], qs[o + 3u]), kv);
                                }
                        }
                        for (uint k = 0u; k < RPT; k++) s[k] += dk * t[k];
                    }
                } else { // q4: byte j holds value j (low nibble) and j+16 (high), stored +8
                    for (uint b = 0u; b < HD / QK; b++) {
                        const uint by = kw * 4u + b * Q4_BYTES;
                        const float dk = unpackHalf2x16(KV_U16(kc, by)).x;
                        float t[RPT];
                        for (uint k = 0u; k < RPT; k++) t[k] = 0.0;
                        for (uint w = 0u; w < QK / 8u; w++) {
                            const uint x = KV_W4(kc, by + 2u + 4u * w);
                            const vec4 lo = vec4(bitfieldExtract(x, 0, 4), bitfieldExtract(x, 8, 4),
                                                 bitfieldExtract(x, 16, 4), bitfieldExtract(x, 24, 4)) - 8.0;
                            const vec4 hi = vec4(bitfieldExtract(x, 4, 4), bitfieldExtract(x, 12, 4),
                                                 bitfieldExtract(x, 20, 4), bitfieldExtract(x, 28, 4)) - 8.0;
                            for (uint k = 0u; k < RPT; k++)
                                if (rg + RG * k < R) {
                                    const uint o = (rg + RG * k) * HD + b * QK + 4u * w;
                                    t[k] += dot(vec4(qs[o], qs[o + 1u], qs[o + 2u], qs[o + 3u]), lo) +
                                            dot(vec4(qs[o + 16u], qs[o + 17u], qs[o + 18u], qs[o + 19u]), hi);
                                }
                        }
                        for (uint k = 0u; k < RPT; k++) s[k] += dk * t[k];
                    }
                }
            }
#ifdef ATTN_SUBGROUP
            for (uint k = 0u; k < RPT; k++) {
                const uint r = rg + RG * k, i = (r0 + r) / pc.n_rep;
                vis[k] = r < nr && pos >= lo_of(i) && pos <= pc.pos0 + i;
                if (!vis[k]) s[k] = NEG;
            }
            ROW_REDUCE(s, rg, subgroupMax, NEG)
#else
            for (uint k = 0u; k < RPT; k++)
                if (rg + RG * k < R) ss[(rg + RG * k) * BP + p] = s[k];
#endif
        }
        barrier();
        // ---- online softmax: new max per row, then the weights in parallel ----
        if (tid < R) {
            float f = 1.0;
            const uint x0 = tid < nr ? max(row_lo, p0) : 1u, x1 = tid < nr ? min(row_hi, p0 + BP - 1u) : 0u;
            if (x0 <= x1) {
                float bm = NEG;
#ifdef ATTN_SUBGROUP
                for (uint j = 0u; j < gl_NumSubgroups; j++) bm = max(bm, red[j * R + tid]);
#else
                for (uint x = x0; x <= x1; x++) bm = max(bm, ss[tid * BP + x - p0]);
#endif
                const float mn = max(m, bm);
                f = exp(m - mn);
                l *= f;
                m = mn;
            }
            fs[tid] = f;
            mx[tid] = m;
            vlo[tid] = x0;
            vhi[tid] = x1;
        }
        barrier();
#ifdef ATTN_SUBGROUP
        {
            const uint p = tid % BP, rg = tid / BP;
            float w[RPT];
            for (uint k = 0u; k < RPT; k++) {
                const uint r = rg + RG * k;
                w[k] = vis[k] ? exp(s[k] - mx[r]) : 0.0;
                if (r < R) ss[r * BP + p] = w[k];
            }
            ROW_REDUCE(w, rg, subgroupAdd, 0.0)
        }
        barrier();
        if (tid < R)
            for (uint j = 0u; j < gl_NumSubgroups; j++) l += red[j * R + tid];
#else
        for (uint x = tid; x < R * BP; x += 64u) {
            const uint r = x / BP, pos = p0 + x % BP;
            ss[x] = pos >= vlo[r] && pos <= vhi[r] ? exp(ss[x] - mx[r]) : 0.0;
        }
        barrier();
        if (tid < R)
            for (uint x = 0u; x < BP; x++) l += ss[tid * BP + x];
#endif
        // ---- acc = acc * f + weights . V, invocation = output dims tid, tid+64, ... ----
        for (uint r = 0u; r < R; r++) {
            const float f = fs[r];
            for (uint k = 0u; k < DPT; k++) acc[r][k] *= f;
        }
        const uint pa = max(p0, lo_t), pb = min(p0 + BP - 1u, hi_t);
        for (uint pos = pa; pos <= pb; pos++) {
            const uint vw = vg + pos * pc.vrow_words;
            for (uint k = 0u; k < DPT; k++) {
                const uint d = tid + 64u * k;
                if (d >= HD) break;
                float v;
                if (TV == T_F32) {
                    v = uintBitsToFloat(vc[vw + d]);
                } else if (TV == T_F16) {
#ifdef ATTN_F16_STORAGE
                    v = float(vh[vw * 2u + d]); // one half per invocation, no pair to pick from
#else
                    const vec2 h2 = unpackHalf2x16(vc[vw + d / 2u]);
                    v = (d & 1u) != 0u ? h2.y : h2.x;
#endif
                } else if (TV == T_Q8) {
                    const uint by = vw * 4u + (d / QK) * Q8_BYTES;
                    v = float(KV_I8(vc, by + 2u + d % QK)) * unpackHalf2x16(KV_U16(vc, by)).x;
                } else {
                    const uint by = vw * 4u + (d / QK) * Q4_BYTES, j = d % QK;
                    const uint nib = bitfieldExtract(KV_U8(vc, by + 2u + (j & 15u)), j >= 16u ? 4 : 0, 4);
                    v = (float(nib) - 8.0) * unpackHalf2x16(KV_U16(vc, by)).x;
                }
                for (uint r = 0u; r < R; r++) acc[r][k] += ss[r * BP + pos - p0] * v;
            }
        }
        barrier();
    }

    // ---- partial results of this split ----
    for (uint r = 0u; r < nr; r++) {
        const uint rg = r0 + r, i = rg / pc.n_rep, h = g * pc.n_rep + rg % pc.n_rep;
        const uint o = (split * NR + i * pc.n_head + h) * HD;
        for (uint k = 0u; k < DPT; k++) {
            const uint d = tid + 64u * k;
            if (d < HD) part[o + d] = acc[r][k];
        }
    }
    if (tid < nr) {
        const uint rg = r0 + tid, i = rg / pc.n_rep, h = g * pc.n_rep + rg % pc.n_rep;
        const uint o = pc.ml_off + (split * NR + i * pc.n_head + h) * 2u;
        part[o] = m;
        part[o + 1u] = l;
    }
}
