/* The Vulkan backend's KV cache: device buffers, kv_store (shaders/kv_store.comp)
 * and fused attention (shaders/attn_fused.comp + attn_merge.comp).
 *
 * Layout: rows [layer][kv head][n_ctx] as on the CPU, each row the reference's
 * bytes (src/kv_format.h) padded to whole 32-bit words (q8/q4 rows of an odd
 * number of blocks gain 2 bytes), so a store workgroup writes whole words of
 * its own row only. K and V are separate; consecutive layers share a buffer as
 * long as it stays within b->max_buffer (and 4 GiB: shaders use 32-bit byte
 * offsets), otherwise the cache is split by layer.
 *
 * Attention: work items are (tile of query rows of one KV head, split of the
 * positions); every K/V row a workgroup reads serves all the GQA heads it
 * holds. Splits write partial (max, sum, acc) into vk_scratch slot 0;
 * attn_merge combines them and undoes the V rotation. Decode (one query) goes
 * through attn_dec (shaders/attn_dec.glsl: K/V blocks staged in shared memory
 * by coalesced copies, int8 q and integer dot products for q8/q4 K where the
 * device has them), batches of up to VK_EXACT_ROWS queries as that many decodes (each row
 * bit for bit a one-token step's), prompts through attn_fused (R rows of (query, head) per
 * workgroup, many tiles and few splits). kvq_vk_attn_pick names the pipeline
 * for both kv_new (which builds them all, so no token pays for one) and the
 * dispatch; kvq_vk_attn_plan sizes the grid from b->target_groups. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_format.h"
#include "util.h"
#include "vulkan/vk_internal.h"
#include "vulkan/vk_kv.h"

struct kvq_kvbuf {
    kvq_kv_desc d;
    size_t row[2];      /* padded row bytes, K and V */
    size_t layer[2];    /* bytes of one layer */
    int per_buf[2];     /* layers per buffer */
    int n_buf[2];
    kvq_buf **buf[2];   /* K buffers, V buffers */
};

enum {
    ATTN_TARGET_GPU = 512, /* workgroups worth splitting positions for where b->target_groups is unknown: */
    ATTN_TARGET_CPU = 32,  /* enough to fill a large GPU, or the few cores of a software device */
    ATTN_MIN_BLOCKS = 2,   /* fewest blocks an attn_fused split gets (attn_dec: 1) */
    HD_MAX = 512,          /* shared-memory sizing of the shaders */
    DEC_HD_MAX = 256,      /* attn_dec: its accumulators (8 heads x up to 4 words) stay in registers */
    DEC_G = 8,             /* attn_dec: most query heads per workgroup */
};

static int is_q(kvq_cache_type t) { return t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4; }
static kvq_status kv_prepare(kvq_bctx *b, const kvq_kv_desc *d);

size_t kvq_vk_kv_row_bytes(kvq_cache_type t, int head_dim) { return (kvq_kv_row_bytes(t, head_dim) + 3) & ~(size_t)3; }

static void kv_release(kvq_bctx *b, kvq_kvbuf *kv) {
    for (int s = 0; s < 2; s++) {
        if (!kv->buf[s]) continue;
        for (int i = 0; i < kv->n_buf[s]; i++) vk_buf_free(b, kv->buf[s][i]);
        free(kv->buf[s]);
    }
    free(kv);
}

kvq_kvbuf *kvq_vk_kv_new(kvq_bctx *b, const kvq_kv_desc *d) {
    const int hd = d->head_dim;
    /* q8/q4 rows are whole blocks of 32; f16 values go two to a word */
    if (hd <= 0 || hd % 2 != 0 || hd > HD_MAX || ((is_q(d->type_k) || is_q(d->type_v)) && hd % KVQ_QK != 0)) {
        kvq_fail(KVQ_ERR_UNSUPPORTED,
                 "vulkan: KV cache head_dim %d not supported (even, a multiple of 32 for q8/q4, at most %d)", hd, HD_MAX);
        return NULL;
    }
    if ((d->rotate_k || d->rotate_v) && (hd & (hd - 1)) != 0) {
        kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: KV rotation needs a power-of-two head_dim, not %d", hd);
        return NULL;
    }
    if (d->n_layer <= 0 || d->n_ctx <= 0 || d->n_head_kv <= 0 || (unsigned)d->type_k > KVQ_CACHE_Q4 ||
        (unsigned)d->type_v > KVQ_CACHE_Q4) {
        kvq_fail(KVQ_ERR_ARG, "vulkan: bad KV cache shape or type");
        return NULL;
    }
    /* More than the device has can only fail (or, on drivers that overcommit, fail later): say so now. */
    VkDeviceSize heap = 0;
    for (uint32_t i = 0; i < b->mem_props.memoryHeapCount; i++)
        if (b->mem_props.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT && b->mem_props.memoryHeaps[i].size > heap)
            heap = b->mem_props.memoryHeaps[i].size;
    const double need = (double)kvq_vk_kv_bytes(b, d, 1) * d->n_ctx;
    if (heap && need > (double)heap) {
        kvq_fail(KVQ_ERR_NOMEM, "vulkan: the KV cache needs %.0f MiB, more than the device's %.0f MiB of memory; use a "
                 "smaller context or cache type", need / 1048576.0, (double)heap / 1048576.0);
        return NULL;
    }
    kvq_kvbuf *kv = calloc(1, sizeof *kv);
    if (!kv) {
        kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of host memory for the KV cache");
        return NULL;
    }
    kv->d = *d;
    const kvq_cache_type types[2] = {d->type_k, d->type_v};
    const size_t limit = b->max_buffer < UINT32_MAX ? (size_t)b->max_buffer : UINT32_MAX;
    for (int s = 0; s < 2; s++) {
        kv->row[s] = kvq_vk_kv_row_bytes(types[s], hd);
        if (!kvq_mul_ok((size_t)d->n_head_kv * d->n_ctx, kv->row[s], &kv->layer[s]) || kv->layer[s] > limit) {
            kvq_fail(KVQ_ERR_UNSUPPORTED,
                     "vulkan: one layer of the KV cache's %s (%d heads x %d positions) exceeds the device's buffer "
                     "limit of %zu bytes; use a smaller context",
                     s ? "V" : "K", d->n_head_kv, d->n_ctx, limit);
            kv_release(b, kv);
            return NULL;
        }
        size_t per = limit / kv->layer[s];
        kv->per_buf[s] = per < (size_t)d->n_layer ? (int)per : d->n_layer;
        kv->n_buf[s] = (d->n_layer + kv->per_buf[s] - 1) / kv->per_buf[s];
        kv->buf[s] = calloc((size_t)kv->n_buf[s], sizeof *kv->buf[s]);
        if (!kv->buf[s]) {
            kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of host memory for the KV cache");
            kv_release(b, kv);
            return NULL;
        }
        for (int i = 0; i < kv->n_buf[s]; i++) {
            int nl = d->n_layer - i * kv->per_buf[s];
            if (nl > kv->per_buf[s]) nl = kv->per_buf[s];
            kv->buf[s][i] = vk_buf_new(b, (size_t)nl * kv->layer[s], 0);
            if (!kv->buf[s][i]) {
                kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of device memory for the KV cache (%d positions, %zu bytes)",
                         d->n_ctx, kvq_vk_kv_bytes(b, d, d->n_ctx));
                kv_release(b, kv);
                return NULL;
            }
        }
    }
    if (kv_prepare(b, d) != KVQ_OK) {
        kv_release(b, kv);
        return NULL;
    }
    return kv;
}

void kvq_vk_kv_free(kvq_bctx *b, kvq_kvbuf *kv) {
    if (kv) kv_release(b, kv);
}

size_t kvq_vk_kv_bytes(kvq_bctx *b, const kvq_kv_desc *d, int positions) {
    (void)b;
    size_t row = kvq_vk_kv_row_bytes(d->type_k, d->head_dim) + kvq_vk_kv_row_bytes(d->type_v, d->head_dim);
    return (size_t)d->n_layer * d->n_head_kv * (size_t)positions * row;
}

/* Buffer and word offset of layer's K (s = 0) or V rows. */
static const kvq_buf *layer_buf(const kvq_kvbuf *kv, int s, int layer, uint32_t *word) {
    *word = (uint32_t)((size_t)(layer % kv->per_buf[s]) * kv->layer[s] / 4);
    return kv->buf[s][layer / kv->per_buf[s]];
}

/* kv_store, with rope of q and k first when q is given (kvq_vk_kv_store_rope). */
static void store(kvq_bctx *b, kvq_kvbuf *kv, int layer, kvq_buf *q, const kvq_buf *k, const kvq_buf *v, int n_head,
                  vk_bind cs, int pairs, int pos0, int n) {
    const kvq_kv_desc *d = &kv->d;
    if (n <= 0) return;
    if (layer < 0 || layer >= d->n_layer || pos0 < 0 || pos0 + n > d->n_ctx) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: kv_store of positions %d..%d (layer %d) outside the cache (%d positions)",
                 pos0, pos0 + n - 1, layer, d->n_ctx);
        return;
    }
    if (q && (n_head <= 0 || n_head % d->n_head_kv)) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: rope_kv_store of %d query heads over %d KV heads", n_head, d->n_head_kv);
        return;
    }
    struct {
        uint32_t n_head_kv, n_ctx, pos0, type_k, type_v, rot_k, rot_v, kbase, vbase, krow, vrow;
        float hscale;
        uint32_t t0, rope, pairs, n_head;
    } pc = {(uint32_t)d->n_head_kv, (uint32_t)d->n_ctx, 0, (uint32_t)d->type_k, (uint32_t)d->type_v,
            (uint32_t)!!d->rotate_k, (uint32_t)!!d->rotate_v, 0, 0, (uint32_t)(kv->row[0] / 4),
            (uint32_t)(kv->row[1] / 4), 1.0f / sqrtf((float)d->head_dim), 0, q != NULL, (uint32_t)!!pairs, (uint32_t)n_head};
    const kvq_buf *kb = layer_buf(kv, 0, layer, &pc.kbase), *vb = layer_buf(kv, 1, layer, &pc.vbase);
    const uint32_t spec[1] = {(uint32_t)d->head_dim};
    const vk_pipe *p = vk_pipe_get(b, "kv_store", spec, 1);
    vk_bind bind[6] = {vk_whole(k), vk_whole(v), vk_whole(kb), vk_whole(vb), q ? cs : vk_whole(b->dummy),
                       vk_whole(q ? q : b->dummy)};
    const int step = b->max_groups[1] < 65535 ? (int)b->max_groups[1] : 65535; /* tokens per dispatch (y) */
    for (int t0 = 0; t0 < n; t0 += step) {
        pc.t0 = (uint32_t)t0;
        pc.pos0 = (uint32_t)(pos0 + t0);
        vk_dispatch(b, p, bind, 6, &pc, sizeof pc, (uint32_t)d->n_head_kv, (uint32_t)(n - t0 < step ? n - t0 : step),
                    q ? 3 : 2);
    }
}

void kvq_vk_kv_store(kvq_bctx *b, kvq_kvbuf *kv, int layer, const kvq_buf *k, const kvq_buf *v, int pos0, int n) {
    store(b, kv, layer, NULL, k, v, 0, vk_whole(b->dummy), 0, pos0, n);
}

void kvq_vk_kv_store_rope(kvq_bctx *b, kvq_kvbuf *kv, int layer, kvq_buf *q, kvq_buf *k, const kvq_buf *v, int n_head,
                          int pos0, int n, const float *inv_freq, int mode) {
    if (n <= 0) return;
    vk_bind cs = vk_rope_table(b, n, kv->d.head_dim / 2, pos0, inv_freq);
    store(b, kv, layer, q, k, v, n_head, cs, mode == KVQ_ROPE_PAIRS, pos0, n);
}

/* ---- which attention pipeline, and how many workgroups ---- */

/* Positions per block of attn_fused (its BP): 64 for a single row, else 32. */
static int attn_bp(int R) { return R == 1 ? 64 : 32; }

/* Rows per attn_fused workgroup: enough to hold a decode step's GQA group or a
 * prompt tile, bounded so q rows (R x hd floats) stay within 8 KiB of shared memory. */
static int attn_rows(int rows, int hd) {
    int rmax = 2048 / hd;
    if (rmax > 16) rmax = 16;
    if (rmax < 1) rmax = 1;
    int r = 1;
    while (r < rows && r < rmax) r *= 2;
    return r < rmax ? r : rmax;
}

/* Words of one row's values as attn_dec stages them (scales apart). */
static int dec_data_words(kvq_cache_type t, int hd) {
    return t == KVQ_CACHE_F32 ? hd : t == KVQ_CACHE_F16 ? hd / 2 : t == KVQ_CACHE_Q8 ? hd / 4 : hd / 8;
}

/* Bytes of attn_dec's shared arrays (shaders/attn_dec.glsl, the same expressions). */
static size_t dec_shared(const kvq_kv_desc *d, int G, int bp, int i8, int sg) {
    const int hd = d->head_dim, nb = hd / KVQ_QK > 0 ? hd / KVQ_QK : 1;
    const int ks = (dec_data_words(d->type_k, hd) + (is_q(d->type_k) ? hd / KVQ_QK : 0)) | 1;
    const int vs = (dec_data_words(d->type_v, hd) + (is_q(d->type_v) ? hd / KVQ_QK : 0)) | 1;
    size_t w = (size_t)bp * (ks + vs) + (size_t)G * hd + (size_t)G * bp + G + (sg ? 64 * G : 64);
    if (i8) w += (size_t)G * hd / 4 + 2 * (size_t)G * nb;
    return 4 * w + 256; /* what a compiler may add in alignment */
}

kvq_vk_attn_dev kvq_vk_attn_dev_of(const kvq_bctx *b) {
    return (kvq_vk_attn_dev){.software = b->software, .target_groups = (int)b->target_groups,
                             .subgroup = b->caps.subgroup_arith, .int_dot = b->caps.int_dot,
                             .storage16 = b->caps.storage16, .dec = b->caps.attn_dec,
                             .shared_bytes = b->props.limits.maxComputeSharedMemorySize};
}

int kvq_vk_attn_exact_rows(void) { return VK_EXACT_ROWS; }

kvq_vk_attn_pipe kvq_vk_attn_pick(const kvq_vk_attn_dev *dev, const kvq_kv_desc *d, int n_rep, int n) {
    kvq_vk_attn_pipe p = {0};
    const int hd = d->head_dim;
    if (n == 1 && dev->dec && hd <= DEC_HD_MAX) {
        /* G heads in registers; one head: 64 rows a block (one invocation per row), else 32 (two) */
        const int G = n_rep < DEC_G ? n_rep : DEC_G, i8 = dev->int_dot && is_q(d->type_k);
        int bp = G == 1 ? 64 : 32;
        while (bp > 8 && dec_shared(d, G, bp, i8, dev->subgroup) > dev->shared_bytes) bp /= 2;
        if (dec_shared(d, G, bp, i8, dev->subgroup) <= dev->shared_bytes) {
            p.name = dev->subgroup ? (i8 ? "attn_dec_sg_i8" : "attn_dec_sg") : (i8 ? "attn_dec_i8" : "attn_dec");
            p.spec[0] = (uint32_t)hd, p.spec[1] = (uint32_t)G, p.spec[2] = (uint32_t)d->type_k;
            p.spec[3] = (uint32_t)d->type_v, p.spec[4] = (uint32_t)bp;
            p.n_spec = 5, p.dec = 1, p.int8 = i8, p.bp = bp;
            return p;
        }
    }
    /* attn_fused: _sg does the softmax max/sum with subgroupMax/subgroupAdd instead of R invocations
     * scanning shared memory; _h reads f16 K/V as 16-bit values (only worth a pipeline for f16) */
    const int R = attn_rows(n * n_rep, hd);
    const int h16 = dev->storage16 && (d->type_k == KVQ_CACHE_F16 || d->type_v == KVQ_CACHE_F16);
    p.name = dev->subgroup ? (h16 ? "attn_fused_sg_h" : "attn_fused_sg") : (h16 ? "attn_fused_h" : "attn_fused");
    p.spec[0] = (uint32_t)hd, p.spec[1] = (uint32_t)R, p.spec[2] = (uint32_t)d->type_k, p.spec[3] = (uint32_t)d->type_v;
    p.n_spec = 4, p.bp = attn_bp(R);
    return p;
}

static int cdiv(long a, long b) { return (int)((a + b - 1) / b); }

/* Splits: enough workgroups for the device (b->target_groups, from its compute units where
 * known), each split at least min_blocks blocks, the partials within budget. attn_dec also
 * splits a GQA group into tiles of fewer heads when a short context cannot give even half
 * the workgroups wanted (each tile reads the group's K/V again, from cache at that size). */
kvq_vk_attn_grid kvq_vk_attn_plan(const kvq_vk_attn_dev *dev, const kvq_kv_desc *d, const kvq_attn_desc *a,
                                  int pos0, int n, size_t budget) {
    kvq_vk_attn_grid g = {0};
    const int n_rep = a->n_head / a->n_head_kv, hd = d->head_dim;
    g.pipe = kvq_vk_attn_pick(dev, d, n_rep, n);
    const int bp = g.pipe.bp;
    const int lo = a->window > 0 && pos0 - a->window + 1 > 0 ? pos0 - a->window + 1 : 0;
    const int nb = (pos0 + n - 1) / bp - lo / bp + 1;
    const size_t split_bytes = (size_t)n * a->n_head * (size_t)(hd + 2) * sizeof(float);
    const int target = dev->target_groups > 0 ? dev->target_groups : dev->software ? ATTN_TARGET_CPU : ATTN_TARGET_GPU;
    int min_blocks = ATTN_MIN_BLOCKS;
    if (g.pipe.dec) {
        int tiles = cdiv(n_rep, (int)g.pipe.spec[1]);
        if ((long)a->n_head_kv * tiles * nb < target / 2) {
            const int want = cdiv(target, (long)a->n_head_kv * nb);
            if (want > tiles) tiles = want < n_rep ? want : n_rep;
        }
        g.ng = cdiv(n_rep, tiles);
        g.gx = cdiv(n_rep, g.ng);
        min_blocks = 1;
    } else {
        g.gx = cdiv((long)n * n_rep, (int)g.pipe.spec[1]);
    }
    g.gy = a->n_head_kv;
    int split = cdiv(target, (long)g.gx * g.gy), smax = cdiv(nb, min_blocks);
    if ((size_t)smax > budget / split_bytes) smax = (int)(budget / split_bytes);
    if (split > smax) split = smax;
    if (split < 1) split = 1;
    g.bps = cdiv(nb, split);
    g.gz = cdiv(nb, g.bps);
    return g;
}

/* Builds the pipelines this cache's kv_store and attention will use (names and spec constants from
 * kvq_vk_attn_pick, as the dispatch takes them), so no token pays for a pipeline build. */
static kvq_status kv_prepare(kvq_bctx *b, const kvq_kv_desc *d) {
    const uint32_t hd = (uint32_t)d->head_dim;
    int ok = vk_pipe_get(b, "kv_store", &hd, 1) && vk_pipe_get(b, "attn_merge", &hd, 1);
    if (ok && d->n_head > 0 && d->n_head % d->n_head_kv == 0) {
        const kvq_vk_attn_dev dev = kvq_vk_attn_dev_of(b);
        /* n = 1: decode and batches of up to VK_EXACT_ROWS (row by row); past them prompts, whose
         * tile height attn_rows gives is then its largest */
        for (int n = 1; ok && n <= VK_EXACT_ROWS + 1; n += VK_EXACT_ROWS) {
            const kvq_vk_attn_pipe p = kvq_vk_attn_pick(&dev, d, d->n_head / d->n_head_kv, n);
            ok = vk_pipe_get(b, p.name, p.spec, p.n_spec) != NULL;
        }
    }
    if (ok) return KVQ_OK;
    kvq_status s = kvq_fail(b->err ? b->err : KVQ_ERR_BACKEND, "%s", b->err_msg);
    b->err = KVQ_OK; /* reported here, not again at the next submit */
    return s;
}

/* Bytes of the split partials of queries pos0..pos0+n-1, aligned for a binding offset. */
static size_t part_bytes(kvq_bctx *b, const kvq_kvbuf *kv, const kvq_attn_desc *a, int pos0, int n, size_t budget) {
    const kvq_vk_attn_dev dev = kvq_vk_attn_dev_of(b);
    const kvq_vk_attn_grid g = kvq_vk_attn_plan(&dev, &kv->d, a, pos0, n, budget);
    const size_t bytes = (size_t)g.gz * n * a->n_head * (size_t)(kv->d.head_dim + 2) * sizeof(float);
    return (bytes + b->min_align - 1) & ~(size_t)(b->min_align - 1);
}

/* Queries pos0..pos0+n-1, whose q rows start at float q_off of q and whose
 * output rows at the same offset of out; the split partials take at most
 * budget bytes (the caller sized n for it) of scratch slot 0, bound from byte part_off with
 * range part_range (0: to the end, so a decode's descriptor sets stay the same as its splits grow). */
static void attn_chunk(kvq_bctx *b, const kvq_kvbuf *kv, int layer, const kvq_attn_desc *a, const kvq_buf *q,
                       kvq_buf *out, int pos0, int n, size_t q_off, size_t budget, size_t part_off, size_t part_range) {
    const kvq_kv_desc *d = &kv->d;
    const int hd = d->head_dim, n_rep = a->n_head / a->n_head_kv;
    const kvq_vk_attn_dev dev = kvq_vk_attn_dev_of(b);
    const kvq_vk_attn_grid g = kvq_vk_attn_plan(&dev, d, a, pos0, n, budget);
    const size_t nr = (size_t)n * a->n_head, acc_words = (size_t)g.gz * nr * hd;
    const size_t pbytes = part_bytes(b, kv, a, pos0, n, budget);
    kvq_buf *part = vk_scratch(b, 0, part_off + pbytes);
    if (!part) return;
    const vk_bind pb = {part->buf, part_off, part_range ? part_range : VK_WHOLE_SIZE, pbytes};
    const kvq_buf *kb, *vb;
    uint32_t kbase, vbase;
    kb = layer_buf(kv, 0, layer, &kbase), vb = layer_buf(kv, 1, layer, &vbase);
    const vk_pipe *p = vk_pipe_get(b, g.pipe.name, g.pipe.spec, g.pipe.n_spec);
    vk_bind bind[4] = {vk_whole(q), vk_whole(kb), vk_whole(vb), pb};
    if (g.pipe.dec) {
        struct {
            uint32_t pos, lo, n_ctx, n_head, n_rep, ng, rot_k, kbase, vbase, krow, vrow, bps, ml_off, q_off;
            float scale, hscale;
        } pc = {(uint32_t)pos0, (uint32_t)(a->window > 0 && pos0 - a->window + 1 > 0 ? pos0 - a->window + 1 : 0),
                (uint32_t)d->n_ctx, (uint32_t)a->n_head, (uint32_t)n_rep, (uint32_t)g.ng, (uint32_t)!!d->rotate_k,
                kbase, vbase, (uint32_t)(kv->row[0] / 4), (uint32_t)(kv->row[1] / 4), (uint32_t)g.bps,
                (uint32_t)acc_words, (uint32_t)q_off, a->scale, 1.0f / sqrtf((float)hd)};
        vk_dispatch(b, p, bind, 4, &pc, sizeof pc, (uint32_t)g.gx, (uint32_t)g.gy, (uint32_t)g.gz);
    } else {
        struct {
            uint32_t n, pos0, n_ctx, n_head, n_rep, window, rot_k, kbase, vbase, krow, vrow, bps, ml_off, q_off;
            float scale, hscale;
        } pc = {(uint32_t)n, (uint32_t)pos0, (uint32_t)d->n_ctx, (uint32_t)a->n_head, (uint32_t)n_rep,
                (uint32_t)(a->window > 0 ? a->window : 0), (uint32_t)!!d->rotate_k, kbase, vbase,
                (uint32_t)(kv->row[0] / 4), (uint32_t)(kv->row[1] / 4), (uint32_t)g.bps, (uint32_t)acc_words,
                (uint32_t)q_off, a->scale, 1.0f / sqrtf((float)hd)};
        vk_dispatch(b, p, bind, 4, &pc, sizeof pc, (uint32_t)g.gx, (uint32_t)g.gy, (uint32_t)g.gz);
    }

    struct {
        uint32_t n_rows, n_split, n_head, rot_v, ml_off, o_off;
        float hscale;
    } mc = {(uint32_t)nr, (uint32_t)g.gz, (uint32_t)a->n_head, (uint32_t)!!d->rotate_v, (uint32_t)acc_words,
            (uint32_t)q_off, 1.0f / sqrtf((float)hd)};
    const uint32_t mspec[1] = {(uint32_t)hd};
    vk_bind mb[2] = {pb, vk_whole(out)};
    vk_dispatch(b, vk_pipe_get(b, "attn_merge", mspec, 1), mb, 2, &mc, sizeof mc, (uint32_t)a->n_head, (uint32_t)n, 1);
}

void kvq_vk_attention(kvq_bctx *b, const kvq_kvbuf *kv, int layer, const kvq_attn_desc *a, const kvq_buf *q,
                      kvq_buf *out, int pos0, int n) {
    const kvq_kv_desc *d = &kv->d;
    if (n <= 0) return;
    if (layer < 0 || layer >= d->n_layer || pos0 < 0 || pos0 + n > d->n_ctx || a->head_dim != d->head_dim ||
        a->n_head_kv != d->n_head_kv || a->n_head <= 0 || a->n_head % a->n_head_kv != 0) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: attention call (layer %d, positions %d..%d, %d/%d heads) does not fit the cache",
                 layer, pos0, pos0 + n - 1, a->n_head, a->n_head_kv);
        return;
    }
    /* Long prompts go in chunks of queries so the partials stay one bindable
     * buffer (vk_scratch adds a quarter on top) with 32-bit word offsets. */
    size_t budget = (size_t)(b->max_buffer < UINT32_MAX ? b->max_buffer : UINT32_MAX) / 2;
    const size_t per_query = (size_t)a->n_head * (d->head_dim + 2) * sizeof(float);
    if (budget < per_query) {
        vk_error(b, KVQ_ERR_UNSUPPORTED, "vulkan: attention scratch for one query (%zu bytes) exceeds the buffer limit",
                 per_query);
        return;
    }
    if (n <= VK_EXACT_ROWS) {
        /* a small batch (a speculative verify): each query as its own decode, the same pipeline
         * and splits as a one-token step at its position, so its row is decode's bit for bit;
         * each its own range of the partials (a power-of-two stride, so the descriptor sets
         * repeat from step to step), so the rows run side by side */
        size_t stride = 0;
        for (int i = 0; i < n; i++) {
            size_t pb = part_bytes(b, kv, a, pos0 + i, 1, budget);
            stride = pb > stride ? pb : stride;
        }
        size_t p2 = b->min_align;
        while (p2 < stride) p2 *= 2;
        if (!vk_scratch(b, 0, (size_t)n * p2)) return;
        for (int i = 0; i < n; i++)
            attn_chunk(b, kv, layer, a, q, out, pos0 + i, 1, (size_t)i * a->n_head * d->head_dim, budget,
                       (size_t)i * p2, n > 1 ? p2 : 0);
        return;
    }
    size_t chunk = budget / per_query;
    if (chunk > 65535) chunk = 65535; /* the merge pass puts queries on y */
    if (chunk > (size_t)n) chunk = (size_t)n;
    for (int q0 = 0; q0 < n; q0 += (int)chunk) {
        const int nq = n - q0 < (int)chunk ? n - q0 : (int)chunk;
        attn_chunk(b, kv, layer, a, q, out, pos0 + q0, nq, (size_t)q0 * a->n_head * d->head_dim, budget, 0, 0);
    }
}

static kvq_status rows_ok(const kvq_kvbuf *kv, int layer, int pos0, int n, const char *what) {
    if (layer < 0 || layer >= kv->d.n_layer || pos0 < 0 || n < 0 || n > kv->d.n_ctx - pos0)
        return kvq_fail(KVQ_ERR_ARG, "vulkan: %s of positions %d..%d of layer %d outside the cache", what, pos0, pos0 + n, layer);
    return KVQ_OK;
}

/* One copy region per KV head: its rows pos0.. are adjacent in the layer (padded rows). */
static void head_regions(const kvq_kvbuf *kv, int s, uint32_t word, int pos0, int n, VkBufferCopy *reg, int to_host) {
    const size_t span = (size_t)n * kv->row[s];
    for (int h = 0; h < kv->d.n_head_kv; h++) {
        size_t dev = (size_t)word * 4 + ((size_t)h * kv->d.n_ctx + (size_t)pos0) * kv->row[s], host = (size_t)h * span;
        reg[h] = (VkBufferCopy){.srcOffset = to_host ? dev : host, .dstOffset = to_host ? host : dev, .size = span};
    }
}

kvq_status kvq_vk_kv_read(kvq_bctx *b, const kvq_kvbuf *kv, int layer, int v, int pos0, int n, void *dst) {
    const int s = v ? 1 : 0;
    kvq_status st = rows_ok(kv, layer, pos0, n, "kv_read");
    if (st || n == 0) return st;
    uint32_t word;
    const kvq_buf *src = layer_buf(kv, s, layer, &word);
    const size_t rows = (size_t)kv->d.n_head_kv * n;
    kvq_buf *host = vk_buf_new(b, rows * kv->row[s], 1);
    VkBufferCopy *reg = malloc(sizeof *reg * (size_t)kv->d.n_head_kv);
    if (!host || !reg) {
        free(reg);
        vk_buf_free(b, host);
        return kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of memory reading %zu KV rows", rows);
    }
    head_regions(kv, s, word, pos0, n, reg, 1);
    vk_record_copy_regions(b, src, host, reg, (uint32_t)kv->d.n_head_kv);
    st = vk_submit(b);
    if (st == KVQ_OK) {
        const size_t rb = kvq_kv_row_bytes(s ? kv->d.type_v : kv->d.type_k, kv->d.head_dim);
        for (size_t r = 0; r < rows; r++) memcpy((uint8_t *)dst + r * rb, (const uint8_t *)host->map + r * kv->row[s], rb);
    }
    free(reg);
    vk_buf_free(b, host);
    return st;
}

kvq_status kvq_vk_kv_write(kvq_bctx *b, kvq_kvbuf *kv, int layer, int v, int pos0, int n, const void *src) {
    const int s = v ? 1 : 0;
    kvq_status st = rows_ok(kv, layer, pos0, n, "kv_write");
    if (st || n == 0) return st;
    uint32_t word;
    kvq_buf *dstb = (kvq_buf *)layer_buf(kv, s, layer, &word);
    const size_t rows = (size_t)kv->d.n_head_kv * n, rb = kvq_kv_row_bytes(s ? kv->d.type_v : kv->d.type_k, kv->d.head_dim);
    uint8_t *padded = calloc(rows, kv->row[s]); /* rows padded as stored, the padding zero */
    if (!padded) return kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of memory writing %zu KV rows", rows);
    for (size_t r = 0; r < rows; r++) memcpy(padded + r * kv->row[s], (const uint8_t *)src + r * rb, rb);
    const size_t span = (size_t)n * kv->row[s];
    for (int h = 0; h < kv->d.n_head_kv; h++) /* vk_record_write copies into the staging ring now */
        vk_record_write(b, dstb, (size_t)word * 4 + ((size_t)h * kv->d.n_ctx + (size_t)pos0) * kv->row[s], padded + h * span, span);
    free(padded);
    return KVQ_OK;
}
