/* Reference elementwise ops: RMSNorm, LayerNorm, RoPE (both pairings), SwiGLU, GeGLU, the MoE combine. */
#include <math.h>

#include "ref/ref.h"

void kvq_ref_rms_norm(const float *x, const float *g, float *y, int n, int dim, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * dim;
        float *yr = y + (size_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) yr[i] = xr[i] * inv * g[i];
    }
}

/* Pair i of a head is (i, i + head_dim/2) in HF's rotate_half convention, (2i, 2i+1) in
 * Cohere's interleaved one; either way it turns by angle pos * inv_freq[i]. */
void kvq_ref_rope(float *x, int n, int n_heads, int head_dim, int pos0, const float *inv_freq, int pairs) {
    int half = head_dim / 2;
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                double ang = (double)(pos0 + t) * inv_freq[i];
                float c = (float)cos(ang), s = (float)sin(ang);
                int i0 = pairs ? 2 * i : i, i1 = pairs ? 2 * i + 1 : i + half;
                float a = v[i0], b = v[i1];
                v[i0] = a * c - b * s;
                v[i1] = b * c + a * s;
            }
        }
    }
}

void kvq_ref_layer_norm(const float *x, const float *g, float *y, int n, int dim, float eps, int g_rows) {
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * dim, *gr = g + (size_t)(t % g_rows) * dim;
        float *yr = y + (size_t)t * dim;
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++) mean += xr[i];
        mean /= dim;
        for (int i = 0; i < dim; i++) var += (xr[i] - mean) * (xr[i] - mean);
        float inv = (float)(1.0 / sqrt(var / dim + eps));
        for (int i = 0; i < dim; i++) yr[i] = (float)(xr[i] - mean) * inv * gr[i];
    }
}

/* GELU, tanh approximation (PyTorch's approximate="tanh", HF's gelu_pytorch_tanh). */
float kvq_ref_gelu_tanh(float x) {
    const double k = 0.7978845608028654; /* sqrt(2/pi) */
    return (float)(0.5 * x * (1.0 + tanh(k * (x + 0.044715 * (double)x * x * x))));
}

void kvq_ref_geglu(float *gate, const float *up, size_t count) {
    for (size_t i = 0; i < count; i++) gate[i] = kvq_ref_gelu_tanh(gate[i]) * up[i];
}

void kvq_ref_add_weighted(float *acc, const float *src, const float *wts, int n, int k, int dim) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++)
            for (int c = 0; c < dim; c++) acc[(size_t)i * dim + c] += wts[i * k + j] * src[((size_t)i * k + j) * dim + c];
}

void kvq_ref_swiglu(float *gate, const float *up, size_t count) {
    for (size_t i = 0; i < count; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
