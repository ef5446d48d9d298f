/* What the Vulkan backend's files share: the instance struct, buffers, and the
 * small recording API every op file uses (vk_core.c implements it).
 *
 * Model of execution: ops record compute dispatches into one command buffer;
 * every dispatch is followed by a compute->compute memory barrier, so ops see
 * the results of earlier ops without per-op bookkeeping. buf_read / flush
 * submit the buffer and wait. Errors never stop recording: the first one is
 * kept in b->err (+ message) and returned at the next submit.
 *
 * Shaders: shaders/NAME.comp is compiled to SPIR-V at build time and embedded;
 * vk_pipe_get(b, "NAME", spec, n) gives its pipeline with specialization
 * constants 0..n-1 set to spec[]. Every pipeline has the same layout: set 0,
 * bindings 0..VK_MAX_BINDINGS-1 storage buffers (unused ones are bound to a
 * dummy buffer), and one push-constant block of at most VK_PC_BYTES. */
#ifndef KVQ_VK_INTERNAL_H
#define KVQ_VK_INTERNAL_H

#include "vulkan/vk_fns.h" /* Vulkan headers without prototypes + the loaded entry points */

#include "backend.h"

#define VK_MAX_BINDINGS 8
#define VK_PC_BYTES 128
#define VK_MAX_PIPES 128

/* A device buffer (activations, weights, KV cache). Device-local unless made
 * host-visible for staging. */
struct kvq_buf {
    VkBuffer buf;
    VkDeviceMemory mem;
    size_t bytes;
    void *map; /* host pointer when host-visible, else NULL */
    size_t dev_size; /* device-local bytes counted in b->dev_bytes */
};

/* One shader binding: a byte range of a buffer (off must be a multiple of
 * b->min_align; range VK_WHOLE_SIZE for "to the end"). */
typedef struct {
    VkBuffer buf;
    VkDeviceSize off, range;
} vk_bind;

static inline vk_bind vk_whole(const kvq_buf *x) { return (vk_bind){x->buf, 0, VK_WHOLE_SIZE}; }

typedef struct {
    char key[64]; /* shader name + spec constants */
    VkPipeline pipe;
    uint32_t local_x; /* not known from SPIR-V: callers pass their group counts */
} vk_pipe;

/* Device capabilities the op files choose shader variants by. */
typedef struct {
    int fp16;          /* shaderFloat16 arithmetic */
    int int8;          /* shaderInt8 */
    int int16;         /* shaderInt16 */
    int storage16;     /* storageBuffer16BitAccess */
    int storage8;      /* storageBuffer8BitAccess */
    int int_dot;       /* VK_KHR_shader_integer_dot_product */
    int subgroup_size; /* 0 when subgroup arithmetic is missing in compute */
    int subgroup_arith;
    int mem_budget;    /* VK_EXT_memory_budget: heaps' budget and usage */
} vk_caps;

struct kvq_bctx {
    VkInstance inst;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem_props;
    vk_caps caps;
    int software;                 /* llvmpipe/lavapipe or other CPU-type device */
    VkDeviceSize max_buffer;      /* largest buffer a shader may bind (KVQ_VK_MAX_BUFFER lowers it) */
    size_t dev_bytes, dev_limit;  /* device memory held; KVQ_VK_MEMORY_LIMIT caps it (tests) */
    VkDeviceSize min_align;       /* minStorageBufferOffsetAlignment */
    uint32_t max_groups[3];       /* maxComputeWorkGroupCount */
    int n_threads;

    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;          /* the one being recorded */
    int recording, n_dispatch;    /* n_dispatch: dispatches recorded since the last submit */
    VkFence fence;
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkDescriptorPool dpool;
    int dsets_used, dsets_cap;
    VkQueryPool qpool;            /* two timestamps around each submit, when supported */
    uint32_t ts_bits;             /* timestampValidBits of the queue family */
    double last_ms;

    kvq_buf *dummy;               /* bound to unused bindings */
    kvq_buf *stage;               /* host-visible ring: buf_write sources and vk_stage data */
    kvq_buf *readback;            /* host-visible buffer buf_read copies through */
    size_t stage_used;
    kvq_buf *scratch[8];          /* vk_scratch slots */
    struct {                      /* RoPE cos/sin table staged for this submit (shared by the layers) */
        const float *inv_freq;
        int pos0, n, half;
        vk_bind tab;
    } rope;

    vk_pipe pipes[VK_MAX_PIPES];
    int n_pipes;

    kvq_status err;               /* first error since the last submit */
    char err_msg[512];
    char desc[384];
};

/* ---- vk_core.c ---- */
kvq_status kvq_vk_open(const kvq_backend_opts *o, kvq_bctx **out);
/* kvq_backend.mem_budget: device-local bytes still free for this process. */
size_t kvq_vk_mem_budget(kvq_bctx *b);
void kvq_vk_close(kvq_bctx *b);
/* Allocates a buffer (device-local, or host-visible+coherent when host != 0). NULL + kvq_fail. */
kvq_buf *vk_buf_new(kvq_bctx *b, size_t bytes, int host);
void vk_buf_free(kvq_bctx *b, kvq_buf *x);
/* Uploads now (own submit + wait, through a staging buffer); for weights at load time. */
/* Records one copy of many regions (n of them; reg is rewritten: regions that continue
 * each other are joined). Every region must lie inside both buffers (else an error is
 * recorded and nothing copied); regions must not overlap when src == dst. */
void vk_record_copy_regions(kvq_bctx *b, const kvq_buf *src, kvq_buf *dst, VkBufferCopy *reg, uint32_t n);
kvq_status vk_upload_now(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n);
/* Records a host->device copy ordered with the ops recorded so far (src is copied now). */
void vk_record_write(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n);
/* Records a device copy ordered with the ops recorded so far. */
void vk_record_copy(kvq_bctx *b, const kvq_buf *src, size_t so, kvq_buf *dst, size_t dof, size_t n);
/* Copies n bytes of host data (e.g. token ids) into the staging ring; the returned
 * binding stays valid for shaders recorded until the next submit. */
vk_bind vk_stage(kvq_bctx *b, const void *src, size_t n);
/* Pipeline of shader `name` with spec constants 0..n_spec-1 = spec[] (created on first
 * use, cached). NULL (error recorded in b) when the shader is missing or fails. */
const vk_pipe *vk_pipe_get(kvq_bctx *b, const char *name, const uint32_t *spec, int n_spec);
/* Records pipe with bindings 0..n_bind-1 and push constants, then a memory barrier. A NULL
 * pipe is skipped (its error is already recorded). Group counts are checked against the limits. */
void vk_dispatch(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc,
                 uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz);
/* A persistent device buffer of at least `bytes` for slot 0..7 (grows, submitting pending
 * work first). Slots: 0-3 attention, 4-5 matmul, 6-7 matmul_routed. NULL + error recorded on failure. */
kvq_buf *vk_scratch(kvq_bctx *b, int slot, size_t bytes);
/* Remembers the first error of an op (printf-style message, one line). */
void vk_error(kvq_bctx *b, kvq_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Submits the recorded work and waits; returns (and clears) the first error. */
kvq_status vk_submit(kvq_bctx *b);

/* ---- vk_weights.c / vk_matmul.c: weights, get_rows, matmul ---- */
int kvq_vk_weight_supported(kvq_bctx *b, const kvq_weight_desc *d);
kvq_wt *kvq_vk_weight_upload(kvq_bctx *b, const kvq_weight_desc *d);
void kvq_vk_weight_free(kvq_bctx *b, kvq_wt *w);
size_t kvq_vk_weight_bytes(kvq_bctx *b, const kvq_wt *w);
/* f32 copy of a one-row weight (norm gains), for rms_norm. */
vk_bind kvq_vk_weight_vec(const kvq_wt *w);
void kvq_vk_get_rows(kvq_bctx *b, const kvq_wt *w, const int32_t *ids, int n, kvq_buf *out);
void kvq_vk_matmul(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n);
/* The same with x and y given as bindings (offsets aligned to b->min_align): rows of x
 * and y start at the binding's offset. */
void kvq_vk_matmul_at(kvq_bctx *b, const kvq_wt *w, vk_bind x, vk_bind y, int n);

/* ---- vk_moe.c: routed (mixture-of-experts) matmul ---- */
void kvq_vk_matmul_routed(kvq_bctx *b, const kvq_wt *const *w, int n_w, const kvq_buf *x, kvq_buf *y, int n,
                          const int32_t *route, int x_div);

/* ---- vk_kv.c: KV cache, kv_store, attention ---- */
kvq_kvbuf *kvq_vk_kv_new(kvq_bctx *b, const kvq_kv_desc *d);
void kvq_vk_kv_free(kvq_bctx *b, kvq_kvbuf *kv);
size_t kvq_vk_kv_bytes(kvq_bctx *b, const kvq_kv_desc *d, int positions);
void kvq_vk_kv_store(kvq_bctx *b, kvq_kvbuf *kv, int layer, const kvq_buf *k, const kvq_buf *v, int pos0, int n);
void kvq_vk_attention(kvq_bctx *b, const kvq_kvbuf *kv, int layer, const kvq_attn_desc *a, const kvq_buf *q,
                      kvq_buf *out, int pos0, int n);

#endif
