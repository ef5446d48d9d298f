// y = (x - mean(x)) / sqrt(var(x) + eps) * g for one row of dim values per workgroup (LayerNorm
// without bias); row t uses gain row t % g_rows (per-head q/k norms), x and y may be the same
// buffer. Two passes over the row as the reference does: the mean, then the variance about it.
// Included by layer_norm.comp (shared-memory tree sums) and layer_norm_sg.comp (WG_SUBGROUP).
layout(local_size_x = 256) in;
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer G { float g[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform PC { uint dim; float eps; uint g_rows, row0; } pc;

#include "wg_sum.glsl"

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint row = pc.row0 + gl_WorkGroupID.x;
    const uint base = row * pc.dim, gbase = (row % pc.g_rows) * pc.dim;
    float s = 0.0;
    for (uint i = lid; i < pc.dim; i += 256) s += x[base + i];
    const float mean = wg_sum(s) / float(pc.dim);
    float q = 0.0;
    for (uint i = lid; i < pc.dim; i += 256) {
        float d = x[base + i] - mean;
        q += d * d;
    }
    const float inv = 1.0 / sqrt(wg_sum(q) / float(pc.dim) + pc.eps);
    for (uint i = lid; i < pc.dim; i += 256) y[base + i] = (x[base + i] - mean) * inv * g[gbase + i];
}
