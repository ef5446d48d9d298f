/* Vulkan matmul and get_rows: picks the shader for the weight's format and the
 * token count, and dispatches it once per row piece (vk_weights.h).
 *
 *   n <= VK_EXACT_ROWS  in pieces of at most VEC_MAX_N tokens (push constant t0), each
 *                   token's sums formed as in a one-token decode (a speculative verify's rows
 *                   equal plain decode's bit for bit); dense: mm_dense_vec; AQLM 8-bit: mm_lut (lookup tables in shared
 *                   memory; mm_lut_h keeps them as fp16, w->lut16); AQLM 9..16-bit:
 *                   mm_gather. The AQLM ones split the code chunks over workgroups when
 *                   the rows alone give too few, and mm_reduce adds the partial sums
 *                   (scale, bias) unless their last workgroup does.
 *   n >  VK_EXACT_ROWS  mm_tile: 64x64 tiles, weights dequantized into shared memory;
 *                   AQLM from VK_I8T_MIN_N tokens on, unless exact or without integer
 *                   dot products: mm_tile_i8, the int8 tiles (vk_tile_i8.c).
 *
 * matmul_key / get_rows_key name the pipeline; kvq_vk_matmul_prepare builds every one a
 * weight can need at upload, through the same functions, so no token waits for a compile. */
#include "vulkan/vk_tile_i8.h"

#define VEC_MAX_N 4
#define LUT_ROWS_PER_WG (256 * 4)    /* mm_lut: 256 invocations x RPT 4 */
#define GATHER_ROWS_PER_WG (256 * 2) /* mm_gather: RPT 2 */
#define DENSE_VEC_ROWS 64 /* mm_dense_vec: 8 teams x 8 rows */
#define TILE 64

static uint32_t cdiv(size_t a, size_t b) { return (uint32_t)((a + b - 1) / b); }

static vk_bind opt(kvq_bctx *b, const kvq_buf *x) { return vk_whole(x ? x : b->dummy); }

/* Workgroups a matvec should spread over: enough to fill a GPU's compute units
 * (not known through core Vulkan; 256 covers the large ones); a handful on a CPU device.
 * KVQ_VK_TARGET_GROUPS overrides it (tuning; counting a GPU's dispatches on lavapipe). */
static uint32_t target_groups(const kvq_bctx *b) { return b->target_groups ? b->target_groups : b->software ? 8 : 256; }
/* Code chunks each split at least takes on a GPU: the partial sums (8 bytes per row
 * and split, written and read) stay within a quarter of the code bytes (16 per chunk). */
#define MIN_CHUNKS_PER_SPLIT 2
/* At most this many splits: the last workgroup's reduce loads each row's partials 8 at a time
 * (shaders/mm_sum.glsl), so 32 splits are 4 dependent L2 round trips per row instead of up to
 * 86 (a 7B down projection at 256 target groups); past that, more workgroups than the GPU
 * wanted are not worth a longer serial tail. */
#define MM_SPLIT_MAX 32
#define PART_RING 4

/* Zeroed counters (one per row block, and one past them for VK_MM_NORM's last workgroup
 * of the dispatch) for a split matvec's last-workgroup reduce, from a ring
 * beside the partial sums' (scratch slot 5, zeroed whenever it is made; the last workgroup
 * of each row block clears its own). The dummy binding when it cannot be had. */
static vk_bind counters(kvq_bctx *b, uint32_t gx) {
    size_t need = ((size_t)(gx + 1) * 4 + b->min_align - 1) & ~(size_t)(b->min_align - 1);
    kvq_buf *c = vk_scratch(b, 5, PART_RING * need);
    if (!c) return vk_whole(b->dummy);
    if (b->cnt_zeroed != c) {
        vk_record_fill(b, c, 0, c->bytes & ~(size_t)3, 0);
        b->cnt_zeroed = c;
        b->cnt_off = 0;
    }
    if (b->cnt_off + need > c->bytes) b->cnt_off = 0;
    vk_bind r = {c->buf, b->cnt_off, need, need};
    b->cnt_off += need;
    return r;
}

/* A pipeline: shader name and spec constants, and which host path dispatches it. */
enum { PK_TILE, PK_TILE_I8, PK_AQLM_VEC, PK_DENSE_VEC, PK_ROWS };
typedef struct {
    int kind;
    const char *name;
    uint32_t spec[5];
    int n_spec;
} vk_pkey;

static const vk_pipe *pipe_of(kvq_bctx *b, const vk_pkey *k) { return vk_pipe_get(b, k->name, k->spec, k->n_spec); }

/* Spec constants FMT, M, IG, NB, CS shared by mm_tile and get_rows (dense: fixed
 * filler values so all dense weights of a format share one pipeline). */
static void fmt_spec(const kvq_wt *w, uint32_t spec[5]) {
    int aq = w->fmt == KVQ_W_AQLM;
    spec[0] = kvq_vk_fmt_code(w->fmt);
    spec[1] = aq ? (uint32_t)w->M : 1;
    spec[2] = aq ? (uint32_t)w->ig : 8;
    spec[3] = aq ? (uint32_t)w->nbits : 8;
    spec[4] = aq ? (uint32_t)w->cs : 1;
}

/* Tokens of a vector-path piece: the pieces of n tokens are VEC_MAX_N each, the last one n's rest. */
static int vec_nt(int n) { return n < VEC_MAX_N ? n : VEC_MAX_N; }

/* The pipeline a matmul of w over n >= 1 tokens runs (the only place that chooses it); for the
 * vector paths, that of a piece of min(n, VEC_MAX_N) tokens. */
static vk_pkey matmul_key(const kvq_bctx *b, const kvq_wt *w, int n) {
    vk_pkey k = {0};
    if (kvq_vk_i8t_wanted(b, w, n)) {
        k.kind = PK_TILE_I8, k.name = "mm_tile_i8", k.n_spec = 4;
        kvq_vk_i8t_spec(w, k.spec);
    } else if (n > VK_EXACT_ROWS) {
        k.kind = PK_TILE, k.name = "mm_tile", k.n_spec = 5;
        fmt_spec(w, k.spec);
    } else if (w->fmt == KVQ_W_AQLM) {
        int lut = w->nbits == 8;
        k.kind = PK_AQLM_VEC;
        k.name = !lut ? "mm_gather" : w->lut16 ? "mm_lut_h" : "mm_lut";
        k.n_spec = lut ? 3 : 4;
        k.spec[0] = (uint32_t)w->M, k.spec[1] = (uint32_t)w->ig, k.spec[2] = (uint32_t)vec_nt(n), k.spec[3] = (uint32_t)w->nbits;
    } else {
        k.kind = PK_DENSE_VEC, k.name = "mm_dense_vec", k.n_spec = 2;
        k.spec[0] = kvq_vk_fmt_code(w->fmt), k.spec[1] = (uint32_t)vec_nt(n);
    }
    return k;
}

static vk_pkey get_rows_key(const kvq_wt *w) {
    vk_pkey k = {.kind = PK_ROWS, .name = "get_rows", .n_spec = 5};
    fmt_spec(w, k.spec);
    return k;
}

/* Workgroups along the code chunks for an AQLM matvec of a piece with gx row blocks;
 * *cps = chunks per split. */
static uint32_t aqlm_splits(const kvq_bctx *b, const kvq_wt *w, uint32_t gx, uint32_t *cps) {
    uint32_t chunks = (uint32_t)w->n_chunks, nsplit = target_groups(b) / gx;
    if (target_groups(b) > 8 && nsplit > chunks / MIN_CHUNKS_PER_SPLIT) nsplit = chunks / MIN_CHUNKS_PER_SPLIT;
    if (nsplit > chunks) nsplit = chunks;
    if (nsplit > MM_SPLIT_MAX) nsplit = MM_SPLIT_MAX;
    if (nsplit < 1) nsplit = 1;
    *cps = cdiv(chunks, nsplit);
    return cdiv(chunks, *cps);
}

static uint32_t aqlm_rows_per_wg(const kvq_wt *w) { return w->nbits == 8 ? LUT_ROWS_PER_WG : GATHER_ROWS_PER_WG; }

static void matvec_aqlm(kvq_bctx *b, const kvq_wt *w, const vk_pipe *p, vk_bind x, vk_bind y, int t0, int n,
                        const vk_mm_fuse *f) {
    const vk_pipe *red = NULL;
    uint32_t per_wg = aqlm_rows_per_wg(w), flags = (w->bias ? 1u : 0u) | (f ? f->flags : 0u);
    for (int i = 0; i < w->n_pieces; i++) {
        const vk_piece *pc_ = &w->pieces[i];
        uint32_t gx = cdiv((size_t)pc_->rows, per_wg), chunks = (uint32_t)w->n_chunks, cps;
        uint32_t nsplit = aqlm_splits(b, w, gx, &cps);
        kvq_buf *part = NULL;
        vk_bind pb = {0}, cb = vk_whole(b->dummy);
        int fused = 0;
        if (nsplit > 1) {
            /* partial sums in a ring of PART_RING matvecs' worth: consecutive matvecs (q, k, v)
             * write different ranges, so none waits for the one before to be reduced */
            size_t need = ((size_t)nsplit * (size_t)n * (size_t)pc_->rows * sizeof(float) + b->min_align - 1) &
                          ~(size_t)(b->min_align - 1);
            part = vk_scratch(b, 4, PART_RING * need);
            if (!part) return;
            if (b->part_off + need > part->bytes) b->part_off = 0;
            pb = (vk_bind){part->buf, b->part_off, need, need};
            b->part_off += need;
            fused = b->caps.fused_reduce && (cb = counters(b, gx)).buf != b->dummy->buf;
            if (!fused && !red) red = vk_pipe_get(b, "mm_reduce", NULL, 0);
        } else if (flags & VK_MM_NORM) {
            cb = counters(b, gx); /* the last workgroup of the dispatch norms */
        }
        struct {
            uint32_t rows_p, row0, rows_total, cols, n_chunks, cps, flags, n;
            float cb_l1; /* mm_lut_h's scale (mm_lut.glsl) */
            float eps;   /* VK_MM_NORM's */
            uint32_t t0; /* the piece's first token in x and y */
        } pc = {(uint32_t)pc_->rows, (uint32_t)pc_->row0, (uint32_t)w->rows, (uint32_t)w->cols,
                chunks, cps, flags | (part ? 2u : 0u) | (fused ? 4u : 0u), (uint32_t)n, w->cb_l1, f ? f->eps : 0.0f,
                (uint32_t)t0};
        vk_bind d = vk_whole(b->dummy);
        vk_bind bind[11] = {vk_whole(pc_->buf), vk_whole(w->codebooks), x, part ? pb : y, vk_whole(w->scales),
                            opt(b, w->bias), fused ? y : d, cb, f && (f->flags & VK_MM_GLU) ? f->up : d,
                            f && (f->flags & VK_MM_NORM) ? f->gain : d, f && (f->flags & VK_MM_NORM) ? f->h : d};
        /* beside the reduces held back from the matvecs before it (q, k, v share their input) */
        vk_dispatch_beside(b, p, bind, 11, &pc, sizeof pc, gx, nsplit, 1);
        if (part && !fused) {
            struct {
                uint32_t rows_p, row0, rows_total, n, nsplit, flags, t0;
            } rc = {(uint32_t)pc_->rows, (uint32_t)pc_->row0, (uint32_t)w->rows, (uint32_t)n, nsplit, flags & 1u, (uint32_t)t0};
            vk_bind rb[6] = {pb, vk_whole(b->dummy), vk_whole(b->dummy),
                             y, vk_whole(w->scales), opt(b, w->bias)};
            vk_dispatch_later(b, red, rb, 6, &rc, sizeof rc, cdiv((size_t)pc_->rows, 512), (uint32_t)n, 1);
        }
    }
}

/* Push constants shared by mm_dense_vec and mm_tile. */
typedef struct {
    uint32_t rows_p, row0, rows_total, cols, stride, n, flags;
} dense_pc;

static void matvec_dense(kvq_bctx *b, const kvq_wt *w, const vk_pipe *p, vk_bind x, vk_bind y, int t0, int n) {
    for (int i = 0; i < w->n_pieces; i++) {
        const vk_piece *pp = &w->pieces[i];
        struct {
            dense_pc d;
            uint32_t t0;
        } pc = {{(uint32_t)pp->rows, (uint32_t)pp->row0, (uint32_t)w->rows, (uint32_t)w->cols, (uint32_t)w->stride,
                 (uint32_t)n, w->bias ? 1u : 0u}, (uint32_t)t0};
        vk_bind bind[6] = {vk_whole(pp->buf), vk_whole(b->dummy), x, y, vk_whole(b->dummy), opt(b, w->bias)};
        vk_dispatch(b, p, bind, 6, &pc, sizeof pc, cdiv((size_t)pp->rows, DENSE_VEC_ROWS), 1, 1);
    }
}

static void matmul_tiled(kvq_bctx *b, const kvq_wt *w, const vk_pipe *p, vk_bind x, vk_bind y, int n) {
    for (int i = 0; i < w->n_pieces; i++) {
        const vk_piece *pp = &w->pieces[i];
        dense_pc pc = {(uint32_t)pp->rows, (uint32_t)pp->row0, (uint32_t)w->rows, (uint32_t)w->cols,
                       (uint32_t)w->stride, (uint32_t)n, w->bias ? 1u : 0u};
        vk_bind bind[6] = {vk_whole(pp->buf), opt(b, w->codebooks), x, y, opt(b, w->scales), opt(b, w->bias)};
        vk_dispatch(b, p, bind, 6, &pc, sizeof pc, cdiv((size_t)pp->rows, TILE), cdiv((size_t)n, TILE), 1);
    }
}

/* The vector paths over n <= VK_EXACT_ROWS tokens: pieces of VEC_MAX_N and the rest, so each
 * token's sums come out as a one-token decode's whatever the batch. */
static void vec_pieces(kvq_bctx *b, const kvq_wt *w, const vk_pkey *k, vk_bind x, vk_bind y, int n,
                       const vk_mm_fuse *f) {
    for (int t0 = 0; t0 < n; t0 += VEC_MAX_N) {
        const int nt = vec_nt(n - t0);
        vk_pkey kp = matmul_key(b, w, nt);
        const vk_pipe *p = nt == vec_nt(n) ? pipe_of(b, k) : pipe_of(b, &kp);
        if (k->kind == PK_AQLM_VEC)
            matvec_aqlm(b, w, p, x, y, t0, nt, f);
        else
            matvec_dense(b, w, p, x, y, t0, nt);
    }
}

void kvq_vk_matmul_at(kvq_bctx *b, const kvq_wt *w, vk_bind x, vk_bind y, int n) {
    if (n <= 0) return;
    vk_pkey k = matmul_key(b, w, n); /* the path follows the key: dispatch and prepare agree */
    const vk_pipe *p = pipe_of(b, &k);
    if (k.kind == PK_TILE)
        matmul_tiled(b, w, p, x, y, n);
    else if (k.kind == PK_TILE_I8)
        kvq_vk_matmul_i8t(b, w, p, x, y, n);
    else
        vec_pieces(b, w, &k, x, y, n, NULL);
}

int kvq_vk_matmul_fusable(const kvq_bctx *b, const kvq_wt *w, int n) {
    return n >= 1 && n <= VK_EXACT_ROWS && w->fmt == KVQ_W_AQLM && w->n_pieces == 1 && b->caps.fused_reduce;
}

void kvq_vk_matmul_fused(kvq_bctx *b, const kvq_wt *w, vk_bind x, vk_bind y, int n, const vk_mm_fuse *f) {
    vk_pkey k = matmul_key(b, w, n);
    vec_pieces(b, w, &k, x, y, n, f);
}

void kvq_vk_matmul(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n) {
    kvq_vk_matmul_at(b, w, vk_whole(x), vk_whole(y), n);
}

void kvq_vk_get_rows(kvq_bctx *b, const kvq_wt *w, const int32_t *ids, int n, kvq_buf *out) {
    if (n <= 0) return;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->rows) {
            vk_error(b, KVQ_ERR_ARG, "get_rows: id %d out of range (the weight has %d rows)", (int)ids[i], w->rows);
            return;
        }
    vk_pkey key = get_rows_key(w);
    const vk_pipe *p = pipe_of(b, &key);
    vk_bind idb = vk_stage(b, ids, (size_t)n * sizeof *ids);
    for (int i = 0; i < w->n_pieces; i++) {
        const vk_piece *pp = &w->pieces[i];
        int used = 0;
        for (int k = 0; k < n && !used; k++) used = ids[k] >= pp->row0 && ids[k] < pp->row0 + pp->rows;
        if (!used) continue;
        struct {
            uint32_t rows_p, row0, cols, stride, n;
        } pc = {(uint32_t)pp->rows, (uint32_t)pp->row0, (uint32_t)w->cols, (uint32_t)w->stride, (uint32_t)n};
        vk_bind bind[5] = {vk_whole(pp->buf), opt(b, w->codebooks), idb, vk_whole(out), opt(b, w->scales)};
        bind[0].bytes = (VkDeviceSize)n * (pp->buf->bytes / (size_t)pp->rows); /* the profile: rows read, not the table */
        vk_dispatch(b, p, bind, 5, &pc, sizeof pc, cdiv(cdiv((size_t)w->cols, 8), 64), (uint32_t)n, 1);
    }
}

kvq_status kvq_vk_matmul_prepare(kvq_bctx *b, const kvq_wt *w, int rows_only) {
    vk_pkey k = get_rows_key(w);
    pipe_of(b, &k);
    /* n = 1..VEC_MAX_N: the vector pieces of decode and small batches (and MoE experts a few rows
     * pick); VK_EXACT_ROWS + 1: tiles; VK_I8T_MIN_N: the int8 tiles where the weight takes them */
    for (int n = 1; n <= VEC_MAX_N + 1 && !rows_only; n++) {
        k = matmul_key(b, w, n > VEC_MAX_N ? VK_EXACT_ROWS + 1 : n);
        pipe_of(b, &k);
    }
    if (!rows_only && kvq_vk_i8t_wanted(b, w, VK_I8T_MIN_N)) {
        k = matmul_key(b, w, VK_I8T_MIN_N);
        pipe_of(b, &k);
        kvq_vk_i8t_prepare(b);
    }
    if (!rows_only && w->fmt == KVQ_W_AQLM && !b->caps.fused_reduce)
        for (int i = 0; i < w->n_pieces; i++) {
            uint32_t cps;
            if (aqlm_splits(b, w, cdiv((size_t)w->pieces[i].rows, aqlm_rows_per_wg(w)), &cps) > 1) {
                vk_pipe_get(b, "mm_reduce", NULL, 0);
                break;
            }
        }
    return b->err ? vk_submit(b) : KVQ_OK;
}
