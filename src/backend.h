/* The backend contract: everything the model graph asks of a compute device.
 *
 * A backend owns all memory the forward pass touches (weights, activations,
 * KV cache) behind opaque handles; the core never dereferences them. Ops are
 * issued in order and a backend may only record them (a GPU backend builds a
 * command buffer); results become visible to the host at buf_read, the single
 * sync point per forward. Ops cannot fail individually: a backend remembers
 * its first error and reports it from the next buf_read (or flush), then
 * forgets it. Host pointers passed to any entry are only read during the call
 * unless the entry says otherwise.
 *
 * Limits of one backend (head sizes, buffer sizes, formats) stay in that
 * backend: it rejects what it cannot run in init, weight_supported/
 * weight_upload or kv_new, with a message naming the limit.
 *
 * Activations are row-major f32 matrices [n tokens][width]. Sizes and offsets
 * are in bytes unless named count/n. */
#ifndef KVQ_BACKEND_H
#define KVQ_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kvq.h"
#include "model/weights.h"

typedef struct kvq_bctx kvq_bctx;   /* one backend instance (device, queues, threads) */
typedef struct kvq_buf kvq_buf;     /* device buffer for activations */
typedef struct kvq_wt kvq_wt;       /* an uploaded weight, in the backend's own layout */
typedef struct kvq_kvbuf kvq_kvbuf; /* KV cache storage for all layers */

typedef struct {
    int n_threads;      /* CPU threads (0: all cores); a GPU backend uses them for host work */
    const char *device; /* device index ("1") or part of its name; NULL/"": the backend's best */
    int allow_software; /* 0: refuse software devices (llvmpipe/lavapipe) when device is not named */
    int aqlm_cb8;       /* kvq_model_params.aqlm_cb8: the CPU passes it on as kvq_weight_desc.cb8; others ignore it */
    int aqlm_lut8;      /* kvq_model_params.aqlm_lut8: the CPU passes it on as kvq_weight_desc.lut8; others ignore it */
    int aqlm_i8;        /* kvq_model_params.aqlm_i8: the CPU passes it on as kvq_weight_desc.i8; others ignore it */
    int exact;          /* kvq_model_params.exact: the CPU passes it on as kvq_weight_desc.exact; Vulkan: no fp16 lookup tables */
} kvq_backend_opts;

/* Shape and storage of a KV cache. Row (layer l, kv head h, position p) holds
 * head_dim values of K (after RoPE) or V in type_k / type_v (see kv_format.h). */
typedef struct {
    int n_layer, n_ctx, n_head_kv, head_dim;
    kvq_cache_type type_k, type_v;
    int rotate_k, rotate_v; /* Hadamard-rotate rows before storing */
    int n_head;             /* query heads attending to it (a multiple of n_head_kv), so a GPU backend can build
                               its attention pipelines with the cache; 0: unknown (built at first use) */
} kvq_kv_desc;

/* One attention call: n_head query heads share KV head h*n_head_kv/n_head (GQA). */
typedef struct {
    int n_head, n_head_kv, head_dim;
    float scale;  /* usually 1/sqrt(head_dim) */
    int window;   /* sliding window, 0 = none: query at i sees key at j iff j <= i and i - j < window */
} kvq_attn_desc;

/* Which values of a head vector RoPE rotates together (kvq_backend.rope). */
enum { KVQ_ROPE_HALF = 0, KVQ_ROPE_PAIRS = 1 };

typedef struct kvq_backend {
    const char *name; /* "cpu", "vulkan" */
    /* 1: weights may stay references into the checkpoint mapping (the model keeps it mapped);
     * 0: weight_upload copies everything, so the model unmaps the checkpoint after loading. */
    int weights_in_place;
    /* 1: weight_upload and weight_bytes may run on several threads at once (the loader then
     * uploads layers in parallel, each upload on one thread). */
    int parallel_upload;
    /* Most token rows of one forward it computes each bit for bit as a one-token decode
     * (speculative verifies and server steps stay within it: kvq_model_exact_rows). */
    int exact_rows;

    /* ---- lifecycle ---- */
    /* Creates an instance; fails (with kvq_fail, one line naming the reason:
     * no loader, no device, device N not found...) when it cannot run here. */
    kvq_status (*init)(const kvq_backend_opts *opts, kvq_bctx **out);
    /* Frees the instance; every buffer/weight/cache made from it must be freed first. */
    void (*release)(kvq_bctx *b);
    /* (All *_free functions below accept NULL.) */
    /* One-line description of the device, e.g. "cpu: 2 threads, avx512". */
    const char *(*describe)(kvq_bctx *b);

    /* ---- buffers ---- */
    kvq_buf *(*buf_new)(kvq_bctx *b, size_t bytes);         /* NULL + kvq_fail on failure */
    void (*buf_free)(kvq_bctx *b, kvq_buf *buf);
    /* Host -> device, ordered with the ops issued so far; src has been copied when it returns. */
    void (*buf_write)(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n);
    /* Device -> host; waits for all issued ops (the sync point) and reports their first error. */
    kvq_status (*buf_read)(kvq_bctx *b, const kvq_buf *src, size_t off, void *dst, size_t n);

    /* ---- weights ---- */
    /* Optional: can this backend run weights of this description? (NULL: all). */
    int (*weight_supported)(kvq_bctx *b, const kvq_weight_desc *d);
    /* Makes a checkpoint weight runnable. The desc's pointers point into the checkpoint
     * mapping, which the model keeps for its own lifetime: a backend may keep referencing
     * them (the CPU runs weights in place) or copy/repack (a GPU uploads). The desc struct
     * itself is only read during the call. NULL + kvq_fail (naming d->name) on failure. */
    kvq_wt *(*weight_upload)(kvq_bctx *b, const kvq_weight_desc *d);
    void (*weight_free)(kvq_bctx *b, kvq_wt *w);
    /* Bytes the weight occupies in this backend's layout (what one full pass reads). */
    size_t (*weight_bytes)(kvq_bctx *b, const kvq_wt *w);

    /* ---- KV cache ---- */
    kvq_kvbuf *(*kv_new)(kvq_bctx *b, const kvq_kv_desc *d); /* NULL + kvq_fail on failure */
    /* Bytes a cache of desc d takes for its first `positions` positions (all layers, K and V),
     * in this backend's layout (a GPU may pad rows or keep scales apart). */
    size_t (*kv_bytes)(kvq_bctx *b, const kvq_kv_desc *d, int positions);
    void (*kv_free)(kvq_bctx *b, kvq_kvbuf *kv);
    /* Optional (NULL: no KV sessions on disk): rows of positions [pos0, pos0+n) of every KV head
     * of one layer's K (v = 0) or V (v = 1), between the cache and host memory, in the stored
     * format without the backend's padding: [kv head][position] rows of
     * kvq_kv_row_bytes(type, head_dim) bytes. kv_read waits for the ops issued before it;
     * kv_write is ordered with them. */
    kvq_status (*kv_read)(kvq_bctx *b, const kvq_kvbuf *kv, int layer, int v, int pos0, int n, void *dst);
    kvq_status (*kv_write)(kvq_bctx *b, kvq_kvbuf *kv, int layer, int v, int pos0, int n, const void *src);

    /* ---- ops (issued in order; n = token rows) ---- */
    /* out[i] = row ids[i] of w (embedding lookup); ids are copied at issue time. */
    void (*get_rows)(kvq_bctx *b, const kvq_wt *w, const int32_t *ids, int n, kvq_buf *out);
    /* y[n][w.rows] = x[n][w.cols] · Wᵀ (+ bias). Dense or AQLM, whatever w holds. */
    void (*matmul)(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n);
    /* y = x / rms(x) * g, per row of dim values; x and y may alias. */
    void (*rms_norm)(kvq_bctx *b, const kvq_buf *x, const kvq_wt *g, kvq_buf *y, int n, int dim, float eps);
    /* In-place RoPE on x[n][n_heads*head_dim] at positions pos0.. ; inv_freq: head_dim/2 host
     * floats, the same array for the life of the model (a backend may form cos/sin tables on the
     * host in double precision: float angles are far off at long positions). mode says which
     * values pair up: KVQ_ROPE_HALF (i, i+head_dim/2), HF's rotate_half (Llama, Mistral, Gemma,
     * Phi-3, Qwen2...), or KVQ_ROPE_PAIRS (2i, 2i+1), Cohere's interleaved pairs; pair i always
     * turns by angle pos * inv_freq[i]. */
    void (*rope)(kvq_bctx *b, kvq_buf *x, int n, int n_heads, int head_dim, int pos0, const float *inv_freq, int mode);
    /* gate = silu(gate) * up, over count values. */
    void (*swiglu)(kvq_bctx *b, kvq_buf *gate, const kvq_buf *up, size_t count);
    /* gate = gelu_tanh(gate) * up, over count values (GeGLU; GELU with the tanh approximation). */
    void (*geglu)(kvq_bctx *b, kvq_buf *gate, const kvq_buf *up, size_t count);
    /* acc += x, over count values. */
    void (*add)(kvq_bctx *b, kvq_buf *acc, const kvq_buf *x, size_t count);
    /* x *= s, over count values. */
    void (*scale)(kvq_bctx *b, kvq_buf *x, size_t count, float s);
    /* y = (x - mean(x)) / sqrt(var(x) + eps) * g per row of dim values (LayerNorm without bias);
     * g holds g_rows rows of dim gains and row t of x uses g row t % g_rows (1 for a plain norm,
     * n_heads for per-head q/k norms over [n][n_heads][head_dim]); x and y may alias. */
    void (*layer_norm)(kvq_bctx *b, const kvq_buf *x, const kvq_wt *g, kvq_buf *y, int n, int dim, float eps, int g_rows);
    /* Byte copy between buffers (e.g. pick the last row before the LM head); the two ranges
     * must not overlap (they may be in the same buffer). */
    void (*copy)(kvq_bctx *b, const kvq_buf *src, size_t src_off, kvq_buf *dst, size_t dst_off, size_t bytes);
    /* rows strided copies of row_bytes each: src_off + r*src_stride -> dst_off + r*dst_stride
     * (splits a fused projection's output [n][q|k|v] into q, k, v); ranges must not overlap. */
    void (*copy_rows)(kvq_bctx *b, const kvq_buf *src, size_t src_off, size_t src_stride, kvq_buf *dst, size_t dst_off,
                      size_t dst_stride, size_t row_bytes, int rows);
    /* Mixture of experts: y[r] = x[r / x_div] · w[route[r]]ᵀ for r < n, where w[0..n_w) share one
     * shape (the experts) and route is copied at issue time. Rows that pick the same expert
     * should go through it together, so its weights stream once per call; a decode step reads
     * only the experts named in route. */
    void (*matmul_routed)(kvq_bctx *b, const kvq_wt *const *w, int n_w, const kvq_buf *x, kvq_buf *y, int n,
                          const int32_t *route, int x_div);
    /* acc[i] += sum_j wts[i*k + j] * src[i*k + j] for rows i < n of dim values (combining the
     * k experts a token went through); wts is copied at issue time. */
    void (*add_weighted)(kvq_bctx *b, kvq_buf *acc, const kvq_buf *src, const float *wts, int n, int k, int dim);
    /* Stores k,v [n][n_head_kv*head_dim] at positions pos0..pos0+n-1 of layer, quantizing as the cache type says. */
    void (*kv_store)(kvq_bctx *b, kvq_kvbuf *kv, int layer, const kvq_buf *k, const kvq_buf *v, int pos0, int n);
    /* out[n][n_head*head_dim] = softmax(q·Kᵀ·scale, causal + window) · V for queries at pos0.., reading the cache as stored. */
    void (*attention)(kvq_bctx *b, const kvq_kvbuf *kv, int layer, const kvq_attn_desc *a,
                      const kvq_buf *q, kvq_buf *out, int pos0, int n);

    /* Optional: bytes of device memory this process may still allocate, for the offload plan
     * (NULL: the backend works in host memory and sets no limit of its own). */
    size_t (*mem_budget)(kvq_bctx *b);
    /* Optional: submit recorded ops now and wait for them, without reading anything back;
     * reports the first error like buf_read (NULL: nothing to do). */
    kvq_status (*flush)(kvq_bctx *b);
    /* Optional: device time in ms of the work submitted by the last buf_read/flush, from
     * the device's own timers; < 0 when unknown (NULL: not measured). */
    double (*device_ms)(kvq_bctx *b);
    /* Optional: counters since init (dispatches, barriers, submits recorded; allocations held;
     * bytes placed in host memory because the device was full). NULL: none kept. */
    void (*stats)(kvq_bctx *b, kvq_backend_stats *out);
    /* Optional: device allocations buffers of these sizes would take on a fresh device (the
     * plan of a model not loaded). NULL: the backend makes none of its own. */
    int (*plan_allocs)(kvq_bctx *b, const size_t *sizes, int n);
    /* Optional: device time per op kind since the last call, one "op=<kind> calls=<n> ms=<x>
     * gbs=<x>" line each ("" when not profiling); out NULL just resets. NULL: no profile. */
    void (*profile)(kvq_bctx *b, char *out, size_t size);
    /* Optional: memory bandwidth this backend streams at, measured now (GB/s; < 0 when it
     * cannot tell). NULL: not measured. */
    double (*bandwidth_gbs)(kvq_bctx *b);
    /* Optional: 1 when the device's memory is the host's (an integrated GPU). NULL: 0. */
    int (*shares_host_memory)(kvq_bctx *b);

    /* ---- optional fusions: NULL, the graph issues the separate ops (fewer GPU dispatches, barriers) ---- */
    /* y += x·Wᵀ (a projection into the residual stream); then, when g is given, h = rms_norm(y)·g with eps. */
    void (*matmul_add)(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n, const kvq_wt *g, kvq_buf *h, float eps);
    /* The same with input act(gate)·up (swiglu; geglu when gelu): the down projection; gate may be overwritten. */
    void (*matmul_glu_add)(kvq_bctx *b, const kvq_wt *w, kvq_buf *gate, const kvq_buf *up, int gelu, kvq_buf *y, int n,
                           const kvq_wt *g, kvq_buf *h, float eps);
    /* rope of q (n_head heads) and k in place as the rope entry does, then kv_store of k and v. */
    void (*rope_kv_store)(kvq_bctx *b, kvq_kvbuf *kv, int layer, kvq_buf *q, kvq_buf *k, const kvq_buf *v, int n_head,
                          int pos0, int n, const float *inv_freq, int mode);
} kvq_backend;

/* Registry (backend.c): backends compiled into this build, best first. */
int kvq_backend_count(void);
const kvq_backend *kvq_backend_get(int i);
const kvq_backend *kvq_backend_find(const char *name); /* NULL if not built */

extern const kvq_backend kvq_backend_cpu;
#ifdef KVQ_HAVE_VULKAN
extern const kvq_backend kvq_backend_vulkan;
#endif

#endif
