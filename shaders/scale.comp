// x *= s, elementwise.
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) buffer X { float x[]; };
layout(push_constant) uniform PC { uint count; float s; } pc;

void main() {
    const uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += stride) x[i] *= pc.s;
}
