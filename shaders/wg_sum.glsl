// Sum of one float over a 256-invocation workgroup, returned to every invocation. With
// WG_SUBGROUP (GL_KHR_shader_subgroup_arithmetic): subgroupAdd, then one shared step across
// subgroups (any subgroup size); without: a tree in shared memory. red is free again on return.
shared float red[256];

float wg_sum(float s) {
#ifdef WG_SUBGROUP
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
