#version 450
// kv_store: one workgroup per (KV head x, token y) row of K (z = 0) or V (z = 1):
// optional orthonormal Walsh-Hadamard rotation of the whole head vector, then
// the row in f32/f16/q8/q4 with the same bytes as kvq_ref_kv_store_row. Rows
// are padded to whole words, so each workgroup writes only its own words.
// With pc.rope (kvq_backend.rope_kv_store, issue 33 §3): K rows are first turned by RoPE
// (written back to the source too, as the separate rope op would leave them), and z = 2
// workgroups turn the query heads of their KV head in place, so one dispatch (and one
// barrier before attention) does what rope, rope and kv_store did in three. Pairs and
// formula as rope.comp.
#extension GL_GOOGLE_include_directive : require
#include "kv_format.glsl"

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint HD = 128; // head_dim, a multiple of 32

layout(std430, binding = 0) buffer KSrc { float ksrc[]; };
layout(std430, binding = 1) readonly buffer VSrc { float vsrc[]; };
layout(std430, binding = 2) writeonly buffer KC { uint kc[]; };
layout(std430, binding = 3) writeonly buffer VC { uint vc[]; };
layout(std430, binding = 4) readonly buffer CS { vec2 cs[]; }; // rope: (cos, sin)[token][HD/2]
layout(std430, binding = 5) buffer Q { float q[]; };           // rope: the queries, turned in place

layout(push_constant) uniform PC {
    uint n_head_kv, n_ctx, pos0; // pos0: position of token 0 of this dispatch
    uint type_k, type_v, rot_k, rot_v;
    uint kbase, vbase;           // word offset of this layer in the bound buffers
    uint krow_words, vrow_words; // padded row sizes
    float hscale;                // 1/sqrtf(HD), computed on the host as the reference does
    uint t0;                     // first source token of this dispatch
    uint rope, pairs, n_head;    // rope: turn K (and Q at z = 2) first; pairs: KVQ_ROPE_PAIRS
} pc;

shared float xs[HD];
shared uint qb[HD]; // quantized value (q8: byte, q4: nibble) per element
shared uint sc[HD / QK]; // fp16 scale bits per block

void put(bool isv, uint w, uint x) {
    if (isv)
        vc[w] = x;
    else
        kc[w] = x;
}

// xs (HD values of token row t) turned by RoPE in shared memory.
void rope_xs(uint tid, uint t) {
    const uint half_d = HD / 2u;
    for (uint i = tid; i < half_d; i += 64u) {
        vec2 r = cs[t * half_d + i];
        uint ia = pc.pairs != 0u ? 2u * i : i;
        uint ib = pc.pairs != 0u ? ia + 1u : ia + half_d;
        float a = xs[ia], b = xs[ib];
        xs[ia] = a * r.x - b * r.y;
        xs[ib] = b * r.x + a * r.y;
    }
    barrier();
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint t = gl_WorkGroupID.y, h = gl_WorkGroupID.x;
    const uint src = (pc.t0 + t) * pc.n_head_kv + h; // row of the source activations
    if (gl_WorkGroupID.z == 2u) { // the query heads h * n_rep .. that share this KV head
        const uint n_rep = pc.n_head / pc.n_head_kv;
        for (uint qh = h * n_rep; qh < (h + 1u) * n_rep; qh++) {
            const uint row = ((pc.t0 + t) * pc.n_head + qh) * HD;
            for (uint i = tid; i < HD; i += 64u) xs[i] = q[row + i];
            barrier();
            rope_xs(tid, pc.t0 + t);
            for (uint i = tid; i < HD; i += 64u) q[row + i] = xs[i];
            barrier();
        }
        return;
    }
    const bool isv = gl_WorkGroupID.z == 1u;
    const uint typ = isv ? pc.type_v : pc.type_k;
    const bool rot = (isv ? pc.rot_v : pc.rot_k) != 0u;

    for (uint i = tid; i < HD; i += 64u) xs[i] = isv ? vsrc[src * HD + i] : ksrc[src * HD + i];
    barrier();
    if (pc.rope != 0u && !isv) {
        rope_xs(tid, pc.t0 + t);
        for (uint i = tid; i < HD; i += 64u) ksrc[src * HD + i] = xs[i];
        barrier(); // read back before the rotation below rewrites xs
    }
    if (rot) { // the reference's butterfly order: exact float sums, then one scale
        for (uint len = 1u; len < HD; len <<= 1) {
            for (uint k = tid; k < HD / 2u; k += 64u) {
                uint i = (k / len) * 2u * len + (k % len);
                float a = xs[i], b = xs[i + len];
                precise float s = a + b;
                precise float d = a - b;
                xs[i] = s;
                xs[i + len] = d;
            }
            barrier();
        }
        for (uint i = tid; i < HD; i += 64u) {
            precise float y = xs[i] * pc.hscale;
            xs[i] = y;
        }
        barrier();
    }

    const uint rw = isv ? pc.vrow_words : pc.krow_words;
    const uint base = (isv ? pc.vbase : pc.kbase) + (h * pc.n_ctx + pc.pos0 + t) * rw;

    if (typ == T_F32) {
        for (uint i = tid; i < HD; i += 64u) put(isv, base + i, floatBitsToUint(xs[i]));
        return;
    }
    if (typ == T_F16) {
        for (uint w = tid; w < HD / 2u; w += 64u)
            put(isv, base + w, kv_f32_to_f16(xs[2u * w]) | (kv_f32_to_f16(xs[2u * w + 1u]) << 16));
        return;
    }

    const bool q8 = typ == T_Q8;
    if (tid < HD / QK) { // one invocation per block, scanning in the reference's order
        const uint b0 = tid * QK;
        float amax = 0.0, m = 0.0;
        for (uint j = 0u; j < QK; j++) {
            float a = abs(xs[b0 + j]);
            if (a > amax) {
                amax = a;
                m = xs[b0 + j];
            }
        }
        precise float dq = q8 ? kv_div127(amax) : m * -0.125; // m/-8 is exact either way
        dq = clamp(dq, -65504.0, 65504.0);
        const uint dh = kv_f32_to_f16(dq);
        const float id = kv_f16_to_f32(dh) != 0.0 ? kv_recip_f16(dh) : 0.0;
        sc[tid] = dh;
        for (uint j = 0u; j < QK; j++) {
            precise float v = xs[b0 + j] * id;
            float q = kv_round(v);
            q = q8 ? clamp(q, -127.0, 127.0) : clamp(q, -8.0, 7.0);
            qb[b0 + j] = q8 ? uint(int(q)) & 0xFFu : uint(int(q) + 8);
        }
    }
    barrier();

    const uint bs = q8 ? Q8_BYTES : Q4_BYTES, rb = HD / QK * bs;
    for (uint w = tid; w < rw; w += 64u) {
        uint word = 0u;
        for (uint k = 0u; k < 4u; k++) {
            const uint byte = 4u * w + k;
            uint by = 0u; // row padding
            if (byte < rb) {
                const uint blk = byte / bs, off = byte % bs;
                if (off < 2u)
                    by = (sc[blk] >> (8u * off)) & 0xFFu;
                else if (q8)
                    by = qb[blk * QK + off - 2u];
                else
                    by = qb[blk * QK + off - 2u] | (qb[blk * QK + off - 2u + QK / 2u] << 4);
            }
            word |= by << (8u * k);
        }
        put(isv, base + w, word);
    }
}
