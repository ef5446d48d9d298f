/* kv_store + attention of every backend in the registry that starts here,
 * against src/ref: all 16 K x V cache type pairs, rotation on/off, GQA 1/4/8,
 * head dims 32/64/80/96/128, sliding window, prompts (also continuing a cache),
 * decode at awkward context lengths, and contexts long enough to split
 * positions. The Vulkan backend's stored rows are also compared byte for byte
 * with kvq_ref_kv_store_row, its cache split across buffers (KVQ_VK_MAX_BUFFER)
 * is exercised, its attention pipelines must all exist once kv_new returns,
 * and its decode with int8 q (attn_dec_*i8) is held to the bound derived at
 * check_int8. Backends that fail init are skipped with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ref/ref.h"
#include "testutil.h"
#include "util.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_kv.h"
#endif

typedef struct {
    const kvq_backend *be;
    kvq_bctx *b;
    double tol; /* rel L2 of the attention output vs kvq_ref_attention */
    int vk;     /* can read its cache back (byte check) */
} backend;

static backend g_bk[8];
static int g_n;
static double g_i8_ratio; /* largest error / bound seen on the int8-q decode path */
static int g_i8_checks;

static kvq_bctx *start(const kvq_backend *be) {
    kvq_backend_opts o = {.n_threads = 2, .allow_software = 1};
    kvq_bctx *b = NULL;
    if (be->init(&o, &b) != KVQ_OK) {
        print_message("%s backend does not start here (%s): skipped\n", be->name, kvq_last_error());
        return NULL;
    }
    return b;
}

static int setup(void **state) {
    (void)state;
    for (int i = 0; i < kvq_backend_count(); i++) {
        const kvq_backend *be;
        kvq_bctx *b = tu_backend_start(i, &be);
        if (!b) continue;
        /* cpu: int8-quantized queries on the q8/q4 paths (see test_kv_attn.c) cost up to ~1%;
         * vulkan: f32 arithmetic throughout, only summation order and exp differ. */
        int vk = strcmp(be->name, "vulkan") == 0;
        g_bk[g_n++] = (backend){be, b, vk ? 2e-5 : 2e-2, vk};
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (g_i8_checks)
        print_message("int8-q decode: %d checks, largest error / bound %.3f\n", g_i8_checks, g_i8_ratio);
    for (int i = 0; i < g_n; i++) g_bk[i].be->release(g_bk[i].b);
    return 0;
}

/* Approximately Gaussian, with the odd outlier (what K rows look like). */
static float rand_val(uint64_t *st) {
    float x = (tu_randf(st) + tu_randf(st) + tu_randf(st) + tu_randf(st)) * 0.8660254f;
    if (tu_randf(st) > 0.995f) x *= 8.0f;
    return x;
}

/* Queries without outliers: the CPU's int8 queries (block absmax/127 steps) keep within their bound. */
static float gauss(uint64_t *st) {
    return (tu_randf(st) + tu_randf(st) + tu_randf(st) + tu_randf(st)) * 0.8660254f;
}

typedef struct {
    int pos0, n; /* store positions pos0..pos0+n-1 */
    int na;      /* then attend with the last na of them as queries */
} step;

typedef struct {
    int hd, n_kv, n_rep, window, n_ctx;
    kvq_cache_type tk, tv;
    int rk, rv;
    step steps[4];
    int n_steps;
} attn_case;

static kvq_buf *upload(const backend *k, const float *x, size_t n) {
    kvq_buf *buf = k->be->buf_new(k->b, n * sizeof(float));
    assert_non_null(buf);
    k->be->buf_write(k->b, buf, 0, x, n * sizeof(float));
    return buf;
}

#ifdef KVQ_HAVE_VULKAN
/* The stored rows of positions < end equal the reference's bytes. */
static void check_bytes(const backend *k, const kvq_kvbuf *kv, const kvq_kv_desc *d, int layer, const uint8_t *refk,
                        const uint8_t *refv, int end, const char *what) {
    for (int s = 0; s < 2; s++) {
        const size_t rb = kvq_kv_row_bytes(s ? d->type_v : d->type_k, d->head_dim);
        uint8_t *got = malloc((size_t)d->n_head_kv * d->n_ctx * rb);
        assert_non_null(got);
        assert_int_equal(kvq_vk_kv_read(k->b, kv, layer, s, 0, d->n_ctx, got), KVQ_OK);
        const uint8_t *want = s ? refv : refk;
        for (int h = 0; h < d->n_head_kv; h++)
            for (int p = 0; p < end; p++) {
                const size_t o = ((size_t)h * d->n_ctx + p) * rb;
                if (memcmp(got + o, want + o, rb) != 0) {
                    size_t x = 0;
                    while (got[o + x] == want[o + x]) x++;
                    fail_msg("%s: %s row (head %d, pos %d) byte %zu is %02x, reference %02x", what, s ? "V" : "K", h,
                             p, x, got[o + x], want[o + x]);
                }
            }
        free(got);
    }
}
#endif

#ifdef KVQ_HAVE_VULKAN
/* Decode with int8 q (attn_dec_*i8: q8/q4 K, devices with integer dot products). Each block b of 32
 * values of q' = scale * q (rotated when K is) is rounded to sq_b * qi, sq_b = max|q'_b| / 127,
 * |qi| <= 127, so every value moves by at most sq_b / 2 and the score of position j by
 *     |ds_j| <= E_j = 1/2 * sum_b sq_b * ||k_jb||_1
 * (k_jb: block b of the stored K row dequantized, dk * k_int; the dot products themselves are exact
 * in int32). Softmax weights p_j = e^s_j / sum e^s then change by a factor in [e^-2E, e^2E],
 * E = max_j E_j, so |p'_j - p_j| <= (e^2E - 1) p_j, and one head's output by
 *     ||o' - o||_2 = ||sum_j (p'_j - p_j) v_j||_2 <= (e^2E - 1) * max_j ||v_j||_2
 * (v_j dequantized; a rotation of V keeps norms). Each head is held to that, plus 1e-4 of its norm
 * and a 1.001 factor on E for the f32 arithmetic around it. Returns the largest error / bound. */
static double check_int8(const attn_case *c, const kvq_attn_desc *a, const uint8_t *K, const uint8_t *V,
                         const float *q, const float *out, const float *ref, int qpos, const char *what) {
    const int hd = c->hd, nh = c->n_kv * c->n_rep;
    const size_t kb = kvq_kv_row_bytes(c->tk, hd), vb = kvq_kv_row_bytes(c->tv, hd);
    const int lo = c->window > 0 && qpos - c->window + 1 > 0 ? qpos - c->window + 1 : 0;
    float *qr = malloc(sizeof(float) * hd), *row = malloc(sizeof(float) * hd);
    assert_true(qr && row);
    double worst = 0;
    for (int h = 0; h < nh; h++) {
        const int g = h / c->n_rep;
        for (int i = 0; i < hd; i++) qr[i] = q[(size_t)h * hd + i] * a->scale;
        if (c->rk) kvq_ref_hadamard(qr, hd);
        double E = 0, vmax = 0;
        for (int j = lo; j <= qpos; j++) {
            kvq_ref_kv_load_row(c->tk, K + ((size_t)g * c->n_ctx + j) * kb, row, hd);
            double e = 0;
            for (int b = 0; b < hd / KVQ_QK; b++) {
                double amax = 0, l1 = 0;
                for (int i = b * KVQ_QK; i < (b + 1) * KVQ_QK; i++) {
                    amax = fmax(amax, fabs(qr[i]));
                    l1 += fabs(row[i]);
                }
                e += 0.5 * amax / 127.0 * l1;
            }
            E = fmax(E, e);
            kvq_ref_kv_load_row(c->tv, V + ((size_t)g * c->n_ctx + j) * vb, row, hd);
            double n2 = 0;
            for (int i = 0; i < hd; i++) n2 += (double)row[i] * row[i];
            vmax = fmax(vmax, sqrt(n2));
        }
        double err = 0, rn = 0;
        for (int i = 0; i < hd; i++) {
            const double dlt = (double)out[(size_t)h * hd + i] - ref[(size_t)h * hd + i];
            err += dlt * dlt;
            rn += (double)ref[(size_t)h * hd + i] * ref[(size_t)h * hd + i];
        }
        err = sqrt(err), rn = sqrt(rn);
        const double bound = expm1(2.0 * 1.001 * E) * vmax + 1e-4 * rn;
        if (!(err <= bound)) fail_msg("%s, decode at %d head %d: int8-q error %.3g > bound %.3g (E %.3g)", what, qpos, h, err, bound, E);
        if (bound > 0 && err / bound > worst) worst = err / bound;
    }
    free(qr);
    free(row);
    return worst;
}
#endif

static void run_case(const backend *k, const attn_case *c, uint64_t seed) {
    const kvq_backend *be = k->be;
    const int hd = c->hd, nkv = c->n_kv, nh = c->n_kv * c->n_rep, layer = 1;
    const kvq_kv_desc d = {.n_layer = 2, .n_ctx = c->n_ctx, .n_head_kv = nkv, .head_dim = hd,
                           .type_k = c->tk, .type_v = c->tv, .rotate_k = c->rk, .rotate_v = c->rv, .n_head = nh};
    const kvq_attn_desc a = {.n_head = nh, .n_head_kv = nkv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd),
                             .window = c->window};
    char what[200];
    snprintf(what, sizeof what, "%s: hd %d heads %d/%d K %s%s V %s%s window %d ctx %d", be->name, hd, nh, nkv,
             kvq_cache_type_name(c->tk), c->rk ? "+rot" : "", kvq_cache_type_name(c->tv), c->rv ? "+rot" : "",
             c->window, c->n_ctx);
    kvq_kvbuf *kv = be->kv_new(k->b, &d);
    if (!kv) fail_msg("%s: kv_new: %s", what, kvq_last_error());
    kvq_backend_stats st0 = {0}, st1 = {0};
    if (be->stats) be->stats(k->b, &st0); /* kv_new built the pipelines: attention adds none */
    const size_t kb = kvq_kv_row_bytes(c->tk, hd), vb = kvq_kv_row_bytes(c->tv, hd);
    uint8_t *K = calloc((size_t)nkv * c->n_ctx, kb), *V = calloc((size_t)nkv * c->n_ctx, vb);
    assert_true(K && V);
    uint64_t st = seed;
    for (int si = 0; si < c->n_steps; si++) {
        const step *s = &c->steps[si];
        const size_t kvn = (size_t)s->n * nkv * hd, qn = (size_t)s->na * nh * hd;
        float *kx = malloc(kvn * sizeof *kx), *vx = malloc(kvn * sizeof *vx), *q = malloc(qn * sizeof *q);
        float *out = malloc(qn * sizeof *out), *ref = malloc(qn * sizeof *ref);
        assert_true(kx && vx && q && out && ref);
        for (size_t i = 0; i < kvn; i++) kx[i] = rand_val(&st);
        for (size_t i = 0; i < kvn; i++) vx[i] = rand_val(&st);
        for (size_t i = 0; i < qn; i++) q[i] = gauss(&st);
        for (int t = 0; t < s->n; t++)
            for (int h = 0; h < nkv; h++) {
                const size_t row = (size_t)h * c->n_ctx + s->pos0 + t, src = ((size_t)t * nkv + h) * hd;
                kvq_ref_kv_store_row(c->tk, c->rk, kx + src, K + row * kb, hd);
                kvq_ref_kv_store_row(c->tv, c->rv, vx + src, V + row * vb, hd);
            }
        kvq_buf *bk = upload(k, kx, kvn), *bv = upload(k, vx, kvn), *bq = upload(k, q, qn);
        kvq_buf *bo = be->buf_new(k->b, qn * sizeof(float));
        assert_non_null(bo);
        be->kv_store(k->b, kv, layer, bk, bv, s->pos0, s->n);
        be->kv_store(k->b, kv, 0, bv, bk, s->pos0, s->n); /* other layer, other data: must not leak into layer 1 */
        const int qpos = s->pos0 + s->n - s->na;
        be->attention(k->b, kv, layer, &a, bq, bo, qpos, s->na);
        for (size_t i = 0; i < qn; i++) out[i] = NAN;
        kvq_status rs = be->buf_read(k->b, bo, 0, out, qn * sizeof(float));
        if (rs != KVQ_OK) fail_msg("%s: buf_read: %s", what, kvq_last_error());
        kvq_ref_attention(nh, nkv, hd, a.scale, c->window, c->tk, c->rk, K, c->tv, c->rv, V, c->n_ctx, q, ref, qpos,
                          s->na);
        int i8 = 0;
#ifdef KVQ_HAVE_VULKAN
        if (k->vk && s->na <= kvq_vk_attn_exact_rows()) { /* each query as a decode step */
            const kvq_vk_attn_dev dev = kvq_vk_attn_dev_of(k->b);
            i8 = kvq_vk_attn_pick(&dev, &d, c->n_rep, 1).int8;
        }
        for (int r = 0; i8 && r < s->na; r++) {
            const size_t o = (size_t)r * nh * hd;
            const double rr = check_int8(c, &a, K, V, q + o, out + o, ref + o, qpos + r, what);
            g_i8_ratio = rr > g_i8_ratio ? rr : g_i8_ratio;
            g_i8_checks++;
        }
#endif
        const double err = tu_rel_l2(out, ref, qn);
        if (!i8 && !(err <= k->tol))
            fail_msg("%s, step pos0 %d n %d queries %d: rel err %.3g > %.g", what, s->pos0, s->n, s->na, err, k->tol);
#ifdef KVQ_HAVE_VULKAN
        if (k->vk) check_bytes(k, kv, &d, layer, K, V, s->pos0 + s->n, what);
#endif
        if (be->stats) {
            be->stats(k->b, &st1);
            if (st1.pipelines != st0.pipelines)
                fail_msg("%s: attention built %d pipelines after kv_new", what, st1.pipelines - st0.pipelines);
        }
        be->buf_free(k->b, bk);
        be->buf_free(k->b, bv);
        be->buf_free(k->b, bq);
        be->buf_free(k->b, bo);
        free(kx);
        free(vx);
        free(q);
        free(out);
        free(ref);
    }
    be->kv_free(k->b, kv);
    free(K);
    free(V);
}

static const kvq_cache_type TYPES[4] = {KVQ_CACHE_F32, KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};

/* All 16 K x V pairs, rotation off and on: a prompt, a prompt continuing it, a decode step. */
static void test_type_pairs(void **state) {
    (void)state;
    for (int bi = 0; bi < g_n; bi++)
        for (int p = 0; p < 32; p++) {
            const int rot = p / 16;
            /* 16 heads per KV head: decode and prompt tiles both take 16 rows, one pipeline per pair on Vulkan */
            attn_case c = {.hd = 64, .n_kv = 2, .n_rep = 16, .n_ctx = 64, .tk = TYPES[p % 16 / 4], .tv = TYPES[p % 4],
                           .rk = rot, .rv = rot, .n_steps = 3,
                           .steps = {{0, 37, 37}, {37, 6, 6}, {43, 1, 1}}};
            run_case(&g_bk[bi], &c, 100 + (uint64_t)p);
        }
}

/* GQA 1/4/8 x head dim 64/128: a stored prompt attended by its last 8 queries, then decode. */
static void test_gqa_head_dims(void **state) {
    (void)state;
    const int reps[3] = {1, 4, 8}, hds[2] = {64, 128};
    for (int bi = 0; bi < g_n; bi++)
        for (int r = 0; r < 3; r++)
            for (int h = 0; h < 2; h++) {
                attn_case c = {.hd = hds[h], .n_kv = 2, .n_rep = reps[r], .n_ctx = 300,
                               .tk = r % 2 ? KVQ_CACHE_Q4 : KVQ_CACHE_Q8, .tv = h ? KVQ_CACHE_Q8 : KVQ_CACHE_F16,
                               .rk = h, .rv = h, .n_steps = 3, .steps = {{0, 280, 8}, {280, 1, 1}, {281, 1, 1}}};
                run_case(&g_bk[bi], &c, 200 + (uint64_t)(r * 2 + h));
            }
}

/* Contexts long enough that decode splits positions over many workgroups. */
static void test_long_context(void **state) {
    (void)state;
    for (int bi = 0; bi < g_n; bi++) {
        attn_case c = {.hd = 128, .n_kv = 1, .n_rep = 8, .n_ctx = 2048, .tk = KVQ_CACHE_Q4, .tv = KVQ_CACHE_Q4,
                       .rk = 1, .rv = 1, .n_steps = 2, .steps = {{0, 2000, 2}, {2000, 1, 1}}};
        run_case(&g_bk[bi], &c, 300);
        attn_case c2 = {.hd = 64, .n_kv = 2, .n_rep = 1, .n_ctx = 1100, .tk = KVQ_CACHE_F16, .tv = KVQ_CACHE_Q8,
                        .n_steps = 2, .steps = {{0, 1000, 1}, {1000, 33, 33}}};
        run_case(&g_bk[bi], &c2, 301);
    }
}

/* Sliding window: inside one block, across blocks, across splits; prompt and decode. */
static void test_window(void **state) {
    (void)state;
    for (int bi = 0; bi < g_n; bi++) {
        attn_case c = {.hd = 64, .n_kv = 2, .n_rep = 4, .n_ctx = 200, .window = 50, .tk = KVQ_CACHE_Q8,
                       .tv = KVQ_CACHE_Q8, .n_steps = 2, .steps = {{0, 120, 120}, {120, 1, 1}}};
        run_case(&g_bk[bi], &c, 400);
        attn_case c2 = {.hd = 128, .n_kv = 1, .n_rep = 4, .n_ctx = 800, .window = 300, .tk = KVQ_CACHE_Q4,
                        .tv = KVQ_CACHE_F16, .rk = 1, .n_steps = 2, .steps = {{0, 700, 5}, {700, 1, 1}}};
        run_case(&g_bk[bi], &c2, 401);
        attn_case c3 = {.hd = 64, .n_kv = 1, .n_rep = 8, .n_ctx = 100, .window = 7, .tk = KVQ_CACHE_F32,
                        .tv = KVQ_CACHE_Q4, .rv = 1, .n_steps = 2, .steps = {{0, 70, 70}, {70, 1, 1}}};
        run_case(&g_bk[bi], &c3, 402);
    }
}

/* head_dim 32: q8/q4 rows of one block (34/18 bytes) are padded to whole words on Vulkan. */
static void test_head_dim_32(void **state) {
    (void)state;
    for (int bi = 0; bi < g_n; bi++)
        for (int p = 0; p < 4; p++) {
            attn_case c = {.hd = 32, .n_kv = 3, .n_rep = 2, .n_ctx = 40, .tk = p & 1 ? KVQ_CACHE_Q4 : KVQ_CACHE_Q8,
                           .tv = p & 1 ? KVQ_CACHE_Q8 : KVQ_CACHE_Q4, .rk = p >> 1, .rv = p >> 1, .n_steps = 2,
                           .steps = {{0, 20, 20}, {20, 1, 1}}};
            run_case(&g_bk[bi], &c, 500 + (uint64_t)p);
        }
}

/* Decode (one query) at context lengths that are not multiples of any block size, head dims
 * 64/80/96/128 (80: f16 only, q8/q4 need whole blocks of 32), GQA 1/4/8, f16/q8/q4 (q4 rotated)
 * and q8 K with q4 V: on Vulkan the attn_dec pipelines (with int8 q where the device has integer
 * dot products). The stored prompt is attended by its last query first, then one more token.
 * Vulkan runs on a fresh device per head dim, so the pipelines of all shapes fit its table. */
static void test_decode_shapes(void **state) {
    (void)state;
    const int hds[4] = {64, 80, 96, 128}, reps[3] = {1, 4, 8}, ctxs[5] = {1, 7, 33, 300, 1100};
    const kvq_cache_type kt[4] = {KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4, KVQ_CACHE_Q8};
    const kvq_cache_type vt[4] = {KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4, KVQ_CACHE_Q4};
    for (int bi = 0; bi < g_n; bi++)
        for (int hi = 0; hi < 4; hi++) {
            const int hd = hds[hi];
            backend k = g_bk[bi];
            kvq_bctx *fresh = NULL;
            if (k.vk) {
                if (!(fresh = start(k.be))) continue;
                k.b = fresh;
            }
            for (int t = 0; t < 4; t++) {
                if (hd % 32 && t) continue;
                const int rot = t == 2 && (hd & (hd - 1)) == 0;
                for (int r = 0; r < 3; r++)
                    for (int ci = 0; ci < 5; ci++) {
                        const int L = ctxs[ci];
                        attn_case c = {.hd = hd, .n_kv = 2, .n_rep = reps[r], .n_ctx = L + 3, .tk = kt[t], .tv = vt[t],
                                       .rk = rot, .rv = rot, .window = ci == 4 && r == 1 ? 500 : 0};
                        if (L == 1) c.n_steps = 1, c.steps[0] = (step){0, 1, 1};
                        else c.n_steps = 2, c.steps[0] = (step){0, L - 1, 1}, c.steps[1] = (step){L - 1, 1, 1};
                        run_case(&k, &c, 800 + (uint64_t)(((hi * 4 + t) * 3 + r) * 5 + ci));
                    }
            }
            if (fresh) k.be->release(fresh);
        }
}

#ifdef KVQ_HAVE_VULKAN
/* The decode grid for 7B (32 heads over 32 or 8 KV heads) and 70B (64 over 8) shapes, head dim
 * 128, at 512..32k positions, on two kinds of GPU: one whose compute units are known (132, an
 * H100: target_groups 4 x 132) and one where they are not (512 by default). Every case must give
 * several hundred workgroups (>= 256), and every split must hold at least one block. */
static void test_decode_grid(void **state) {
    (void)state;
    const struct {
        const char *name;
        int n_head, n_kv;
    } shapes[3] = {{"7B", 32, 32}, {"7B-GQA", 32, 8}, {"70B", 64, 8}};
    const int ctxs[4] = {512, 4096, 16384, 32768};
    const kvq_cache_type types[3] = {KVQ_CACHE_F16, KVQ_CACHE_Q8, KVQ_CACHE_Q4};
    for (int dv = 0; dv < 2; dv++) {
        const kvq_vk_attn_dev dev = {.target_groups = dv ? 0 : 4 * 132, .subgroup = 1, .int_dot = 1, .dec = 1,
                                     .shared_bytes = dv ? 32768 : 49152};
        for (int si = 0; si < 3; si++)
            for (int ti = 0; ti < 3; ti++)
                for (int ci = 0; ci < 4; ci++) {
                    const kvq_kv_desc d = {.n_layer = 1, .n_ctx = ctxs[ci], .n_head_kv = shapes[si].n_kv, .head_dim = 128,
                                           .type_k = types[ti], .type_v = types[ti], .n_head = shapes[si].n_head};
                    const kvq_attn_desc a = {.n_head = shapes[si].n_head, .n_head_kv = shapes[si].n_kv, .head_dim = 128,
                                             .scale = 1.0f};
                    const kvq_vk_attn_grid g = kvq_vk_attn_plan(&dev, &d, &a, ctxs[ci] - 1, 1, (size_t)1 << 31);
                    const long groups = (long)g.gx * g.gy * g.gz;
                    if (ti == 1)
                        print_message("%s %-6s %5d positions: %s bp %d, %d tiles of %d heads x %d KV heads x %d splits of "
                                      "%d blocks = %ld workgroups\n",
                                      dv ? "gpu(cu ?)  " : "gpu(132 cu)", shapes[si].name, ctxs[ci], g.pipe.name, g.pipe.bp,
                                      g.gx, g.ng, g.gy, g.gz, g.bps, groups);
                    assert_true(g.pipe.dec);
                    assert_int_equal(g.pipe.int8, ti > 0);
                    assert_true(groups >= 256);
                    assert_true((long)(g.gz - 1) * g.bps * g.pipe.bp < ctxs[ci]); /* no empty split */
                    assert_true(g.ng * g.gx >= shapes[si].n_head / shapes[si].n_kv && g.ng <= 8);
                }
    }
}

/* Rows the quantizer's corner cases decide: zeros, fp16-subnormal and clamped
 * scales, exact halves (round away from zero), ties of |max| with both signs,
 * huge and tiny values; every type, rotation off and on, byte for byte. */
static void test_store_bytes(void **state) {
    (void)state;
    for (int bi = 0; bi < g_n; bi++) {
        const backend *k = &g_bk[bi];
        if (!k->vk) continue;
        for (int hdi = 0; hdi < 2; hdi++)
            for (int ty = 0; ty < 16; ty++) {
                const int hd = hdi ? 64 : 32, n = 12, nkv = 2, rot = ty / 8;
                const kvq_kv_desc d = {.n_layer = 1, .n_ctx = n, .n_head_kv = nkv, .head_dim = hd,
                                       .type_k = TYPES[ty % 4], .type_v = TYPES[(ty + 1) % 4], .rotate_k = rot,
                                       .rotate_v = !rot};
                kvq_kvbuf *kv = k->be->kv_new(k->b, &d);
                assert_non_null(kv);
                const size_t cnt = (size_t)n * nkv * hd;
                float *x = malloc(cnt * sizeof *x), *y = malloc(cnt * sizeof *y);
                assert_true(x && y);
                uint64_t st = 600 + (uint64_t)ty;
                for (int t = 0; t < n * nkv; t++) {
                    float *r = x + (size_t)t * hd;
                    for (int j = 0; j < hd; j++) {
                        const float u = rand_val(&st);
                        switch (t % 12) {
                        case 0: r[j] = 0.0f; break;
                        case 1: r[j] = u * 1e-6f; break;  /* subnormal fp16 scale */
                        case 2: r[j] = u * 1e-12f; break; /* scale underflows to 0 */
                        case 3: r[j] = u * 1e9f; break;   /* scale clamps to 65504 */
                        case 4: r[j] = (float)((j % 33) - 16) * 0.5f; break;  /* halves, ties */
                        case 5: r[j] = j % 2 ? 8.0f : -8.0f; break;           /* |max| tie, both signs */
                        case 6: r[j] = j == 0 ? 127.0f : (float)(j % 32 - 16) + 0.5f; break; /* q8: d = 1, halves */
                        case 8: r[j] = j == 0 ? -8.0f : (float)(j % 15 - 7) + 0.5f; break;  /* q4: d = 1, halves */
                        case 7: r[j] = u * 70000.0f; break; /* f16 overflow to inf */
                        default: r[j] = u * (float)(t % 5 + 1); break;
                        }
                    }
                }
                for (size_t i = 0; i < cnt; i++) y[i] = x[(i + 7) % cnt];
                kvq_buf *bx = upload(k, x, cnt), *by = upload(k, y, cnt);
                k->be->kv_store(k->b, kv, 0, bx, by, 0, n);
                const size_t kb = kvq_kv_row_bytes(d.type_k, hd), vb = kvq_kv_row_bytes(d.type_v, hd);
                uint8_t *K = calloc((size_t)nkv * n, kb), *V = calloc((size_t)nkv * n, vb);
                assert_true(K && V);
                for (int t = 0; t < n; t++)
                    for (int h = 0; h < nkv; h++) {
                        const size_t row = (size_t)h * n + t, src = ((size_t)t * nkv + h) * hd;
                        kvq_ref_kv_store_row(d.type_k, d.rotate_k, x + src, K + row * kb, hd);
                        kvq_ref_kv_store_row(d.type_v, d.rotate_v, y + src, V + row * vb, hd);
                    }
                char what[96];
                snprintf(what, sizeof what, "store hd %d K %s%s V %s%s", hd, kvq_cache_type_name(d.type_k),
                         rot ? "+rot" : "", kvq_cache_type_name(d.type_v), rot ? "" : "+rot");
                check_bytes(k, kv, &d, 0, K, V, n, what);
                k->be->buf_free(k->b, bx);
                k->be->buf_free(k->b, by);
                k->be->kv_free(k->b, kv);
                free(x);
                free(y);
                free(K);
                free(V);
            }
    }
}

/* KVQ_VK_MAX_BUFFER below the cache size: one buffer per layer (the same
 * answers), and kv_new fails with one line naming the limit when even one
 * layer does not fit. */
static void test_split_buffers(void **state) {
    (void)state;
    const kvq_backend *be = kvq_backend_find("vulkan");
    if (!be) skip();
    /* per layer: K q8 2 x 256 x 68 = 34816 bytes (one buffer per layer), V q4 2 x 256 x 36 (both in one);
     * attention scratch budget 20000 bytes = 18 queries of 4 heads: prompts go in chunks */
    setenv("KVQ_VK_MAX_BUFFER", "40000", 1);
    kvq_bctx *b = start(be);
    unsetenv("KVQ_VK_MAX_BUFFER");
    if (!b) skip();
    backend k = {be, b, 2e-5, 1};
    attn_case c = {.hd = 64, .n_kv = 2, .n_rep = 2, .n_ctx = 256, .tk = KVQ_CACHE_Q8, .tv = KVQ_CACHE_Q4, .rk = 1,
                   .n_steps = 3, .steps = {{0, 30, 30}, {30, 30, 2}, {60, 1, 1}}};
    run_case(&k, &c, 700);
    const kvq_kv_desc big = {.n_layer = 2, .n_ctx = 400, .n_head_kv = 2, .head_dim = 64, .type_k = KVQ_CACHE_Q8,
                             .type_v = KVQ_CACHE_Q8};
    kvq_kvbuf *kv = be->kv_new(b, &big);
    assert_null(kv);
    assert_non_null(strstr(kvq_last_error(), "limit"));
    be->release(b);
}

/* Out of device memory part way through kv_new (KVQ_VK_MEMORY_LIMIT): NULL with one line, and
 * what it had allocated is given back (a cache that fits the limit still allocates after it). */
static void test_cache_out_of_memory(void **state) {
    (void)state;
    const kvq_backend *be = kvq_backend_find("vulkan");
    if (!be) skip();
    setenv("KVQ_VK_MAX_BUFFER", "40000", 1);
    setenv("KVQ_VK_MEMORY_LIMIT", "100000", 1);
    setenv("KVQ_VK_HOST_FALLBACK", "0", 1);
    kvq_bctx *b = start(be);
    unsetenv("KVQ_VK_MAX_BUFFER");
    unsetenv("KVQ_VK_MEMORY_LIMIT");
    unsetenv("KVQ_VK_HOST_FALLBACK");
    if (!b) skip();
    /* K q8: 2 x 256 x 68 = 34816 bytes per layer, one buffer per layer: the third one fails */
    kvq_kv_desc d = {.n_layer = 4, .n_ctx = 256, .n_head_kv = 2, .head_dim = 64, .type_k = KVQ_CACHE_Q8,
                     .type_v = KVQ_CACHE_Q8};
    for (int rep = 0; rep < 3; rep++) {
        assert_null(be->kv_new(b, &d));
        print_message("%s\n", kvq_last_error());
        assert_non_null(strstr(kvq_last_error(), "out of device memory"));
    }
    d.n_layer = 1; /* 69632 bytes: fits only if the failed attempts gave theirs back */
    kvq_kvbuf *kv = be->kv_new(b, &d);
    assert_non_null(kv);
    be->kv_free(b, kv);
    be->release(b);
}

/* A cache larger than the device's memory fails in kv_new with one line, before allocating. */
static void test_cache_too_big(void **state) {
    (void)state;
    const kvq_backend *be = kvq_backend_find("vulkan");
    if (!be) skip();
    kvq_bctx *b = start(be);
    if (!b) skip();
    const kvq_kv_desc huge = {.n_layer = 1 << 20, .n_ctx = 4096, .n_head_kv = 8, .head_dim = 128,
                              .type_k = KVQ_CACHE_F32, .type_v = KVQ_CACHE_F32}; /* 32 TiB */
    assert_null(be->kv_new(b, &huge));
    print_message("%s\n", kvq_last_error());
    assert_non_null(strstr(kvq_last_error(), "memory"));
    be->release(b);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_pairs),
        cmocka_unit_test(test_gqa_head_dims),
        cmocka_unit_test(test_long_context),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_head_dim_32),
        cmocka_unit_test(test_decode_shapes),
#ifdef KVQ_HAVE_VULKAN
        cmocka_unit_test(test_decode_grid),
        cmocka_unit_test(test_store_bytes),
        cmocka_unit_test(test_split_buffers),
        cmocka_unit_test(test_cache_out_of_memory),
        cmocka_unit_test(test_cache_too_big),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
