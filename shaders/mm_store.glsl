// The output step of mm_lut / mm_gather, included at the end of main() (acc, rbase, tid in
// scope). Unsplit: the final rows (scale, bias). Split over code chunks: this workgroup's
// partial sums to binding 3; with flags bit 2 the last workgroup of a row block to finish
// (a counter per row block, binding 7) adds every split's partials in split order, as
// mm_reduce does, writes the final rows to binding 6 and clears its counter for the next
// dispatch: no separate reduce pass. MM_ADD / MM_NORM: mm_fuse.glsl.
{
    bool partial = (pc.flags & 2u) != 0u, add = (pc.flags & MM_ADD) != 0u;
    [[unroll]] for (uint j = 0u; j < RPT; j++) {
        uint r = rbase + j * 256u;
        if (r >= pc.rows_p) continue;
        if (partial) {
            [[unroll]] for (uint t = 0u; t < NT; t++)
                if (t < pc.n) y[(gl_WorkGroupID.y * pc.n + t) * pc.rows_p + r] = acc[j * NT + t];
        } else {
            float sc = scales[pc.row0 + r];
            float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
            [[unroll]] for (uint t = 0u; t < NT; t++) {
                if (t >= pc.n) continue;
                uint o = (pc.t0 + t) * pc.rows_total + pc.row0 + r;
                float v = acc[j * NT + t] * sc + bv;
                y[o] = add ? y[o] + v : v;
            }
        }
    }
    bool fin = !partial;
    if (partial && (pc.flags & 4u) != 0u) {
        memoryBarrierBuffer(); // this invocation's partials are visible before the count says so
        barrier();             // every invocation of the workgroup has written
        if (tid == 0u) last_wg = atomicAdd(cnt[gl_WorkGroupID.x], 1u) == gl_NumWorkGroups.y - 1u ? 1u : 0u;
        barrier();
        fin = last_wg != 0u;
        if (fin) {
            memoryBarrierBuffer(); // and the other workgroups' partials are seen here
            // rows inner, RB splits per batch (mm_sum.glsl): RPT * RB loads in flight per thread
            [[unroll]] for (uint t = 0u; t < NT; t++) {
                if (t >= pc.n) continue;
                float s[RPT];
                MM_SUM_SPLITS(y, RPT, rbase, 256u, t, gl_NumWorkGroups.y, pc.rows_p, pc.n, s)
                [[unroll]] for (uint j = 0u; j < RPT; j++) {
                    uint r = rbase + j * 256u;
                    if (r >= pc.rows_p) continue;
                    float bv = (pc.flags & 1u) != 0u ? bias[pc.row0 + r] : 0.0;
                    uint o = (pc.t0 + t) * pc.rows_total + pc.row0 + r;
                    float v = s[j] * scales[pc.row0 + r] + bv;
                    yf[o] = add ? yf[o] + v : v;
                }
            }
            if (tid == 0u) cnt[gl_WorkGroupID.x] = 0u;
        }
    }
    if ((pc.flags & MM_NORM) != 0u) mm_norm_tail(fin, partial);
}
