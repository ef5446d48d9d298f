// y = (x - mean(x)) / sqrt(var(x) + eps) * g for one row of dim values per workgroup (LayerNorm
// without bias); row t uses gain row t % g_rows (per-head q/k norms), x and y may be the same
// buffer. Two passes over the row as the reference does: the mean, then the variance about it.
// Included by layer_norm.comp (shared-memory tree sums) and layer_norm_sg.comp (LN_SUBGROUP:
// subgroupAdd, then one shared step across subgroups; any subgroup size).
layout(local_size_x = 256) in;
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer G { float g[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform PC { uint dim; float eps; uint g_rows, row0; } pc;

shared float red[256];

// Sum of s over the workgroup, returned to every invocation (red is free again on return).
float wg_sum(float s) {
#ifdef LN_SUBGROUP
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
    const uint lid = gl_LocalInvocationID.x;
    red[lid] = s;
    barrier();
    for (uint st = 128; st > 0; st >>= 1) {
        if (lid < st) red[lid] += red[lid + st];
        barrier();
    }
#endif
    float total = red[0];
    barrier();
    return total;
}

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
