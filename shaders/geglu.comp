// gate = gelu_tanh(gate) * up, elementwise (GeGLU; GELU with the tanh approximation).
#version 450
layout(local_size_x = 256) in;
layout(binding = 0) buffer G { float g[]; };
layout(binding = 1) readonly buffer U { float u[]; };
layout(push_constant) uniform PC { uint count; } pc;

void main() {
    const uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += stride) {
        float v = g[i];
        float a = 0.7978845608 * (v + 0.044715 * v * v * v); // sqrt(2/pi) (v + 0.044715 v^3)
        // tanh from exp(-2|a|): no inf/inf for large |a| (a driver's tanh may form exp(2a))
        float e = exp(-2.0 * abs(a));
        float t = sign(a) * (1.0 - e) / (1.0 + e);
        g[i] = 0.5 * v * (1.0 + t) * u[i];
    }
}
