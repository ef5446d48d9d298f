// Streaming copy of 16-byte words: kvq-bench measures the device's memory bandwidth with it.
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer S { uvec4 src[]; };
layout(binding = 1) writeonly buffer D { uvec4 dst[]; };
layout(push_constant) uniform PC { uint count; } pc;

void main() {
    const uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += stride) dst[i] = src[i];
}
