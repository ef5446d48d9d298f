// Shared helpers of the matmul / get_rows shaders (baseline: everything is read
// as 32-bit words, nothing optional is needed).
//
// Weight formats (spec constant FMT): 0 f32, 1 f16, 2 bf16 (dense, rows padded to a
// multiple of 8 values with zeros), 3 AQLM. AQLM codes are repacked at upload (see
// src/vulkan/vk_weights.c): a row's codes (g*M + m order, already reduced mod
// 2^nbits) are cut into 16-byte chunks (16 8-bit or 8 16-bit codes); a piece stores
// chunk c of row r at 16-byte block c*rows_p + r, so invocations that take
// consecutive rows read consecutive blocks.
// [[unroll]]: a SPIR-V loop-control hint (no device feature). Private arrays indexed by
// a loop counter must stay in registers; a loop left rolled turns them into scratch
// memory (slow on GPUs, and per-lane gathers on lavapipe).
#extension GL_EXT_control_flow_attributes : require

#define FMT_F32 0u
#define FMT_F16 1u
#define FMT_BF16 2u
#define FMT_AQLM 3u

// Eight consecutive values starting at value index e (a multiple of 8) of a dense
// array in format fmt, read from uint words.
#define DENSE8(W, fmt, e, v)                                                        \
    {                                                                               \
        if ((fmt) == FMT_F32) {                                                     \
            [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++) v[i_] = uintBitsToFloat(W[(e) + i_]); \
        } else {                                                                    \
            uint b_ = (e) >> 1;                                                     \
            [[unroll]] for (uint i_ = 0u; i_ < 4u; i_++) {                                     \
                uint w_ = W[b_ + i_];                                               \
                if ((fmt) == FMT_F16) {                                             \
                    vec2 h_ = unpackHalf2x16(w_);                                   \
                    v[2u * i_] = h_.x;                                              \
                    v[2u * i_ + 1u] = h_.y;                                         \
                } else {                                                            \
                    v[2u * i_] = uintBitsToFloat(w_ << 16);                         \
                    v[2u * i_ + 1u] = uintBitsToFloat(w_ & 0xffff0000u);            \
                }                                                                   \
            }                                                                       \
        }                                                                           \
    }

// Code q (index g*M + m within row r) of a repacked AQLM piece with rows_p rows;
// cs = bytes per code (1 or 2).
#define AQLM_CODE(C, cs, rows_p, r, q, out)                                       \
    {                                                                             \
        uint per_ = 16u / (cs);                                                   \
        uint c_ = (q) / per_, p_ = (q) % per_;                                    \
        uint word_ = (c_ * (rows_p) + (r)) * 4u + (p_ * (cs)) / 4u;               \
        out = bitfieldExtract(C[word_], int(((p_ * (cs)) % 4u) * 8u), int((cs) * 8u)); \
    }

// Eight values j0..j0+7 of weight row r, group g of an AQLM piece, without the row
// scale: sum over m of codebook m's codeword. CB is the codebook as uint words
// (fp16 [M][2^NB][IG]).
#define AQLM_DEQ8(C, CB, M_, NB, IG_, cs, rows_p, r, g, j0, v)                    \
    {                                                                             \
        [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++) v[i_] = 0.0;                             \
        [[unroll]] for (uint m_ = 0u; m_ < (M_); m_++) {                                     \
            uint code_;                                                           \
            AQLM_CODE(C, cs, rows_p, r, (g) * (M_) + m_, code_)                   \
            uint base_ = (((m_ << (NB)) + code_) * (IG_) + (j0)) >> 1;            \
            [[unroll]] for (uint i_ = 0u; i_ < 4u; i_++) {                                   \
                vec2 h_ = unpackHalf2x16(CB[base_ + i_]);                         \
                v[2u * i_] += h_.x;                                               \
                v[2u * i_ + 1u] += h_.y;                                          \
            }                                                                     \
        }                                                                         \
    }
