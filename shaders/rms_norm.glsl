// y = x / rms(x) * g for one row of dim values per workgroup (x and y may be the same buffer).
// Included by rms_norm.comp (shared-memory tree sum) and rms_norm_sg.comp (RMS_SUBGROUP:
// subgroupAdd, then one shared step across subgroups; any subgroup size).
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
#ifdef RMS_SUBGROUP
    s = subgroupAdd(s);
    if (subgroupElect()) red[gl_SubgroupID] = s;
    barrier();
    if (gl_SubgroupID == 0u) { // subgroup 0 sums the per-subgroup partials (there may be more than its size)
        float t = 0.0;
        for (uint j = gl_SubgroupInvocationID; j < gl_NumSubgroups; j += gl_SubgroupSize) t += red[j];
        t = subgroupAdd(t);
        if (subgroupElect()) red[0] = t;
    }
    barrier();
#else
    red[lid] = s;
    barrier();
    for (uint st = 128; st > 0; st >>= 1) {
        if (lid < st) red[lid] += red[lid + st];
        barrier();
    }
#endif
    const float inv = 1.0 / sqrt(red[0] / float(pc.dim) + pc.eps);
    for (uint i = lid; i < pc.dim; i += 256) y[base + i] = x[base + i] * inv * g[i];
}
