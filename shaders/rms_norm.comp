// y = x / rms(x) * g for one row of dim values per workgroup (x and y may be the same buffer).
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer G { float g[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform PC { uint dim; float eps; } pc;

shared float red[256];

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint base = gl_WorkGroupID.x * pc.dim;
    float s = 0.0;
    for (uint i = lid; i < pc.dim; i += 256) {
        float v = x[base + i];
        s += v * v;
    }
    red[lid] = s;
    barrier();
    for (uint st = 128; st > 0; st >>= 1) {
        if (lid < st) red[lid] += red[lid + st];
        barrier();
    }
    const float inv = 1.0 / sqrt(red[0] / float(pc.dim) + pc.eps);
    for (uint i = lid; i < pc.dim; i += 256) y[base + i] = x[base + i] * inv * g[i];
}
