/* matmul and get_rows through the kvq_backend table, for every backend in the
 * registry that starts here, against src/ref: dense f32/f16/bf16 and AQLM 2x8,
 * 1x16, 1x8, 4x8, g16 on awkward shapes, with and without bias, n = 1..200.
 * The Vulkan backend runs twice: as is, and with KVQ_VK_MAX_BUFFER lowered so
 * every test tensor is split across buffers; both opened exact (f32 lookup tables).
 * test_matvec_lut16 opens a third, not exact, for the fp16 lookup tables (mm_lut_h)
 * and holds each output to their stated bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_matmul.h"
#include "ref/ref.h"
#include "testutil.h"
#include "util.h"
#ifdef KVQ_HAVE_VULKAN
#include "vulkan/vk_weights.h"
#endif

/* One started backend instance. */
typedef struct {
    const kvq_backend *be;
    kvq_bctx *b;
    char label[32];
    double tol;    /* matmul rel L2 bound this backend states */
    int split;     /* started with a lowered buffer limit */
} runner;

#define SPLIT_MAX_BUFFER "8192"
static runner runners[8];
static int n_runners;

static int setup(void **s) {
    (void)s;
    kvq_backend_opts o = {.n_threads = 2, .allow_software = 1, .exact = 1}; /* the int8 prompt tiles: test_matmul */
    for (int i = 0; i < kvq_backend_count(); i++) {
        const kvq_backend *be = kvq_backend_get(i);
        for (int split = 0; split < 2; split++) {
            int vk = strcmp(be->name, "vulkan") == 0;
            if (split && !vk) continue;
            if (split) setenv("KVQ_VK_MAX_BUFFER", SPLIT_MAX_BUFFER, 1);
            runner *r = &runners[n_runners];
            kvq_status st = be->init(&o, &r->b);
            if (split) unsetenv("KVQ_VK_MAX_BUFFER");
            if (st != KVQ_OK) {
                print_message("backend %s does not start here (%s): skipped\n", be->name, kvq_last_error());
                break;
            }
            r->be = be;
            r->split = split;
            /* Vulkan sums in f32 (in its own order); the CPU's bound is the loosest of its kernel
             * paths' stated bounds (int16 lookup tables, AMX tiles; tests/test_matmul.c per path) */
            r->tol = vk ? 1e-5 : KVQ_LUT_I16_REL_L2 > KVQ_AMX_REL_L2 ? KVQ_LUT_I16_REL_L2 : KVQ_AMX_REL_L2;
            snprintf(r->label, sizeof r->label, "%s%s", be->name, split ? "(split)" : "");
            print_message("backend %s: %s\n", r->label, be->describe(r->b));
            n_runners++;
        }
    }
    return 0;
}

static int teardown(void **s) {
    (void)s;
    for (int i = 0; i < n_runners; i++) runners[i].be->release(runners[i].b);
    return 0;
}

/* ---- test weights (every array starts one byte past its malloc block: checkpoint
 * tensors have no alignment promise) ---- */

typedef struct {
    kvq_weight_desc d;
    char *blocks[5];
    void *bias; /* kept aside so cases can switch d.bias on and off */
} tweight;

static uint64_t rng = 12345;

static void *ualloc(tweight *w, int slot, size_t bytes) {
    w->blocks[slot] = calloc(1, bytes + 1);
    assert_non_null(w->blocks[slot]);
    return w->blocks[slot] + 1;
}

static void tweight_free(tweight *w) {
    for (int i = 0; i < 5; i++) free(w->blocks[i]);
}

static void put_dense(kvq_wformat f, void *p, size_t i, float v) {
    if (f == KVQ_W_F32) {
        memcpy((char *)p + 4 * i, &v, 4);
        return;
    }
    uint16_t h;
    if (f == KVQ_W_F16) {
        h = kvq_f32_to_f16(v);
    } else {
        uint32_t u;
        memcpy(&u, &v, 4);
        h = (uint16_t)(u >> 16);
    }
    memcpy((char *)p + 2 * i, &h, 2);
}

static size_t fmt_size(kvq_wformat f) { return f == KVQ_W_F32 ? 4 : 2; }

static void make_bias(tweight *w, kvq_wformat bf) {
    w->bias = ualloc(w, 4, (size_t)w->d.rows * fmt_size(bf));
    for (int o = 0; o < w->d.rows; o++) put_dense(bf, w->bias, (size_t)o, tu_randf(&rng));
    w->d.bias_fmt = bf;
}

static void make_dense(tweight *w, kvq_wformat f, int rows, int cols) {
    memset(w, 0, sizeof *w);
    size_t count = (size_t)rows * cols;
    void *p = ualloc(w, 0, count * fmt_size(f));
    for (size_t i = 0; i < count; i++) put_dense(f, p, i, tu_randf(&rng));
    w->d = (kvq_weight_desc){.fmt = f, .rows = rows, .cols = cols, .data = p, .name = "test.dense"};
    make_bias(w, f == KVQ_W_F32 ? KVQ_W_BF16 : KVQ_W_F32);
}

static void make_aqlm(tweight *w, int rows, int cols, int M, int nbits, int ig, int cb) {
    memset(w, 0, sizeof *w);
    size_t K = (size_t)1 << nbits, n_codes = (size_t)rows * (size_t)(cols / ig) * (size_t)M;
    uint8_t *codes = ualloc(w, 0, n_codes * (size_t)cb);
    for (size_t i = 0; i < n_codes * (size_t)cb; i++) /* the whole range: negative int8/int16 too */
        codes[i] = (uint8_t)(tu_randf(&rng) * 128.0f + 128.0f);
    void *books = ualloc(w, 1, (size_t)M * K * (size_t)ig * 2);
    for (size_t i = 0; i < (size_t)M * K * (size_t)ig; i++) put_dense(KVQ_W_F16, books, i, tu_randf(&rng));
    void *scales = ualloc(w, 2, (size_t)rows * 2);
    for (int o = 0; o < rows; o++) put_dense(KVQ_W_F16, scales, (size_t)o, 0.5f + tu_randf(&rng) * 0.4f);
    w->d = (kvq_weight_desc){.fmt = KVQ_W_AQLM, .rows = rows, .cols = cols, .n_codebooks = M, .nbits = nbits,
                             .in_group = ig, .code_bytes = cb, .codes = codes, .codebooks = books,
                             .scales = scales, .name = "test.aqlm"};
    make_bias(w, KVQ_W_F16);
}

typedef struct {
    const char *name;
    kvq_wformat fmt;
    int rows, cols, M, nbits, ig;
    int code_bytes; /* 0: as the AQLM export stores them (int8 up to 8 bits, else int16) */
} scheme;

static const scheme schemes[] = {
    {"f32", KVQ_W_F32, 300, 261, 0, 0, 0, 0},
    {"f16", KVQ_W_F16, 300, 261, 0, 0, 0, 0},
    {"bf16", KVQ_W_BF16, 131, 200, 0, 0, 0, 0},
    {"aqlm 2x8", KVQ_W_AQLM, 300, 264, 2, 8, 8, 0},
    {"aqlm 2x8 one chunk", KVQ_W_AQLM, 70, 64, 2, 8, 8, 0},
    {"aqlm 1x16", KVQ_W_AQLM, 300, 264, 1, 16, 8, 0},
    {"aqlm 1x8", KVQ_W_AQLM, 130, 264, 1, 8, 8, 0},
    {"aqlm 4x8", KVQ_W_AQLM, 300, 264, 4, 8, 8, 0},
    {"aqlm 2x8 g16", KVQ_W_AQLM, 300, 272, 2, 8, 16, 0},
    {"aqlm 1x16 g16", KVQ_W_AQLM, 130, 272, 1, 16, 16, 0},
    {"aqlm 2x12", KVQ_W_AQLM, 130, 264, 2, 12, 8, 0},              /* int16 codes read mod 2^12 */
    {"aqlm 2x8 int16 codes", KVQ_W_AQLM, 130, 264, 2, 8, 8, 2}, /* read mod 2^8 */
};
#define N_SCHEMES ((int)(sizeof schemes / sizeof schemes[0]))

static void make_scheme(tweight *w, const scheme *s) {
    if (s->fmt == KVQ_W_AQLM)
        make_aqlm(w, s->rows, s->cols, s->M, s->nbits, s->ig, s->code_bytes ? s->code_bytes : s->nbits > 8 ? 2 : 1);
    else make_dense(w, s->fmt, s->rows, s->cols);
}

/* Bytes of rows or codes a pass must read (no codebooks, scales, bias). */
static size_t payload_bytes(const kvq_weight_desc *d) {
    if (d->fmt == KVQ_W_AQLM)
        return (size_t)d->rows * (size_t)(d->cols / d->in_group) * (size_t)d->n_codebooks * (d->nbits > 8 ? 2 : 1);
    return (size_t)d->rows * (size_t)d->cols * fmt_size(d->fmt);
}

static kvq_wt *upload(const runner *r, const kvq_weight_desc *d, const char *what) {
    if (r->be->weight_supported && !r->be->weight_supported(r->b, d))
        fail_msg("%s on %s: weight_supported says no", what, r->label);
    kvq_wt *wt = r->be->weight_upload(r->b, d);
    if (!wt) fail_msg("%s on %s: upload failed: %s", what, r->label, kvq_last_error());
#ifdef KVQ_HAVE_VULKAN
    /* opened exact: 8-bit AQLM decodes through the f32 tables, held to the f32 bound below */
    if (!strcmp(r->be->name, "vulkan") && wt->lut16) fail_msg("%s on %s: fp16 lookup tables although exact", what, r->label);
    /* the split instance must really cut every tensor bigger than its buffer limit */
    if (r->split && payload_bytes(d) > 2 * (size_t)atoi(SPLIT_MAX_BUFFER) && wt->n_pieces < 2)
        fail_msg("%s on %s: not split (%d piece)", what, r->label, wt->n_pieces);
#endif
    return wt;
}

static kvq_buf *buf_from(const runner *r, const float *x, size_t count) {
    kvq_buf *buf = r->be->buf_new(r->b, count * sizeof(float));
    assert_non_null(buf);
    r->be->buf_write(r->b, buf, 0, x, count * sizeof(float));
    return buf;
}

static const int batch[] = {1, 3, 8, 17, 64, 200};
/* The split instance also limits activation buffers: token counts whose x and y fit
 * (one of them past the matvec path, which takes n <= 4). */
static const int batch_split[] = {1, 3, 5};
#define N_MAX 200

static void test_matmul(void **state) {
    (void)state;
    double worst[8] = {0};
    for (int si = 0; si < N_SCHEMES; si++) {
        const scheme *s = &schemes[si];
        tweight w;
        make_scheme(&w, s);
        int rows = s->rows, cols = s->cols;
        float *x = malloc(sizeof(float) * N_MAX * cols);
        float *want = malloc(sizeof(float) * N_MAX * rows), *got = malloc(sizeof(float) * N_MAX * rows);
        assert_true(x && want && got);
        tu_rand_fill(x, (size_t)N_MAX * cols, &rng);
        for (int bias = 0; bias < 2; bias++) {
            w.d.bias = bias ? w.bias : NULL;
            for (int ri = 0; ri < n_runners; ri++) {
                const runner *r = &runners[ri];
                const int *ns = r->split ? batch_split : batch;
                int n_ns = r->split ? 3 : 6, n_max = ns[n_ns - 1];
                char what[96];
                snprintf(what, sizeof what, "%s %dx%d bias=%d", s->name, rows, cols, bias);
                kvq_wt *wt = upload(r, &w.d, what);
                kvq_buf *xb = buf_from(r, x, (size_t)n_max * cols);
                kvq_buf *yb = r->be->buf_new(r->b, sizeof(float) * n_max * rows);
                assert_non_null(yb);
                for (int bi = 0; bi < n_ns; bi++) {
                    int n = ns[bi];
                    if ((bi + si) % 2 != bias) continue; /* each n once per scheme, bias alternating */
                    kvq_ref_matmul(&w.d, x, want, n);
                    memset(got, 0xff, sizeof(float) * (size_t)n * rows); /* NaN: rows never written */
                    r->be->buf_write(r->b, yb, 0, got, sizeof(float) * (size_t)n * rows);
                    r->be->matmul(r->b, wt, xb, yb, n);
                    kvq_status st = r->be->buf_read(r->b, yb, 0, got, sizeof(float) * (size_t)n * rows);
                    if (st != KVQ_OK) fail_msg("%s n=%d on %s: %s", what, n, r->label, kvq_last_error());
                    double e = tu_rel_l2(got, want, (size_t)n * rows);
                    if (!(e <= r->tol)) fail_msg("%s n=%d on %s: rel L2 %.3g > %.1g", what, n, r->label, e, r->tol);
                    if (e > worst[ri]) worst[ri] = e;
                }
                r->be->buf_free(r->b, xb);
                r->be->buf_free(r->b, yb);
                r->be->weight_free(r->b, wt);
            }
        }
        free(x), free(want), free(got);
        tweight_free(&w);
    }
    for (int ri = 0; ri < n_runners; ri++) print_message("%s: worst rel L2 %.3g\n", runners[ri].label, worst[ri]);
}

/* Embedding lookups: exact for dense rows, the reference's dequantization for AQLM. */
static void test_get_rows(void **state) {
    (void)state;
    for (int si = 0; si < N_SCHEMES; si++) {
        const scheme *s = &schemes[si];
        tweight w;
        make_scheme(&w, s);
        int cols = s->cols, n = 6;
        int32_t ids[6] = {s->rows - 1, 0, 5, s->rows / 2, 5, s->rows / 3};
        float *want = malloc(sizeof(float) * n * cols), *got = malloc(sizeof(float) * n * cols);
        assert_true(want && got);
        for (int i = 0; i < n; i++) kvq_ref_weight_row(&w.d, ids[i], want + (size_t)i * cols);
        for (int ri = 0; ri < n_runners; ri++) {
            const runner *r = &runners[ri];
            kvq_wt *wt = upload(r, &w.d, s->name);
            kvq_buf *out = r->be->buf_new(r->b, sizeof(float) * n * cols);
            r->be->get_rows(r->b, wt, ids, n, out);
            assert_int_equal(r->be->buf_read(r->b, out, 0, got, sizeof(float) * n * cols), KVQ_OK);
            if (s->fmt != KVQ_W_AQLM) {
                if (tu_max_abs_diff(got, want, (size_t)n * cols) != 0)
                    fail_msg("get_rows %s on %s: not exact", s->name, r->label);
            } else {
                double e = tu_rel_l2(got, want, (size_t)n * cols);
                if (!(e <= 1e-6)) fail_msg("get_rows %s on %s: rel L2 %.3g", s->name, r->label, e);
            }
            r->be->buf_free(r->b, out);
            r->be->weight_free(r->b, wt);
        }
        free(want), free(got);
        tweight_free(&w);
    }
}

/* weight_bytes: at least the payload a pass must read, and not wildly more. */
static void test_weight_bytes(void **state) {
    (void)state;
    for (int si = 0; si < N_SCHEMES; si++) {
        const scheme *s = &schemes[si];
        tweight w;
        make_scheme(&w, s);
        size_t payload = payload_bytes(&w.d), extra = 0;
        if (s->fmt == KVQ_W_AQLM) extra = (size_t)s->M * ((size_t)1 << s->nbits) * (size_t)s->ig * 2 + (size_t)s->rows * 8;
        for (int ri = 0; ri < n_runners; ri++) {
            const runner *r = &runners[ri];
            kvq_wt *wt = upload(r, &w.d, s->name);
            size_t got = r->be->weight_bytes(r->b, wt);
            if (got < payload || got > 2 * payload + extra + 65536)
                fail_msg("weight_bytes %s on %s: %zu, payload %zu + %zu", s->name, r->label, got, payload, extra);
            r->be->weight_free(r->b, wt);
        }
        tweight_free(&w);
    }
}

/* What a backend cannot hold is refused at upload with a message naming the tensor:
 * on the split instance, a row wider than its whole buffer limit. */
static void test_upload_refused(void **state) {
    (void)state;
    for (int ri = 0; ri < n_runners; ri++) {
        const runner *r = &runners[ri];
        if (!r->split) continue;
        tweight w;
        make_dense(&w, KVQ_W_F32, 2, atoi(SPLIT_MAX_BUFFER) / 4 + 1);
        w.d.name = "wide.weight";
        assert_false(r->be->weight_supported && r->be->weight_supported(r->b, &w.d));
        kvq_wt *wt = r->be->weight_upload(r->b, &w.d);
        assert_null(wt);
        assert_non_null(strstr(kvq_last_error(), "wide.weight"));
        tweight_free(&w);
    }
}

#ifdef KVQ_HAVE_VULKAN
/* Out of device memory halfway through a split upload (the core's KVQ_VK_MEMORY_LIMIT
 * cap, set here on the instance): one message naming the tensor, nothing kept. */
static void test_upload_out_of_memory(void **state) {
    (void)state;
    for (int ri = 0; ri < n_runners; ri++) {
        const runner *r = &runners[ri];
        if (!r->split) continue;
        tweight w;
        make_dense(&w, KVQ_W_F32, 300, 261);
        w.d.name = "big.weight";
        size_t held = r->b->dev_bytes;
        r->b->dev_limit = held + 3 * (size_t)atoi(SPLIT_MAX_BUFFER); /* room for a few pieces */
        r->b->host_fallback = 0;
        kvq_wt *wt = r->be->weight_upload(r->b, &w.d);
        r->b->dev_limit = 0;
        r->b->host_fallback = 1;
        assert_null(wt);
        const char *e = kvq_last_error();
        if (!strstr(e, "big.weight") || !strstr(e, "memory")) fail_msg("unclear message: %s", e);
        print_message("%s: %s\n", r->label, e);
        assert_int_equal(r->b->dev_bytes, held);
        tweight_free(&w);
    }
}
#endif


#ifdef KVQ_HAVE_VULKAN
/* fp16 lookup tables (mm_lut_h, shaders/mm_lut.glsl): Vulkan opened without exact on a device
 * with fp16 arithmetic. Per output o, token t, against a double reference:
 *   |y - y_ref| <= |s_o| * (u * sum_e |T_e| + 2^-28 * sum_e B_e) + f32 rounding,
 * T_e the entries the row looks up (dot of a group of x with a codeword), B_e = max |x| of
 * the entry's chunk * the largest codeword L1 norm, u = 2^-10 (Vulkan lets a conversion to
 * fp16 truncate; rounding to nearest gives 2^-11, the worst ratio to that is printed). The
 * f32 rounding term is k * 2^-24 * |s_o| * sum |x_j c_j| with k the additions on a path,
 * plus 2^-24 * (|bias| + |y|) for adding the bias and the result's own rounding.
 * Shapes: 1x8, 2x8, 4x8, 8x8 with in_group 8 and 16, row counts past a workgroup's 1024,
 * partial last chunks; n = 1..4; x with chunks of large values (the table entries would
 * overflow fp16 unscaled) and of tiny ones (subnormal unscaled). */
static void test_matvec_lut16(void **state) {
    (void)state;
    const kvq_backend *be = kvq_backend_find("vulkan");
    kvq_backend_opts o = {.n_threads = 2, .allow_software = 1, .exact = 0};
    kvq_bctx *b = NULL;
    if (!be || be->init(&o, &b) != KVQ_OK) skip();
    if (!b->caps.fp16) {
        print_message("no fp16 arithmetic on this device: the f32 tables only\n");
        be->release(b);
        skip();
    }
    static const struct { int rows, cols, M, ig; } shapes[] = {
        {300, 264, 2, 8}, {257, 272, 2, 16}, {131, 200, 1, 8}, {77, 336, 1, 16},
        {1029, 88, 4, 8}, {513, 48, 4, 16}, {45, 128, 8, 8}, {300, 256, 8, 16},
    };
    const double u = 1.0 / 1024, f32u = 1.0 / (1 << 24);
    double worst = 0, worst11 = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int rows = shapes[si].rows, cols = shapes[si].cols, M = shapes[si].M, ig = shapes[si].ig, G = cols / ig;
        tweight w;
        make_aqlm(&w, rows, cols, M, 8, ig, 1);
        w.d.bias = si % 2 ? w.bias : NULL;
        kvq_wt *wt = be->weight_upload(b, &w.d);
        assert_non_null(wt);
        if (!wt->lut16) fail_msg("%dx8 g%d: not on the fp16 tables", M, ig);
        float *x = malloc(sizeof(float) * 4 * cols), *got = malloc(sizeof(float) * 4 * rows);
        assert_true(x && got);
        tu_rand_fill(x, (size_t)4 * cols, &rng);
        /* token 0 as drawn; 1: its first chunk large (unscaled fp16 entries would overflow);
         * 2: all tiny (unscaled they would be fp16 subnormals); 3: large, tiny and plain chunks */
        int cw = 16 / M * ig; /* x values per chunk */
        for (int k = 0; k < cols; k++) {
            if (k < cw) x[(size_t)cols + k] *= 1e5f;
            x[(size_t)2 * cols + k] *= 1e-6f;
            if (k < cw) x[(size_t)3 * cols + k] *= 3e4f;
            else if (k >= cols - cw) x[(size_t)3 * cols + k] *= 1e-5f;
        }
        const uint8_t *codes = w.d.codes;
        float cb_l1 = 0;
        for (int c = 0; c < M * 256; c++) {
            float l1 = 0;
            for (int j = 0; j < ig; j++) l1 += fabsf(kvq_f16_to_f32(kvq_rd_u16(w.d.codebooks, (size_t)c * ig + j)));
            if (l1 > cb_l1) cb_l1 = l1;
        }
        kvq_buf *xb = buf_from(&(runner){.be = be, .b = b}, x, (size_t)4 * cols);
        kvq_buf *yb = be->buf_new(b, sizeof(float) * 4 * rows);
        assert_non_null(yb);
        int n_chunks = (G * M + 15) / 16;
        for (int n = 1; n <= 4; n++) {
            be->matmul(b, wt, xb, yb, n);
            assert_int_equal(be->buf_read(b, yb, 0, got, sizeof(float) * (size_t)n * rows), KVQ_OK);
            for (int t = 0; t < n; t++) {
                const float *xt = x + (size_t)t * cols;
                for (int r = 0; r < rows; r++) {
                    double y = 0, sum_t = 0, sum_b = 0, sum_abs = 0;
                    for (int g = 0; g < G; g++) {
                        int chunk = (g * M) / 16;
                        double xmax = 0;
                        for (int k = chunk * 16 / M * ig; k < (chunk + 1) * 16 / M * ig && k < cols; k++)
                            if (fabs(xt[k]) > xmax) xmax = fabs(xt[k]);
                        for (int m = 0; m < M; m++) {
                            int code = codes[((size_t)r * G + g) * M + m];
                            double e = 0;
                            for (int j = 0; j < ig; j++) {
                                double c = kvq_f16_to_f32(kvq_rd_u16(w.d.codebooks, ((size_t)m * 256 + code) * ig + j));
                                e += c * xt[g * ig + j];
                                sum_abs += fabs(c * xt[g * ig + j]);
                            }
                            y += e, sum_t += fabs(e), sum_b += xmax * cb_l1;
                        }
                    }
                    double sc = kvq_f16_to_f32(kvq_rd_u16(w.d.scales, (size_t)r));
                    double bias = w.d.bias ? kvq_f16_to_f32(kvq_rd_u16(w.d.bias, (size_t)r)) : 0;
                    y = y * sc + bias;
                    double steps = ig + 16 + n_chunks + 2; /* dot, the 16 lookups, chunks (and splits), scale + bias */
                    double bound = fabs(sc) * (u * sum_t + 0x1p-28 * sum_b + steps * f32u * sum_abs) + f32u * (fabs(bias) + fabs(y));
                    double err = fabs(got[(size_t)t * rows + r] - y);
                    if (!(err <= bound))
                        fail_msg("%dx8 g%d %dx%d n=%d row %d token %d: |err| %.3g > bound %.3g (sum|T| %.3g)", M, ig, rows,
                                 cols, n, r, t, err, bound, sum_t);
                    if (err / bound > worst) worst = err / bound;
                    double b11 = fabs(sc) * (u / 2 * sum_t + 0x1p-28 * sum_b + steps * f32u * sum_abs) + f32u * (fabs(bias) + fabs(y));
                    if (err / b11 > worst11) worst11 = err / b11;
                }
            }
        }
        be->buf_free(b, xb), be->buf_free(b, yb);
        be->weight_free(b, wt);
        free(x), free(got);
        tweight_free(&w);
    }
    print_message("fp16 tables: worst |err| / bound %.3f (with u = 2^-11: %.3f)\n", worst, worst11);
    be->release(b);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_weight_bytes),
        cmocka_unit_test(test_upload_refused),
#ifdef KVQ_HAVE_VULKAN
        cmocka_unit_test(test_upload_out_of_memory),
        cmocka_unit_test(test_matvec_lut16),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
