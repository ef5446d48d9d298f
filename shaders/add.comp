// acc += x, elementwise.
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) buffer A { float acc[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(push_constant) uniform PC { uint count; } pc;

void main() {
    const uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += stride) acc[i] += x[i];
}
