/* Scalar reference kernels: the specification every optimised kernel (SIMD,
 * GLSL) is tested against. Plain C, obvious over fast. */
#ifndef KVQ_REF_H
#define KVQ_REF_H

#include <stddef.h>
#include <stdint.h>

#include "kv_format.h"
#include "model/weights.h"

/* ---- ref_ops.c: elementwise and dense ops ---- */
void kvq_ref_rms_norm(const float *x, const float *g, float *y, int n, int dim, float eps);
/* LayerNorm without bias; row t uses gain row t % g_rows (see kvq_backend.layer_norm). */
void kvq_ref_layer_norm(const float *x, const float *g, float *y, int n, int dim, float eps, int g_rows);
/* pairs: 0 rotate-half (KVQ_ROPE_HALF), 1 interleaved (KVQ_ROPE_PAIRS). */
void kvq_ref_rope(float *x, int n, int n_heads, int head_dim, int pos0, const float *inv_freq, int pairs);
void kvq_ref_swiglu(float *gate, const float *up, size_t count);
float kvq_ref_gelu_tanh(float x);
void kvq_ref_geglu(float *gate, const float *up, size_t count);
/* acc[i] += sum_j wts[i*k+j] * src[i*k+j], rows of dim values. */
void kvq_ref_add_weighted(float *acc, const float *src, const float *wts, int n, int k, int dim);
/* Dequantizes any weight description (dense or AQLM) into W[rows][cols] f32. */
void kvq_ref_weight_dequant(const kvq_weight_desc *w, float *W);
/* One row of a weight (dense or AQLM) as f32. */
void kvq_ref_weight_row(const kvq_weight_desc *w, int row, float *out);
/* y[n][rows] = x[n][cols] · Wᵀ + bias, straight from the description (double accumulation). */
void kvq_ref_matmul(const kvq_weight_desc *w, const float *x, float *y, int n);

/* ---- ref_kv.c: KV quantization and attention ---- */
/* In-place orthonormal Walsh–Hadamard transform of n values (n a power of two). */
void kvq_ref_hadamard(float *x, int n);
/* Stores one head vector as a cache row of type t (rotating first when asked). */
void kvq_ref_kv_store_row(kvq_cache_type t, int rotate, const float *x, void *row, int head_dim);
/* Reads a cache row back to f32 values in the stored domain (no un-rotation). */
void kvq_ref_kv_load_row(kvq_cache_type t, const void *row, float *x, int head_dim);
/* Dequantize-then-attend: the spec for fused attention. Cache rows for kv head h,
 * position p are at k + (h*n_ctx + p)*row_bytes(type_k) (same for v). q and out are
 * [n][n_head*head_dim]; queries are at positions pos0..pos0+n-1. Handles rotation
 * by rotating q and un-rotating the output. */
void kvq_ref_attention(int n_head, int n_head_kv, int head_dim, float scale, int window,
                       kvq_cache_type type_k, int rotate_k, const void *k,
                       kvq_cache_type type_v, int rotate_v, const void *v, int n_ctx,
                       const float *q, float *out, int pos0, int n);

#endif
