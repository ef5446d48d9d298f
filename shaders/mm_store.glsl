// The output step of mm_lut / mm_gather, included at the end of main() (acc, rbase, tid in
// scope). Unsplit: the final rows (scale, bias). Split over code chunks: this workgroup's
// partial sums to binding 3; with flags bit 2 the last workgroup of a row block to finish
// (a counter per row block, binding 7) adds every split's partials in split order, as
// mm_reduce does, writes the final rows to binding 6 and clears its counter for the next
// dispatch: no separate reduce pass.
{
    bool partial = (pc.flags & 2u) != 0u;
    [[unroll]] for (uint j = 0u; j < RPT; j++) {
        uint r = rbase + j * 256u;
        if (r >= pc.rows_p) continue;
        if (partial) {
            [[unroll]] for (uint t = 0u; t < NT; t++)
                if (t < pc.n) y[(gl_WorkGroupID.y * pc.n + t) * pc.rows_p + r] = acc[j * NT + t];
        } else {
            float sc = scales[pc.row0 + r];
            float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
            [[unroll]] for (uint t = 0u; t < NT; t++)
                if (t < pc.n) y[t * pc.rows_total + pc.row0 + r] = acc[j * NT + t] * sc + bv;
        }
    }
    if (partial && (pc.flags & 4u) != 0u) {
        memoryBarrierBuffer(); // this invocation's partials are visible before the count says so
        barrier();             // every invocation of the workgroup has written
        if (tid == 0u) last_wg = atomicAdd(cnt[gl_WorkGroupID.x], 1u) == gl_NumWorkGroups.y - 1u ? 1u : 0u;
        barrier();
        if (last_wg != 0u) {
            memoryBarrierBuffer(); // and the other workgroups' partials are seen here
            [[unroll]] for (uint j = 0u; j < RPT; j++) {
                uint r = rbase + j * 256u;
                if (r >= pc.rows_p) continue;
                float sc = scales[pc.row0 + r];
                float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
                [[unroll]] for (uint t = 0u; t < NT; t++) {
                    if (t >= pc.n) continue;
                    float s = 0.0;
                    for (uint k = 0u; k < gl_NumWorkGroups.y; k++) s += y[(k * pc.n + t) * pc.rows_p + r];
                    yf[t * pc.rows_total + pc.row0 + r] = s * sc + bv;
                }
            }
            if (tid == 0u) cnt[gl_WorkGroupID.x] = 0u;
        }
    }
}
