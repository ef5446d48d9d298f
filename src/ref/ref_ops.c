/* Reference elementwise ops: RMSNorm, rotate-half RoPE, SwiGLU. */
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

/* HF convention: the head vector is split in halves (x1, x2) and rotated pairwise
 * (x1[i], x2[i]) by angle pos * inv_freq[i]. */
void kvq_ref_rope(float *x, int n, int n_heads, int head_dim, int pos0, const float *inv_freq) {
    int half = head_dim / 2;
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                double ang = (double)(pos0 + t) * inv_freq[i];
                float c = (float)cos(ang), s = (float)sin(ang);
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

void kvq_ref_swiglu(float *gate, const float *up, size_t count) {
    for (size_t i = 0; i < count; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
