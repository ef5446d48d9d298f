// In-place RoPE on x[n][n_heads][head_dim]; cs[t][i] = (cos, sin) of (pos0 + t)·inv_freq[i],
// computed on the host in double precision. Pair i is (i, i + head_dim/2) (rotate-half), or
// (2i, 2i+1) when pairs is set (Cohere's interleaved rope).
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer CS { vec2 cs[]; };
layout(push_constant) uniform PC { uint n, n_heads, head_dim, pairs; } pc;

void main() {
    const uint half_d = pc.head_dim / 2;
    const uint total = pc.n * pc.n_heads * half_d;
    const uint stride = gl_NumWorkGroups.x * 256;
    for (uint idx = gl_GlobalInvocationID.x; idx < total; idx += stride) {
        uint i = idx % half_d;
        uint th = idx / half_d; // token * n_heads + head
        uint t = th / pc.n_heads;
        vec2 r = cs[t * half_d + i];
        uint base = th * pc.head_dim;
        uint ia = pc.pairs != 0 ? base + 2 * i : base + i;
        uint ib = pc.pairs != 0 ? ia + 1 : ia + half_d;
        float a = x[ia], b = x[ib];
        x[ia] = a * r.x - b * r.y;
        x[ib] = b * r.x + a * r.y;
    }
}
