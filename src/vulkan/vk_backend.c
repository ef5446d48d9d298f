/* The Vulkan backend's table: buffers, the elementwise ops, and the entries
 * that vk_weights.c / vk_matmul.c / vk_kv.c implement. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vulkan/vk_bench.h"
#include "vulkan/vk_kv.h"
#include "vulkan/vk_weights.h"

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "software";
    default: return "other";
    }
}

static kvq_status vkb_init(const kvq_backend_opts *o, kvq_bctx **out) {
    kvq_status s = kvq_vk_open(o, out);
    if (s) return s;
    kvq_bctx *b = *out;
    b->exact = o && o->exact;
    const vk_caps *c = &b->caps;
    char cu[32] = "";
    if (c->compute_units) snprintf(cu, sizeof cu, ", %d compute units", c->compute_units);
    char drv[140] = "";
    if (b->driver[0]) snprintf(drv, sizeof drv, ", %s", b->driver);
    /* display only: a long device + driver name is cut (using the length keeps -Wformat-truncation quiet) */
    const int len = snprintf(b->desc, sizeof b->desc, "vulkan: %s (%s%s%s%s%s%s%s)", b->props.deviceName, type_name(b->props.deviceType), drv,
             c->fp16 ? ", fp16" : "", c->storage8 ? ", int8 storage" : "", c->int_dot ? ", int dot" : "",
             c->subgroup_arith ? ", subgroups" : "", cu);
    (void)len;
    return KVQ_OK;
}

static void vkb_release(kvq_bctx *b) { kvq_vk_close(b); }
static const char *vkb_describe(kvq_bctx *b) { return b->desc; }

static kvq_buf *vkb_buf_new(kvq_bctx *b, size_t bytes) {
    if (bytes > b->max_buffer) {
        kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: a %zu-byte activation buffer is over the device's %llu-byte limit (lower -b or -c)",
                 bytes, (unsigned long long)b->max_buffer);
        return NULL;
    }
    return vk_buf_new(b, bytes, 0);
}

static void vkb_buf_free(kvq_bctx *b, kvq_buf *x) { vk_buf_free(b, x); }

static void vkb_buf_write(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n) {
    vk_record_write(b, dst, off, src, n);
}

static kvq_status vkb_buf_read(kvq_bctx *b, const kvq_buf *src, size_t off, void *dst, size_t n) {
    if (off > src->bytes || n > src->bytes - off) {
        vk_submit(b);
        return kvq_fail(KVQ_ERR_ARG, "vulkan: read past buffer end");
    }
    if (!b->readback || b->readback->bytes < n) {
        kvq_buf *rb = vk_buf_new(b, n + n / 4 + 4096, 1);
        if (!rb) {
            vk_error(b, KVQ_ERR_NOMEM, "%s (read-back buffer)", kvq_last_error());
        } else {
            vk_buf_free(b, b->readback);
            b->readback = rb;
        }
    }
    if (b->readback && b->readback->bytes >= n) vk_record_copy(b, src, off, b->readback, 0, n);
    kvq_status s = vk_submit(b);
    if (s) return s;
    memcpy(dst, b->readback->map, n);
    return KVQ_OK;
}

static kvq_status vkb_flush(kvq_bctx *b) { return vk_submit(b); }
static double vkb_device_ms(kvq_bctx *b) { return b->last_ms; }

/* 256 MiB copies (past any GPU's cache), best of 3. */
static double vkb_bandwidth(kvq_bctx *b) { return kvq_vk_bandwidth_gbs(b, (size_t)256 << 20, 3); }

/* An integrated GPU, or KVQ_VK_SHARED_MEMORY=1 (tests treat lavapipe as one). */
static int vkb_shares_host_memory(kvq_bctx *b) {
    const char *env = getenv("KVQ_VK_SHARED_MEMORY");
    if (env && *env) return !strcmp(env, "1");
    return b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
}

static int vkb_plan_allocs(kvq_bctx *b, const size_t *sizes, int n) { return vk_alloc_plan(b, sizes, n); }

static void vkb_stats(kvq_bctx *b, kvq_backend_stats *out) {
    out->dispatches = b->count.dispatches;
    out->barriers = b->count.barriers;
    out->submits = b->count.submits;
    out->allocs = b->n_allocs;
    out->host_fallback_bytes = b->count.host_fallback_bytes;
    out->pipelines = b->n_pipes;
    out->dsets = b->count.dset_allocs;
    out->waits = b->count.waits;
}

/* The layer norm's shader by device (subgroupAdd: fewer barriers); ops_prepare builds the same. */
static const char *layer_norm_shader(const kvq_bctx *b) { return b->caps.subgroup_arith ? "layer_norm_sg" : "layer_norm"; }

/* Every elementwise op's pipeline (none has spec constants), built at the first weight upload
 * rather than at open: tests open backends often, and software drivers compile slowly. */
static kvq_status ops_prepare(kvq_bctx *b) {
    if (b->ops_ready) return KVQ_OK;
    const char *names[] = {vk_rms_norm_shader(b), layer_norm_shader(b), "rope", "swiglu", "geglu", "add", "scale", "add_weighted"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) vk_pipe_get(b, names[i], NULL, 0);
    if (b->err) return vk_submit(b);
    b->ops_ready = 1;
    return KVQ_OK;
}

/* kvq_backend.weight_upload: the weight, then the pipelines of the ops (once) and of its
 * matmuls (kvq_vk_matmul_prepare): at load, not at the first token. Norm gains (one row)
 * only go to the norms. */
static kvq_wt *vkb_weight_upload(kvq_bctx *b, const kvq_weight_desc *d) {
    kvq_wt *w = kvq_vk_weight_upload(b, d);
    if (!w) return NULL;
    kvq_status s = ops_prepare(b);
    if (s == KVQ_OK && !(w->vec && d->rows == 1)) s = kvq_vk_matmul_prepare(b, w, d->rows_only);
    if (s == KVQ_OK) return w;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", kvq_last_error());
    kvq_vk_weight_free(b, w);
    return kvq_fail(KVQ_ERR_BACKEND, "%s: upload of its pipelines failed (%s)", d->name, msg), NULL;
}

/* One workgroup per row; rows past the grid limit go in further dispatches (per-head
 * q/k norms run n_tokens * n_heads rows). */
static void vkb_layer_norm(kvq_bctx *b, const kvq_buf *x, const kvq_wt *g, kvq_buf *y, int n, int dim, float eps, int g_rows) {
    if (n <= 0 || dim <= 0) return;
    if (g_rows < 1 || !g->vec || (size_t)g->rows * g->cols != (size_t)g_rows * dim) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: layer_norm gains of %dx%d for %d rows of %d", g->rows, g->cols, g_rows, dim);
        return;
    }
    if (!vk_count_ok(b, (size_t)n * dim, "layer_norm")) return;
    const vk_pipe *p = vk_pipe_get(b, layer_norm_shader(b), NULL, 0);
    vk_bind bind[3] = {vk_whole(x), kvq_vk_weight_vec(g), vk_whole(y)};
    const uint32_t cap = b->max_groups[0];
    for (uint32_t row0 = 0; row0 < (uint32_t)n; row0 += cap) {
        struct { uint32_t dim; float eps; uint32_t g_rows, row0; } pc = {(uint32_t)dim, eps, (uint32_t)g_rows, row0};
        uint32_t rows = (uint32_t)n - row0 < cap ? (uint32_t)n - row0 : cap;
        vk_dispatch(b, p, bind, 3, &pc, sizeof pc, rows, 1, 1);
    }
}

static void vkb_rope(kvq_bctx *b, kvq_buf *x, int n, int n_heads, int head_dim, int pos0, const float *inv_freq, int mode) {
    size_t total = (size_t)n * n_heads * (head_dim / 2);
    if (!vk_count_ok(b, total, "rope")) return;
    struct { uint32_t n, n_heads, head_dim, pairs; } pc = {(uint32_t)n, (uint32_t)n_heads, (uint32_t)head_dim,
                                                          (uint32_t)(mode == KVQ_ROPE_PAIRS)};
    vk_bind bind[2] = {vk_whole(x), vk_rope_table(b, n, head_dim / 2, pos0, inv_freq)};
    vk_dispatch(b, vk_pipe_get(b, "rope", NULL, 0), bind, 2, &pc, sizeof pc, vk_groups_for(b, total), 1, 1);
}

static void vkb_swiglu(kvq_bctx *b, kvq_buf *gate, const kvq_buf *up, size_t count) { vk_elementwise(b, "swiglu", gate, up, count); }
static void vkb_add(kvq_bctx *b, kvq_buf *acc, const kvq_buf *x, size_t count) { vk_elementwise(b, "add", acc, x, count); }

static void vkb_geglu(kvq_bctx *b, kvq_buf *gate, const kvq_buf *up, size_t count) { vk_elementwise(b, "geglu", gate, up, count); }

static void vkb_scale(kvq_bctx *b, kvq_buf *x, size_t count, float s) {
    if (!vk_count_ok(b, count, "scale")) return;
    struct { uint32_t count; float s; } pc = {(uint32_t)count, s};
    vk_bind bind[1] = {vk_whole(x)};
    vk_dispatch(b, vk_pipe_get(b, "scale", NULL, 0), bind, 1, &pc, sizeof pc, vk_groups_for(b, count), 1, 1);
}

static void vkb_add_weighted(kvq_bctx *b, kvq_buf *acc, const kvq_buf *src, const float *wts, int n, int k, int dim) {
    if (n <= 0 || k <= 0 || dim <= 0) return;
    if (!vk_count_ok(b, (size_t)n * k * dim, "add_weighted")) return;
    struct { uint32_t n, k, dim; } pc = {(uint32_t)n, (uint32_t)k, (uint32_t)dim};
    vk_bind bind[3] = {vk_whole(acc), vk_whole(src), vk_stage(b, wts, sizeof(float) * (size_t)n * k)};
    vk_dispatch(b, vk_pipe_get(b, "add_weighted", NULL, 0), bind, 3, &pc, sizeof pc, vk_groups_for(b, (size_t)n * dim), 1, 1);
}

/* One transfer command with a region per row (rows that continue each other join). */
static void vkb_copy_rows(kvq_bctx *b, const kvq_buf *src, size_t so, size_t ss, kvq_buf *dst, size_t dof, size_t ds,
                          size_t row_bytes, int rows) {
    if (rows <= 0 || !row_bytes) return;
    size_t last = (size_t)(rows - 1); /* offsets that wrap around would pass the bounds check */
    if ((ss && last > (SIZE_MAX - so) / ss) || (ds && last > (SIZE_MAX - dof) / ds)) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: copy_rows of %d rows past a buffer's end", rows);
        return;
    }
    VkBufferCopy *reg = malloc(sizeof *reg * (size_t)rows);
    if (!reg) {
        vk_error(b, KVQ_ERR_NOMEM, "vulkan: out of host memory for copy_rows of %d rows", rows);
        return;
    }
    for (int r = 0; r < rows; r++)
        reg[r] = (VkBufferCopy){.srcOffset = so + (size_t)r * ss, .dstOffset = dof + (size_t)r * ds, .size = row_bytes};
    vk_record_copy_regions(b, src, dst, reg, (uint32_t)rows);
    free(reg);
}

static void vkb_copy(kvq_bctx *b, const kvq_buf *src, size_t so, kvq_buf *dst, size_t dof, size_t bytes) {
    vk_record_copy(b, src, so, dst, dof, bytes);
}

const kvq_backend kvq_backend_vulkan = {
    .name = "vulkan",
    .weights_in_place = 0,
    .exact_rows = VK_EXACT_ROWS,
    .init = vkb_init,
    .release = vkb_release,
    .describe = vkb_describe,
    .buf_new = vkb_buf_new,
    .buf_free = vkb_buf_free,
    .buf_write = vkb_buf_write,
    .buf_read = vkb_buf_read,
    .weight_supported = kvq_vk_weight_supported,
    .weight_upload = vkb_weight_upload,
    .weight_free = kvq_vk_weight_free,
    .weight_bytes = kvq_vk_weight_bytes,
    .kv_new = kvq_vk_kv_new,
    .kv_free = kvq_vk_kv_free,
    .kv_bytes = kvq_vk_kv_bytes,
    .kv_read = kvq_vk_kv_read,
    .kv_write = kvq_vk_kv_write,
    .get_rows = kvq_vk_get_rows,
    .matmul = kvq_vk_matmul,
    .rms_norm = vk_op_rms_norm,
    .rope = vkb_rope,
    .swiglu = vkb_swiglu,
    .geglu = vkb_geglu,
    .add = vkb_add,
    .scale = vkb_scale,
    .layer_norm = vkb_layer_norm,
    .copy = vkb_copy,
    .copy_rows = vkb_copy_rows,
    .matmul_routed = kvq_vk_matmul_routed,
    .add_weighted = vkb_add_weighted,
    .kv_store = kvq_vk_kv_store,
    .attention = kvq_vk_attention,
    .mem_budget = kvq_vk_mem_budget,
    .flush = vkb_flush,
    .device_ms = vkb_device_ms,
    .stats = vkb_stats,
    .plan_allocs = vkb_plan_allocs,
    .profile = vk_prof_report,
    .bandwidth_gbs = vkb_bandwidth,
    .shares_host_memory = vkb_shares_host_memory,
    .matmul_add = kvq_vk_matmul_add,
    .matmul_glu_add = kvq_vk_matmul_glu_add,
    .rope_kv_store = kvq_vk_kv_store_rope,
};
