// KV cache rows as the shaders see them: the bytes of src/kv_format.h (and
// src/ref/ref_kv.c) read and written as uint words, plus the exact integer
// arithmetic the store needs to produce those bytes bit for bit: GLSL division
// and packHalf2x16 rounding are implementation-defined, the reference's are
// IEEE round-to-nearest-even, so they are done here on the bits.

const uint T_F32 = 0u, T_F16 = 1u, T_Q8 = 2u, T_Q4 = 3u; // kvq_cache_type
const uint QK = 32u;                                     // values per block
const uint Q8_BYTES = 34u, Q4_BYTES = 18u;               // bytes per block

// The 16-bit word at an even byte offset of a word array.
#define KV_U16(buf, byte) bitfieldExtract((buf)[(byte) >> 2], int(((byte) & 2u) * 8u), 16)
// Byte at any offset, signed (q8) or unsigned.
#define KV_I8(buf, byte) bitfieldExtract(int((buf)[(byte) >> 2]), int(((byte) & 3u) * 8u), 8)
#define KV_U8(buf, byte) bitfieldExtract((buf)[(byte) >> 2], int(((byte) & 3u) * 8u), 8)
// Four bytes starting at an even byte offset (one word, or the halves of two).
#define KV_W4(buf, byte) \
    (((byte) & 2u) == 0u ? (buf)[(byte) >> 2] : (((buf)[(byte) >> 2] >> 16) | ((buf)[((byte) >> 2) + 1u] << 16)))

// Rotated K cache (Walsh-Hadamard per head, src/kv_format.h): the query rows in
// shared memory get the same rotation and scale, in place. ROWS rows of HD
// values in the shared array S, invocation TID of WG; ends with a barrier.
#define KV_ROTATE_ROWS(S, ROWS, HD, TID, WG, HSCALE)                              \
    {                                                                             \
        for (uint len_ = 1u; len_ < (HD); len_ <<= 1) {                           \
            for (uint k_ = (TID); k_ < (ROWS) * (HD) / 2u; k_ += (WG)) {          \
                const uint r_ = k_ / ((HD) / 2u), kk_ = k_ % ((HD) / 2u);         \
                const uint x_ = r_ * (HD) + (kk_ / len_) * 2u * len_ + kk_ % len_; \
                const float a_ = S[x_], b_ = S[x_ + len_];                        \
                S[x_] = a_ + b_;                                                  \
                S[x_ + len_] = a_ - b_;                                           \
            }                                                                     \
            barrier();                                                            \
        }                                                                         \
        for (uint x_ = (TID); x_ < (ROWS) * (HD); x_ += (WG)) S[x_] *= (HSCALE);  \
        barrier();                                                                \
    }

// f32 -> fp16 bits, round to nearest even: the same steps as kvq_f32_to_f16 (src/util.c).
uint kv_f32_to_f16(float f) {
    uint u = floatBitsToUint(f);
    uint sgn = (u >> 16) & 0x8000u;
    uint ex = (u >> 23) & 0xFFu, man = u & 0x7FFFFFu;
    if (ex == 0xFFu) return sgn | 0x7C00u | (man != 0u ? 0x200u : 0u);
    int e = int(ex) - 127 + 15;
    if (e >= 31) return sgn | 0x7C00u;
    if (e <= 0) {
        if (e < -10) return sgn;
        man |= 0x800000u;
        uint sh = uint(14 - e);
        uint h = man >> sh, rem = man & ((1u << sh) - 1u), hf = 1u << (sh - 1u);
        if (rem > hf || (rem == hf && (h & 1u) != 0u)) h++;
        return sgn | h;
    }
    uint h = (uint(e) << 10) | (man >> 13), rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++; // may carry into the exponent: still right
    return sgn | h;
}

// fp16 bits -> f32, exact (subnormals included), without relying on unpackHalf2x16.
float kv_f16_to_f32(uint h) {
    uint sgn = (h & 0x8000u) << 16;
    uint ex = (h >> 10) & 31u, man = h & 1023u;
    if (ex == 31u) return uintBitsToFloat(sgn | 0x7F800000u | (man << 13));
    if (ex == 0u) {
        if (man == 0u) return uintBitsToFloat(sgn);
        int s = 10 - findMSB(man); // normalise the leading bit to bit 10
        man = (man << uint(s)) & 1023u;
        return uintBitsToFloat(sgn | (uint(1 - s + 112) << 23) | (man << 13));
    }
    return uintBitsToFloat(sgn | ((ex + 112u) << 23) | (man << 13));
}

// 1/d rounded to nearest even f32, d the finite nonzero fp16 of bits dh:
// long division of 2^35 by d's 11-bit significand, then one rounding.
float kv_recip_f16(uint dh) {
    uint sgn = (dh & 0x8000u) << 16;
    uint ex = (dh >> 10) & 31u, m = dh & 1023u;
    int e2 = -24; // d = m * 2^e2
    if (ex != 0u) {
        m |= 1024u;
        e2 = int(ex) - 25;
    }
    int s = 10 - findMSB(m);
    m <<= uint(s);
    e2 -= s; // m in [1024, 2047]
    uint q1 = 0x80000000u / m, r1 = 0x80000000u % m;
    uint q2 = (r1 << 4) / m, r2 = (r1 << 4) % m;
    uint q = (q1 << 4) | q2; // floor(2^35 / m), in [2^24, 2^25]
    uint keep = q >> 1;
    if ((q & 1u) != 0u && (r2 != 0u || (keep & 1u) != 0u)) keep++;
    int e = -11 - e2; // 1/d = keep * 2^(-34-e2), keep ~ 2^23
    if (keep >= 0x1000000u) {
        keep >>= 1;
        e += 1;
    }
    return uintBitsToFloat(sgn | (uint(e + 127) << 23) | (keep & 0x7FFFFFu));
}

// a/127 rounded to nearest even f32, for a >= 0. Results below the f32 normal
// range come back as 0: they round to an fp16 scale of 0 either way.
float kv_div127(float a) {
    uint u = floatBitsToUint(a);
    uint ex = (u >> 23) & 0xFFu;
    if (ex == 0u) return 0.0;
    if (ex == 0xFFu) return a;
    uint n = ((u & 0x7FFFFFu) | 0x800000u) << 8; // a = n * 2^(ex-158)
    uint q = n / 127u, r = n % 127u;           // 25 or 26 bits
    uint drop = uint(findMSB(q) + 1 - 24);
    uint keep = q >> drop, rem = q & ((1u << drop) - 1u), hf = 1u << (drop - 1u);
    if (rem > hf || (rem == hf && (r != 0u || (keep & 1u) != 0u))) keep++;
    if (keep >= 0x1000000u) {
        keep >>= 1;
        drop++;
    }
    int e = 23 + int(drop) + int(ex) - 158;
    if (e < -126) return 0.0;
    return uintBitsToFloat((uint(e + 127) << 23) | (keep & 0x7FFFFFu));
}

// roundf: half away from zero (GLSL round() leaves halves to the implementation).
float kv_round(float v) {
    float t = trunc(v);
    return abs(v - t) >= 0.5 ? t + sign(v) : t;
}
