// Optional work the AQLM matvecs (mm_lut, mm_gather) fold in so a decode layer takes fewer
// dispatches and barriers (issue 33 §3; host side src/vulkan/vk_fuse.c). Included after the
// shader's bindings and push constants; flags bits:
//   MM_ADD  the final rows are added to what the output holds (the residual stream: x += o·W)
//   MM_NORM the workgroup that finishes last over the whole dispatch (a counter past the row
//           blocks' in binding 7) writes hn = rms_norm(output rows)·gain (the next layer's
//           norm), so no norm dispatch and barrier follow
//   MM_GLU  x is staged as act(x)·up (swiglu; with MM_GELU geglu) with the expressions of
//           swiglu.comp / geglu.comp: the down projection reads the gate and up rows directly
const uint MM_ADD = 8u, MM_NORM = 16u, MM_GLU = 32u, MM_GELU = 64u;

layout(std430, binding = 8) readonly buffer Up { float up[]; };    // MM_GLU: the up projection's rows
layout(std430, binding = 9) readonly buffer Gain { float gain[]; }; // MM_NORM: the norm's gains
layout(std430, binding = 10) writeonly buffer HN { float hn[]; };   // MM_NORM: the normed rows

float mm_x(uint i) {
    float v = x[i];
    if ((pc.flags & MM_GLU) == 0u) return v;
    if ((pc.flags & MM_GELU) == 0u) return v / (1.0 + exp(-v)) * up[i];
    float a = 0.7978845608 * (v + 0.044715 * v * v * v);
    float e = exp(-2.0 * abs(a));
    float th = sign(a) * (1.0 - e) / (1.0 + e);
    return 0.5 * v * (1.0 + th) * up[i];
}

shared float mm_red[64];
shared uint mm_last_all;

// Row t's final value i (written by any workgroup of this dispatch: y unsplit, yf split).
float mm_final(bool partial, uint i) { return partial ? yf[i] : y[i]; }

// After this workgroup wrote final rows (fin, the same in the whole workgroup): the last one
// of the dispatch to do so norms every token's output row. eps is the push constant pc.eps.
void mm_norm_tail(bool fin, bool partial) {
    if (!fin) return;
    uint tid = gl_LocalInvocationID.x, slot = gl_NumWorkGroups.x;
    memoryBarrierBuffer(); // this workgroup's final rows are visible before the count says so
    barrier();
    if (tid == 0u) mm_last_all = atomicAdd(cnt[slot], 1u) == gl_NumWorkGroups.x - 1u ? 1u : 0u;
    barrier();
    if (mm_last_all == 0u) return;
    memoryBarrierBuffer(); // the other workgroups' rows are seen here
    uint dim = pc.rows_total;
    for (uint t = 0u; t < pc.n; t++) {
        float s = 0.0;
        for (uint i = tid; i < dim; i += 256u) {
            float v = mm_final(partial, (pc.t0 + t) * dim + i);
            s += v * v;
        }
        // 256 -> 64 partial sums in four rounds, then a tree: no more shared memory than 64 floats
        [[unroll]] for (uint q = 0u; q < 4u; q++) {
            if (tid / 64u == q) mm_red[tid % 64u] = q == 0u ? s : mm_red[tid % 64u] + s;
            barrier();
        }
        for (uint st = 32u; st > 0u; st >>= 1) {
            if (tid < st) mm_red[tid] += mm_red[tid + st];
            barrier();
        }
        float inv = 1.0 / sqrt(mm_red[0] / float(dim) + pc.eps);
        barrier(); // everyone read mm_red[0] before the next token's rounds
        for (uint i = tid; i < dim; i += 256u) hn[(pc.t0 + t) * dim + i] = mm_final(partial, (pc.t0 + t) * dim + i) * inv * gain[i];
    }
    if (tid == 0u) cnt[slot] = 0u;
}
