// gate = silu(gate) * up, elementwise.
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) buffer G { float g[]; };
layout(binding = 1) readonly buffer U { float u[]; };
layout(push_constant) uniform PC { uint count; } pc;

void main() {
    const uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += stride) {
        float v = g[i];
        g[i] = v / (1.0 + exp(-v)) * u[i];
    }
}
