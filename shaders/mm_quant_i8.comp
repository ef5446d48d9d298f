#version 450
// Activations of an int8-tile matmul (mm_tile_i8.comp): token t's values in blocks of
// 256, each block as int8 q = round(x * 127 / max|x_b|) packed four to a word (byte i =
// column 4w + i, the layout OpSDot reads), and its scale max|x_b| / 127. Columns past
// cols are zero, so the tiles need no bounds on k. One workgroup per (block, token);
// invocation i owns columns 4i..4i+3 of the block. A block holding a NaN or an infinity
// gets a NaN scale and zero q: its outputs become NaN, as the f32 tiles' would.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Q { uint xq[]; }; // [n][nb * 64] words
layout(std430, binding = 2) writeonly buffer S { float sa[]; }; // [n][nb]

layout(push_constant) uniform PC {
    uint cols, n, nb;
} pc;

shared float red[64];
shared uint bad_any;

void main() {
    uint tid = gl_LocalInvocationID.x, b = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint k = b * 256u + 4u * tid;
    float v[4];
    float mx = 0.0;
    bool bad = false;
    if (tid == 0u) bad_any = 0u;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        v[i] = k + i < pc.cols ? x[t * pc.cols + k + i] : 0.0;
        bad = bad || isnan(v[i]) || isinf(v[i]);
        mx = max(mx, abs(v[i]));
    }
    red[tid] = mx;
    barrier();
    if (bad) atomicOr(bad_any, 1u);
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] = max(red[tid], red[tid + s]);
        barrier();
    }
    mx = red[0];
    bool nan_block = bad_any != 0u;
    float inv = mx > 0.0 ? 127.0 / mx : 0.0;
    uint word = 0u;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        int q = nan_block ? 0 : int(roundEven(clamp(v[i] * inv, -127.0, 127.0)));
        word |= (uint(q) & 0xffu) << (8u * i);
    }
    xq[t * pc.nb * 64u + b * 64u + tid] = word;
    if (tid == 0u) sa[t * pc.nb + b] = nan_block ? uintBitsToFloat(0x7fc00000u) : mx / 127.0;
}
