// y = x / rms(x) * g for one row of dim values per workgroup (x and y may be the same buffer).
// Included by rms_norm.comp (shared-memory tree sum) and rms_norm_sg.comp (WG_SUBGROUP).
layout(local_size_x = 256) in;
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer G { float g[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform PC { uint dim; float eps; } pc;

#include "wg_sum.glsl"

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint base = gl_WorkGroupID.x * pc.dim;
    float s = 0.0;
    for (uint i = lid; i < pc.dim; i += 256) {
        float v = x[base + i];
        s += v * v;
    }
    const float inv = 1.0 / sqrt(wg_sum(s) / float(pc.dim) + pc.eps);
    for (uint i = lid; i < pc.dim; i += 256) y[base + i] = x[base + i] * inv * g[i];
}
