#version 450
// attn_merge: combines the splits of attn_fused for one output row (query i =
// y, head h = x): out = sum_s e^(m_s-M) acc_s / sum_s e^(m_s-M) l_s, then the
// inverse rotation (H is its own inverse) when V is stored rotated.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint HD = 128;

layout(std430, binding = 0) readonly buffer Part { float part[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform PC {
    uint n_rows, n_split, n_head, rot_v, ml_off, o_off; // o_off: float offset of this call's first output row
    float hscale;
} pc;

shared float xs[HD];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row = gl_WorkGroupID.y * pc.n_head + gl_WorkGroupID.x;
    float mx = -3.0e38;
    for (uint s = 0u; s < pc.n_split; s++) mx = max(mx, part[pc.ml_off + (s * pc.n_rows + row) * 2u]);
    float l = 0.0;
    for (uint s = 0u; s < pc.n_split; s++) {
        const uint o = pc.ml_off + (s * pc.n_rows + row) * 2u;
        l += exp(part[o] - mx) * part[o + 1u];
    }
    const float il = 1.0 / l;
    for (uint d = tid; d < HD; d += 64u) {
        float a = 0.0;
        for (uint s = 0u; s < pc.n_split; s++)
            a += exp(part[pc.ml_off + (s * pc.n_rows + row) * 2u] - mx) * part[(s * pc.n_rows + row) * HD + d];
        xs[d] = a * il;
    }
    barrier();
    if (pc.rot_v != 0u) {
        for (uint len = 1u; len < HD; len <<= 1) {
            for (uint k = tid; k < HD / 2u; k += 64u) {
                const uint x = (k / len) * 2u * len + k % len;
                const float a = xs[x], b = xs[x + len];
                xs[x] = a + b;
                xs[x + len] = a - b;
            }
            barrier();
        }
        for (uint d = tid; d < HD; d += 64u) xs[d] *= pc.hscale;
        barrier();
    }
    for (uint d = tid; d < HD; d += 64u) o[pc.o_off + row * HD + d] = xs[d];
}
