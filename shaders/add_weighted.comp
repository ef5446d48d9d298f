// acc[i][c] += sum_j wts[i*k + j] * src[i*k + j][c] for rows i < n of dim values (combining
// the k experts a token went through), the terms added in j order as the reference does.
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) buffer A { float acc[]; };
layout(binding = 1) readonly buffer S { float src[]; };
layout(binding = 2) readonly buffer W { float wts[]; };
layout(push_constant) uniform PC { uint n, k, dim; } pc;

void main() {
    const uint total = pc.n * pc.dim;
    const uint stride = gl_NumWorkGroups.x * 256;
    for (uint idx = gl_GlobalInvocationID.x; idx < total; idx += stride) {
        uint i = idx / pc.dim, c = idx - i * pc.dim;
        float a = acc[idx];
        for (uint j = 0u; j < pc.k; j++) a += wts[i * pc.k + j] * src[(i * pc.k + j) * pc.dim + c];
        acc[idx] = a;
    }
}
