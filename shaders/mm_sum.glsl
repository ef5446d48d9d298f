// The split reduce's serial tail, shared by mm_store.glsl (last workgroup) and mm_reduce.comp.
// Why batches: the partials of a row are independent loads, but a loop bounded at run time
// with `s += part[k]` lets a GPU compiler issue one load, wait for it (an L2 round trip,
// ~0.5-1 us), add, then issue the next: nsplit round trips per row, in series. Here RB
// loads of every row a thread owns (rows inner) are issued together into registers, then
// added in split order, so a batch costs one round trip and a row at most MM_SPLIT_MAX / RB
// (the host caps the splits, vk_matmul.c). The sum order per row stays k = 0, 1, 2, ...
// (results equal the one-at-a-time loop's; adding the +0.0 of a missing split changes nothing).
const uint MM_RB = 8u; // partials per row in flight

// s[j] = sum over k < nsplit of P(k, t, rows r0 + j*rstep), for the rows below rows_p.
#define MM_SUM_SPLITS(P, NR, r0, rstep, t, nsplit, rows_p, n_tok, s)                        \
    {                                                                                       \
        [[unroll]] for (uint j_ = 0u; j_ < (NR); j_++) s[j_] = 0.0;                         \
        for (uint k0_ = 0u; k0_ < (nsplit); k0_ += MM_RB) {                                 \
            float v_[MM_RB * (NR)];                                                         \
            [[unroll]] for (uint i_ = 0u; i_ < MM_RB; i_++)                                 \
                [[unroll]] for (uint j_ = 0u; j_ < (NR); j_++) {                            \
                    uint r_ = (r0) + j_ * (rstep), k_ = k0_ + i_;                           \
                    v_[i_ * (NR) + j_] = (k_ < (nsplit) && r_ < (rows_p))                   \
                        ? P[(k_ * (n_tok) + (t)) * (rows_p) + r_] : 0.0;                   \
                }                                                                           \
            [[unroll]] for (uint i_ = 0u; i_ < MM_RB; i_++)                                 \
                [[unroll]] for (uint j_ = 0u; j_ < (NR); j_++) s[j_] += v_[i_ * (NR) + j_]; \
        }                                                                                   \
    }
