/* Quantized KV cache on the CPU: storing rows, and the fused attention driver.
 *
 * The driver splits one attention call into work items (KV head g, tile of
 * queries, chunk of positions). An item owns all query heads of g's GQA group
 * for its queries, so each K/V row is streamed from memory once per group; it
 * walks its positions in blocks of KVQ_ATTN_BP with an online softmax (running
 * max m, sum l, unnormalised output acc per query row), calling the per-ISA
 * kernels (attn/attn_kernels.h) for q·k, exp and V accumulation. When there are
 * too few (head, tile) items to keep every thread busy — long contexts with
 * few KV heads — the positions are split into chunks (split-K) whose partial
 * (m, l, acc) are merged afterwards. A call of up to KVQ_CPU_EXACT_ROWS queries
 * cuts its chunks at fixed absolute positions, as a one-token decode does, so
 * each row gets the bits of its own decode (speculative verification and the
 * server's batched decode rely on it); longer prompts cut their range evenly.
 * Rotation: q is rotated once per item when K is stored rotated, the output
 * un-rotated once when V is. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/attn/attn_kernels.h"
#include "cpu/cpu_kernels.h"
#include "ref/ref.h"
#include "util.h"

/* ---- store ---- */

/* Quantizing a row is a few hundred scalar ops against the matmuls that
 * produced it, so the reference quantizer (the format's spec) is used as is;
 * a SIMD store can replace it here if it ever shows in a profile. */
void kvq_cpu_kv_store_row(kvq_cache_type t, int rotate, const float *x, void *row, int head_dim) {
    kvq_ref_kv_store_row(t, rotate, x, row, head_dim);
}

/* ---- attention driver ---- */

const kvq_attn_kernels *kvq_attn_kernels_for(int isa) {
    switch (isa) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX2: return &kvq_attn_avx2;
    case KVQ_ISA_AVX512: return &kvq_attn_avx512;
#endif
#if defined(__aarch64__)
    case KVQ_ISA_NEON: return &kvq_attn_neon;
#endif
    default: return &kvq_attn_scalar;
    }
}

enum {
    ROWS_MAX = 16,   /* query rows per item when tiling prompt queries */
    MIN_SPLIT = 256, /* fewest positions worth a split-K chunk of their own */
};

typedef struct {
    const kvq_cpu_attn_args *args;
    const kvq_attn_kernels *kern;
    const float *q;
    float *out;
    int pos0, n, n_rep, qt, n_tiles, n_split, rows_max;
    int chunk, chunk0; /* chunk > 0: split-K chunk c is [(chunk0 + c) * chunk, +chunk) (exact_split) */
    size_t kb, vb, prep_bytes;
    float *part; /* n_split > 1: per item, rows_max × (m, l, acc[hd]) */
} plan;

typedef struct {
    float *q, *s, *acc, *m, *l, *f;
    void *prep;
} scratch;

/* First position query i (0-based in this call) may see. */
static int first_visible(const plan *p, int i) {
    int pos = p->pos0 + i, w = p->args->a.window;
    return w > 0 && pos - w + 1 > 0 ? pos - w + 1 : 0;
}

/* Start of split-K chunk c of [lo, lo+len): inner cuts on block boundaries (see run_item). */
static int split_point(int lo, int len, int c, int n_split) {
    if (c == 0) return lo;
    if (c == n_split) return lo + len;
    const int x = (lo + (int)((long long)len * c / n_split)) / KVQ_ATTN_BP * KVQ_ATTN_BP;
    return x > lo ? x : lo;
}

/* Steps of up to KVQ_CPU_EXACT_ROWS rows (decode is one): split-K, when the
 * KV heads alone leave threads idle, into chunks of positions fixed by the
 * context's size, not by the call: a decode and a batch then cut a row's
 * positions at the same places and merge the same partials in the same
 * order (a chunk a row does not see merges as an exact no-op). At most 16
 * chunks over a full context keep the partials small. */
static void exact_split(plan *p, int nt) {
    const kvq_cpu_attn_args *A = p->args;
    if (nt <= 1 || A->a.n_head_kv >= 2 * nt) return;
    int c = (A->n_ctx + 15) / 16;
    c = (c + KVQ_ATTN_BP - 1) / KVQ_ATTN_BP * KVQ_ATTN_BP;
    p->chunk = c > 2 * MIN_SPLIT ? c : 2 * MIN_SPLIT;
    p->chunk0 = first_visible(p, 0) / p->chunk; /* the earliest position any row sees */
    p->n_split = (p->pos0 + p->n - 1) / p->chunk - p->chunk0 + 1;
}

static float *out_row(const plan *p, int g, int i, int j) {
    const kvq_attn_desc *a = &p->args->a;
    return p->out + ((size_t)i * a->n_head + (size_t)g * p->n_rep + j) * a->head_dim;
}

static void rotate(const plan *p, float *x, int n) {
    if (p->kern->hadamard)
        p->kern->hadamard(x, n);
    else
        kvq_ref_hadamard(x, n);
}

static void finish_row(const plan *p, const float *acc, float l, float *o) {
    const int hd = p->args->a.head_dim;
    float il = 1.0f / l;
    for (int x = 0; x < hd; x++) o[x] = acc[x] * il;
    if (p->args->rotate_v) rotate(p, o, hd);
}

/* Online softmax over positions [c0, c1) for the rows of (KV head g, query tile t). */
static void run_item(const plan *p, scratch *sc, int g, int t, int c0, int c1, float *part) {
    const kvq_cpu_attn_args *A = p->args;
    const int hd = A->a.head_dim, n_rep = p->n_rep;
    const int i0 = t * p->qt, nq = p->n - i0 < p->qt ? p->n - i0 : p->qt, nr = nq * n_rep;
    for (int qi = 0; qi < nq; qi++)
        for (int j = 0; j < n_rep; j++) {
            const float *src = p->q + ((size_t)(i0 + qi) * A->a.n_head + (size_t)g * n_rep + j) * hd;
            float *dst = sc->q + (size_t)(qi * n_rep + j) * hd;
            for (int x = 0; x < hd; x++) dst[x] = src[x] * A->a.scale;
            if (A->rotate_k) rotate(p, dst, hd);
        }
    if (p->prep_bytes) p->kern->q_prep(A->type_k, sc->q, nr, hd, sc->prep);
    for (int r = 0; r < nr; r++) {
        sc->m[r] = -INFINITY;
        sc->l[r] = 0.0f;
    }
    memset(sc->acc, 0, (size_t)nr * hd * sizeof(float));
    const uint8_t *kbase = A->k + (size_t)g * A->n_ctx * p->kb, *vbase = A->v + (size_t)g * A->n_ctx * p->vb;

    /* Blocks are fixed spans of absolute positions [64k, 64k+64), cut to
     * [c0, c1): a row's block then holds the same visible positions however
     * the positions were split into items (decode vs prompt tiles, split-K),
     * which kernels that round the weights of a block (av_blk) rely on. */
    const int blk = p->kern->av_blk_types && (p->kern->av_blk_types() >> A->type_v & 1);
    for (int b0 = c0; b0 < c1;) {
        const int b1 = (b0 / KVQ_ATTN_BP + 1) * KVQ_ATTN_BP, np = (c1 < b1 ? c1 : b1) - b0;
        p->kern->qk(A->type_k, kbase + (size_t)b0 * p->kb, p->kb, np, sc->q, sc->prep, nr, hd, sc->s);
        /* Rows of a prompt tile see different ranges (causal, window): mask per row. */
        for (int r = 0; r < nr; r++) {
            const int i = i0 + r / n_rep;
            float *s = sc->s + (size_t)r * KVQ_ATTN_BP;
            int x0 = first_visible(p, i) - b0, x1 = p->pos0 + i - b0;
            if (x0 < 0) x0 = 0;
            if (x1 > np - 1) x1 = np - 1;
            sc->f[r] = 0.0f;
            if (x0 > x1) {
                memset(s, 0, (size_t)np * sizeof *s);
                continue;
            }
            for (int x = 0; x < x0; x++) s[x] = -INFINITY;
            for (int x = x1 + 1; x < np; x++) s[x] = -INFINITY;
            float bm = p->kern->max(s + x0, x1 - x0 + 1);
            if (bm > sc->m[r]) {
                if (sc->l[r] > 0.0f) { /* rescale what was accumulated under the old max */
                    float f = expf(sc->m[r] - bm);
                    float *acc = sc->acc + (size_t)r * hd;
                    for (int x = 0; x < hd; x++) acc[x] *= f;
                    sc->l[r] *= f;
                }
                sc->m[r] = bm;
            }
            if (blk) { /* weights relative to this block's max, the block scaled by f */
                sc->f[r] = expf(bm - sc->m[r]);
                sc->l[r] += sc->f[r] * p->kern->exp_sum(s, np, bm);
            } else {
                sc->l[r] += p->kern->exp_sum(s, np, sc->m[r]);
            }
        }
        const uint8_t *vb0 = vbase + (size_t)b0 * p->vb;
        if (!blk || !p->kern->av_blk(A->type_v, vb0, p->vb, np, sc->s, sc->f, nr, hd, sc->acc)) {
            if (blk) /* declined: the block-relative weights times f are the plain ones */
                for (int r = 0; r < nr; r++)
                    for (int x = 0; x < np; x++) sc->s[(size_t)r * KVQ_ATTN_BP + x] *= sc->f[r];
            p->kern->av(A->type_v, vb0, p->vb, np, sc->s, nr, hd, sc->acc);
        }
        b0 += np;
    }

    for (int r = 0; r < nr; r++) {
        const float *acc = sc->acc + (size_t)r * hd;
        if (part) {
            float *pr = part + (size_t)r * (hd + 2);
            pr[0] = sc->m[r];
            pr[1] = sc->l[r];
            memcpy(pr + 2, acc, (size_t)hd * sizeof *acc);
        } else {
            finish_row(p, acc, sc->l[r], out_row(p, g, i0 + r / n_rep, r % n_rep));
        }
    }
}

/* Combines the split-K partials of (g, t): rescale each chunk to the common max. */
static void merge_group(const plan *p, int g, int t, float *tmp) {
    const int hd = p->args->a.head_dim, i0 = t * p->qt;
    const int nq = p->n - i0 < p->qt ? p->n - i0 : p->qt, nr = nq * p->n_rep;
    const size_t item0 = ((size_t)g * p->n_tiles + t) * p->n_split, stride = (size_t)p->rows_max * (hd + 2);
    for (int r = 0; r < nr; r++) {
        float M = -INFINITY, L = 0.0f;
        for (int c = 0; c < p->n_split; c++) {
            float m = p->part[(item0 + c) * stride + (size_t)r * (hd + 2)];
            M = m > M ? m : M;
        }
        memset(tmp, 0, (size_t)hd * sizeof *tmp);
        for (int c = 0; c < p->n_split; c++) {
            const float *pr = p->part + (item0 + c) * stride + (size_t)r * (hd + 2);
            if (pr[1] == 0.0f) continue; /* chunk saw none of this row's positions */
            float f = expf(pr[0] - M);
            L += pr[1] * f;
            for (int x = 0; x < hd; x++) tmp[x] += pr[2 + x] * f;
        }
        finish_row(p, tmp, L, out_row(p, g, i0 + r / p->n_rep, r % p->n_rep));
    }
}

static int scratch_init(const plan *p, scratch *sc) {
    const size_t hd = (size_t)p->args->a.head_dim, R = (size_t)p->rows_max;
    sc->q = kvq_alloc_aligned(R * hd * sizeof(float));
    sc->acc = kvq_alloc_aligned(R * hd * sizeof(float));
    sc->s = kvq_alloc_aligned(R * KVQ_ATTN_BP * sizeof(float));
    sc->m = kvq_alloc_aligned(3 * R * sizeof(float));
    sc->prep = p->prep_bytes ? kvq_alloc_aligned(p->prep_bytes) : NULL;
    sc->l = sc->m ? sc->m + R : NULL;
    sc->f = sc->m ? sc->m + 2 * R : NULL;
    return sc->q && sc->acc && sc->s && sc->m && (sc->prep || !p->prep_bytes);
}

static void scratch_free(scratch *sc) {
    kvq_free_aligned(sc->q);
    kvq_free_aligned(sc->acc);
    kvq_free_aligned(sc->s);
    kvq_free_aligned(sc->m);
    kvq_free_aligned(sc->prep);
}

int kvq_cpu_attention(const kvq_cpu_attn_args *args, const float *q, float *out, int pos0, int n, int n_threads) {
    const kvq_attn_desc *a = &args->a;
    if (a->head_dim % KVQ_QK) return -2; /* the kernels would drop the tail or overrun their scratch */
    if (n <= 0) return 0;
    int failed = 0;
    plan p = {.args = args, .q = q, .out = out, .pos0 = pos0, .n = n};
    p.kern = kvq_attn_kernels_for(a->head_dim <= KVQ_ATTN_HD_MAX ? (int)kvq_cpu_isa() : KVQ_ISA_SCALAR);
    p.n_rep = a->n_head / a->n_head_kv;
    p.qt = p.n_rep >= ROWS_MAX ? 1 : ROWS_MAX / p.n_rep;
    if (p.qt > n) p.qt = n;
    p.rows_max = p.qt * p.n_rep;
    p.n_tiles = (n + p.qt - 1) / p.qt;
    p.kb = kvq_kv_row_bytes(args->type_k, a->head_dim);
    p.vb = kvq_kv_row_bytes(args->type_v, a->head_dim);
    p.prep_bytes = p.kern->q_prep_bytes ? p.kern->q_prep_bytes(args->type_k, p.rows_max, a->head_dim) : 0;

    int nt = n_threads;
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#else
    nt = 1;
#endif
    if (nt < 1) nt = 1;
    /* Split-K only when (head, tile) items alone leave threads idle or badly
     * balanced, and never into chunks too short to be worth a merge. */
    const int groups = a->n_head_kv * p.n_tiles;
    const int longest = pos0 + n - first_visible(&p, n - 1 - (n - 1) % p.qt);
    p.n_split = 1;
    if (n <= KVQ_CPU_EXACT_ROWS) {
        exact_split(&p, nt);
    } else if (nt > 1 && groups < 2 * nt) {
        int want = (2 * nt + groups - 1) / groups, cap = longest / MIN_SPLIT;
        p.n_split = want < cap ? want : cap;
        if (p.n_split < 1) p.n_split = 1;
    }
    const int n_items = groups * p.n_split;
    const size_t part_stride = (size_t)p.rows_max * (a->head_dim + 2);
    if (p.n_split > 1) {
        p.part = kvq_alloc_aligned((size_t)n_items * part_stride * sizeof(float));
        if (!p.part) return -1;
    }
    if (nt > n_items) nt = n_items;

#pragma omp parallel num_threads(nt)
    {
        /* A few KB per thread; without it this thread's items are skipped and the call reports failure. */
        scratch sc;
        const int have = scratch_init(&p, &sc);
        if (!have) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; it++) {
            if (!have) continue;
            const int c = it % p.n_split, gt = it / p.n_split, g = gt / p.n_tiles, t = gt % p.n_tiles;
            /* Positions the tile's rows see: [first of its first query, last query]. */
            const int i0 = t * p.qt, i1 = (i0 + p.qt < n ? i0 + p.qt : n) - 1;
            const int lo = first_visible(&p, i0), len = pos0 + i1 + 1 - lo;
            int c0 = split_point(lo, len, c, p.n_split), c1 = split_point(lo, len, c + 1, p.n_split);
            if (p.chunk) { /* fixed chunks, cut to the tile's range (possibly to nothing) */
                c0 = (p.chunk0 + c) * p.chunk, c1 = c0 + p.chunk;
                c0 = c0 > lo ? c0 : lo, c1 = c1 < lo + len ? c1 : lo + len;
                c1 = c1 > c0 ? c1 : c0;
            }
            run_item(&p, &sc, g, t, c0, c1, p.part ? p.part + (size_t)it * part_stride : NULL);
        }
        scratch_free(&sc); /* frees whatever scratch_init got */
    }

    if (p.n_split > 1) {
#pragma omp parallel num_threads(nt)
        {
            float *tmp = kvq_alloc_aligned((size_t)a->head_dim * sizeof(float));
            if (!tmp) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
#pragma omp for schedule(static)
            for (int gt = 0; gt < groups; gt++)
                if (tmp) merge_group(&p, gt / p.n_tiles, gt % p.n_tiles, tmp);
            kvq_free_aligned(tmp);
        }
        kvq_free_aligned(p.part);
    }
    return failed ? -1 : 0;
}
