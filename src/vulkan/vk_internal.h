/* What the Vulkan backend's files share: the instance struct, buffers, and the
 * small recording API every op file uses.
 *
 * Model of execution (vk_record.c): ops record compute dispatches and copies into
 * command buffers. A barrier goes in only where a command reads what an earlier
 * one wrote, or writes what an earlier one read or wrote, since the last barrier
 * (each pipeline knows which bindings its shader writes, from the SPIR-V), so
 * independent matvecs run without one between them. The command buffer is submitted
 * in pieces (16 dispatches, then twice as many each time) without waiting, so the GPU
 * runs while the host records the rest; buf_read / flush submit the last piece and
 * wait for all.
 * Errors never stop recording: the first one is kept in b->err (+ message) and
 * returned at the next submit; a lost device (or a GPU that never finishes) is
 * sticky: every later call fails with it.
 *
 * Memory (vk_alloc.c): device buffers are placed in a few large allocations
 * (blocks); when device-local memory runs out, in host-visible memory the GPU
 * reads over the bus, with a note in the plan line.
 *
 * Shaders (vk_pipes.c): shaders/NAME.comp is compiled to SPIR-V at build time and
 * embedded; vk_pipe_get(b, "NAME", spec, n) gives its pipeline with specialization
 * constants 0..n-1 set to spec[]. Every pipeline has the same layout: set 0,
 * bindings 0..VK_MAX_BINDINGS-1 storage buffers (unused ones are bound to a
 * dummy buffer), and one push-constant block of at most VK_PC_BYTES. Pipelines
 * are built through a VkPipelineCache kept on disk. */
#ifndef KVQ_VK_INTERNAL_H
#define KVQ_VK_INTERNAL_H

#include "vulkan/vk_fns.h" /* Vulkan headers without prototypes + the loaded entry points */

#include "backend.h"

#define VK_MAX_BINDINGS 12
#define VK_PC_BYTES 128
#define VK_MAX_PIPES 128
#define VK_SLOTS 8     /* command buffers in flight: a whole 70B token's pieces (vk_record.c) */
#define VK_TRACK 64    /* buffer ranges remembered since the last barrier */
/* Batches of up to this many tokens compute each token as a one-token decode does, bit for bit
 * (matmuls in vector pieces, attention row by row): a speculative verify's rows are plain decode's. */
#define VK_EXACT_ROWS 16

typedef struct vk_block vk_block; /* one device allocation holding many buffers (vk_alloc.c) */
typedef struct vk_dset vk_dset;   /* a cached descriptor set (vk_record.c) */
typedef struct vk_deferred vk_deferred; /* a dispatch held back (vk_record.c) */

/* A device buffer (activations, weights, KV cache). Device-local unless made
 * host-visible for staging. */
struct kvq_buf {
    VkBuffer buf;
    VkDeviceMemory mem; /* own allocation (host-visible staging buffers), else VK_NULL_HANDLE */
    vk_block *block;    /* the block it lives in, at [off, off + size) */
    VkDeviceSize off, size;
    size_t bytes;
    void *map; /* host pointer when host-visible, else NULL */
};

/* One shader binding: a byte range of a buffer (off must be a multiple of
 * b->min_align; range VK_WHOLE_SIZE for "to the end"). */
typedef struct {
    VkBuffer buf;
    VkDeviceSize off, range;
    VkDeviceSize bytes; /* with range VK_WHOLE_SIZE: the bytes it holds (for the profile), 0 if unknown */
} vk_bind;

static inline vk_bind vk_whole(const kvq_buf *x) { return (vk_bind){x->buf, 0, VK_WHOLE_SIZE, x->bytes}; }

typedef struct {
    char key[64];      /* shader name + spec constants, for messages */
    uint64_t hash;     /* of name + spec: the lookup compares this first */
    uint32_t spec[16];
    int n_spec;
    VkPipeline pipe;
    uint16_t reads, writes; /* bindings the shader declares readonly / writable (from its SPIR-V) */
} vk_pipe;

/* A byte range of a buffer that a recorded command reads or writes. */
typedef struct {
    VkBuffer buf;
    VkDeviceSize lo, hi;
} vk_range;

typedef struct {
    VkCommandBuffer cmd;
    VkFence fence;
    int pending; /* submitted, fence not yet waited for */
} vk_slot;

/* Counters since open, for kvq-bench and the plan line. */
typedef struct {
    uint64_t dispatches, barriers, submits, dset_allocs;
    uint64_t waits;             /* host blocks on fences: one per vk_finish with work in flight, one per full ring */
    size_t host_fallback_bytes; /* buffers placed in host-visible memory because the device was full */
} vk_counters;

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
    int compute_units; /* SMs / CUs / shader cores from VK_NV_shader_sm_builtins, VK_AMD_shader_core_properties
                          or VK_ARM_shader_core_builtins; 0 when unknown */
    int fused_reduce;  /* split matvecs reduce in their last workgroup (KVQ_VK_DISABLE=fusedreduce: mm_reduce) */
    int attn_dec;      /* decode attention through attn_dec (KVQ_VK_DISABLE=attndec: attn_fused, as prompts) */
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
    uint32_t target_groups;       /* KVQ_VK_TARGET_GROUPS: workgroups a matvec spreads over (0: by device) */
    VkDeviceSize max_buffer;      /* largest buffer a shader may bind (KVQ_VK_MAX_BUFFER lowers it) */
    size_t dev_bytes, dev_limit;  /* device bytes in buffers; KVQ_VK_MEMORY_LIMIT caps it (tests) */
    size_t block_bytes;           /* device bytes allocated (blocks hold some free room) */
    VkDeviceSize min_align;       /* minStorageBufferOffsetAlignment */
    uint32_t max_groups[3];       /* maxComputeWorkGroupCount */
    int n_threads;
    int exact;                    /* kvq_backend_opts.exact: no fp16 lookup tables (vk_matmul.c) */
    int ops_ready;                /* the elementwise pipelines are built (ops_prepare in vk_backend.c) */

    VkCommandPool cmd_pool;
    vk_slot slots[VK_SLOTS];
    int cur;                      /* slot being recorded (or next to record) */
    VkCommandBuffer cmd;          /* slots[cur].cmd while recording */
    int recording, piece;         /* piece: dispatches in the command buffer being recorded */
    int batch_pieces;             /* pieces submitted since the last wait */
    uint64_t piece_tiles;         /* mm_tile workgroups in the piece being recorded */
    long hang_ms;                 /* a piece not finished after this is a hung GPU (KVQ_VK_HANG_MS) */
    int timing;                   /* the first timestamp of this batch is written */
    vk_range pend_r[VK_TRACK], pend_w[VK_TRACK]; /* read / written since the last barrier */
    int n_pend_r, n_pend_w, pend_full;
    int barrier_all;              /* KVQ_VK_BARRIERS=all: a barrier before every command */
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkDescriptorPool dpool;
    vk_dset *dsets;               /* open-addressing table of cached sets */
    vk_deferred *defer;           /* dispatches held back (vk_dispatch_later) */
    int n_defer;
    int n_dsets;
    VkQueryPool qpool;            /* two timestamps around each wait, when supported */
    uint32_t ts_bits;             /* timestampValidBits of the queue family */
    double last_ms;
    vk_counters count;
    long fail_after;              /* KVQ_VK_FAIL_AFTER=n (tests): the n+1-th wait reports a lost device */
    struct vk_prof *prof;         /* KVQ_VK_PROFILE=1: per-command timestamps (vk_profile.c) */
    kvq_status dead;              /* sticky: device lost or hung */
    char dead_msg[256];

    vk_block *blocks;             /* device allocations (vk_alloc.c) */
    int n_allocs, max_allocs;     /* live vkAllocateMemory count; KVQ_VK_MAX_ALLOCS caps it */
    size_t block_next, block_max; /* size of the next block; it doubles up to block_max */
    size_t max_alloc;             /* maxMemoryAllocationSize */
    int host_fallback;            /* place buffers in host-visible memory when the device is full */
    VkPipelineCache pcache;
    char pcache_path[512];
    int pcache_new;               /* pipelines were built this run: save the cache at close */

    kvq_buf *dummy;               /* bound to unused bindings */
    kvq_buf *stage;               /* host-visible ring: buf_write sources and vk_stage data */
    kvq_buf *readback;            /* host-visible buffer buf_read copies through */
    size_t stage_used;
    kvq_buf *scratch[9];          /* vk_scratch slots */
    size_t part_off;              /* next free byte of the matvecs' partial-sum ring (scratch 4) */
    size_t cnt_off;               /* and of their counters' ring (scratch 5) */
    const kvq_buf *cnt_zeroed;    /* the counters' buffer, once it has been zeroed */
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
    char driver[132];             /* driver name and version (Vulkan 1.2), "" when unknown */
};

/* ---- vk_error.c: the error state (below every other file) ---- */
/* Remembers the first error of an op (printf-style message, one line). */
void vk_error(kvq_bctx *b, kvq_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *vk_result_str(VkResult r);

/* ---- vk_core.c: instance and device ---- */
kvq_status kvq_vk_open(const kvq_backend_opts *o, kvq_bctx **out);
/* kvq_backend.mem_budget: device-local bytes still free for this process. */
size_t kvq_vk_mem_budget(kvq_bctx *b);
void kvq_vk_close(kvq_bctx *b);

/* ---- vk_alloc.c: memory ---- */
/* Allocates a buffer: device-local (placed in a block), or host-visible+coherent with its own
 * allocation when host != 0. NULL + kvq_fail. */
kvq_buf *vk_buf_new(kvq_bctx *b, size_t bytes, int host);
/* Frees a buffer no recorded work uses any more (vk_buf_free in vk_record.c makes sure). */
void vk_buf_destroy(kvq_bctx *b, kvq_buf *x);
/* Sets the allocator up from the device limits and the environment; frees every block at close. */
void vk_alloc_init(kvq_bctx *b, VkDeviceSize max_alloc);
void vk_alloc_close(kvq_bctx *b);
/* Device allocations a set of buffers of these sizes would take, placed as vk_buf_new would
 * place them on a fresh device (the plan of a model not loaded). */
int vk_alloc_plan(const kvq_bctx *b, const size_t *sizes, int n);

/* ---- vk_pipes.c: pipelines ---- */
/* Pipeline of shader `name` with spec constants 0..n_spec-1 = spec[] (created on first
 * request, cached; the matmul and elementwise ones are requested at weight upload). NULL
 * (error recorded in b) when the shader is missing or fails. */
const vk_pipe *vk_pipe_get(kvq_bctx *b, const char *name, const uint32_t *spec, int n_spec);
/* Opens the on-disk pipeline cache ($KVQ_VK_PIPELINE_CACHE, else $XDG_CACHE_HOME/kvq or
 * ~/.cache/kvq, one file per device and driver); saves it and destroys the pipelines at close. */
void vk_pipes_open(kvq_bctx *b);
void vk_pipes_close(kvq_bctx *b);

/* ---- vk_record.c: recording and submitting ---- */
kvq_status vk_record_init(kvq_bctx *b);
void vk_record_close(kvq_bctx *b);
/* Records one copy of many regions (n of them; reg is rewritten: regions that continue
 * each other are joined). Every region must lie inside both buffers (else an error is
 * recorded and nothing copied); regions must not overlap when src == dst. */
void vk_record_copy_regions(kvq_bctx *b, const kvq_buf *src, kvq_buf *dst, VkBufferCopy *reg, uint32_t n);
/* Uploads now (own submit + wait, through the staging ring); for weights at load time. */
kvq_status vk_upload_now(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n);
/* Records a host->device copy ordered with the ops recorded so far (src is copied now). */
void vk_record_write(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n);
/* Records a fill of n bytes (a multiple of 4) of dst with the 32-bit value v. */
void vk_record_fill(kvq_bctx *b, kvq_buf *dst, size_t off, size_t n, uint32_t v);
/* Records a device copy ordered with the ops recorded so far. */
void vk_record_copy(kvq_bctx *b, const kvq_buf *src, size_t so, kvq_buf *dst, size_t dof, size_t n);
/* Copies n bytes of host data (e.g. token ids) into the staging ring; the returned
 * binding stays valid for shaders recorded until the next wait. */
vk_bind vk_stage(kvq_bctx *b, const void *src, size_t n);
/* Records pipe with bindings 0..n_bind-1 and push constants, after a barrier if it depends on
 * earlier commands. A NULL pipe is skipped (its error is already recorded). Group counts are
 * checked against the limits. */
void vk_dispatch(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc,
                 uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz);
/* Holds a dispatch back until the next command that is not recorded with vk_dispatch_beside or
 * that touches what it touches (a matvec's reduce, so the q, k and v matvecs run side by side
 * and their reduces side by side after one barrier). */
void vk_dispatch_later(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc,
                       uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz);
/* Records a dispatch without first running the held-back ones, unless it depends on them. */
void vk_dispatch_beside(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc,
                        uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz);
void vk_flush_deferred(kvq_bctx *b);
/* Submits the recorded work and waits for everything submitted; returns (and clears) the
 * first error. */
kvq_status vk_submit(kvq_bctx *b);
/* Waits for all submitted work, keeping any error in b->err (for vk_submit). */
void vk_finish(kvq_bctx *b);
/* 1 while work is recorded or submitted and not yet waited for. */
int vk_busy(const kvq_bctx *b);
/* Drops the cached descriptor sets (a buffer they name is going away); b must be idle. */
void vk_dsets_clear(kvq_bctx *b);
/* 1 when the device hung with work it may still be running (never destroy what that uses). */
int vk_in_flight(kvq_bctx *b);
/* Frees a buffer, first waiting for recorded work that may use it. */
void vk_buf_free(kvq_bctx *b, kvq_buf *x);
/* A persistent device buffer of at least `bytes` for slot 0..7 (grows, waiting for pending
 * work first). Slots: 0, 2-3 attention, 1 the int8 tiles' activations, 4-5 matmul, 6-7 matmul_routed, 8 the fused entries' fallback. NULL + error recorded on failure. */
kvq_buf *vk_scratch(kvq_bctx *b, int slot, size_t bytes);

/* ---- vk_profile.c: per-op device time (KVQ_VK_PROFILE=1, kvq-bench model --profile) ---- */
/* Set up when KVQ_VK_PROFILE=1 (commands then run one after another, so each has its own time). */
void vk_prof_init(kvq_bctx *b);
void vk_prof_close(kvq_bctx *b);
/* In a batch's first command buffer, before any command. */
void vk_prof_begin(kvq_bctx *b);
/* After each recorded command: its kind (a shader name or "copy") and the bytes it binds. */
void vk_prof_mark(kvq_bctx *b, const char *kind, double bytes);
/* After a batch finished: adds its times up by kind. */
void vk_prof_collect(kvq_bctx *b);
/* One line per kind since the last call ("" when not profiling); out NULL: just reset. */
void vk_prof_report(kvq_bctx *b, char *out, size_t size);

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

/* Optional work a split-capable AQLM matvec folds in (shaders/mm_fuse.glsl): flags MM_* there. */
enum { VK_MM_ADD = 8, VK_MM_NORM = 16, VK_MM_GLU = 32, VK_MM_GELU = 64 };
typedef struct {
    uint32_t flags;
    vk_bind up;    /* VK_MM_GLU: the up rows (x holds the gate rows) */
    vk_bind gain;  /* VK_MM_NORM: the norm's gains; its output goes to h */
    vk_bind h;
    float eps;
} vk_mm_fuse;
/* 1 when kvq_vk_matmul_fused can run w over n tokens in one dispatch (AQLM, decode sizes, one
 * piece, the last-workgroup reduce available). */
int kvq_vk_matmul_fusable(const kvq_bctx *b, const kvq_wt *w, int n);
/* The matvec with f's work folded in (only where kvq_vk_matmul_fusable). */
void kvq_vk_matmul_fused(kvq_bctx *b, const kvq_wt *w, vk_bind x, vk_bind y, int n, const vk_mm_fuse *f);

/* ---- vk_ops.c: elementwise and norm dispatches (the table's and the fused entries' fallbacks) ---- */
uint32_t vk_groups_for(const kvq_bctx *b, size_t count);
/* 0 (error recorded) when count values do not fit the shaders' 32-bit indices. */
int vk_count_ok(kvq_bctx *b, size_t count, const char *op);
const char *vk_rms_norm_shader(const kvq_bctx *b);
/* cos/sin of (pos0+t)·inv_freq[i] for t < n, i < half, staged once per submit. */
vk_bind vk_rope_table(kvq_bctx *b, int n, int half, int pos0, const float *inv_freq);
/* a = shader(a, x) over count values (add, swiglu, geglu). */
void vk_elementwise(kvq_bctx *b, const char *shader, kvq_buf *a, const kvq_buf *x, size_t count);
void vk_op_rms_norm(kvq_bctx *b, const kvq_buf *x, const kvq_wt *g, kvq_buf *y, int n, int dim, float eps);

/* ---- vk_fuse.c: the optional fused entries of kvq_backend (issue 33 §3) ---- */
void kvq_vk_matmul_add(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n, const kvq_wt *g, kvq_buf *h,
                       float eps);
void kvq_vk_matmul_glu_add(kvq_bctx *b, const kvq_wt *w, kvq_buf *x, const kvq_buf *up, int gelu, kvq_buf *y, int n,
                           const kvq_wt *g, kvq_buf *h, float eps);

/* ---- vk_moe.c: routed (mixture-of-experts) matmul ---- */
void kvq_vk_matmul_routed(kvq_bctx *b, const kvq_wt *const *w, int n_w, const kvq_buf *x, kvq_buf *y, int n,
                          const int32_t *route, int x_div);

/* ---- vk_kv.c: KV cache, kv_store, attention ---- */
kvq_kvbuf *kvq_vk_kv_new(kvq_bctx *b, const kvq_kv_desc *d);
void kvq_vk_kv_free(kvq_bctx *b, kvq_kvbuf *kv);
size_t kvq_vk_kv_bytes(kvq_bctx *b, const kvq_kv_desc *d, int positions);
void kvq_vk_kv_store(kvq_bctx *b, kvq_kvbuf *kv, int layer, const kvq_buf *k, const kvq_buf *v, int pos0, int n);
/* kvq_backend.rope_kv_store: kv_store that first ropes q (n_head heads) and k in place, one dispatch. */
void kvq_vk_kv_store_rope(kvq_bctx *b, kvq_kvbuf *kv, int layer, kvq_buf *q, kvq_buf *k, const kvq_buf *v, int n_head,
                          int pos0, int n, const float *inv_freq, int mode);
void kvq_vk_attention(kvq_bctx *b, const kvq_kvbuf *kv, int layer, const kvq_attn_desc *a, const kvq_buf *q,
                      kvq_buf *out, int pos0, int n);

#endif
