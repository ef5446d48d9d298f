/* Batched AQLM matmuls (prompts) through int8 tiles: a panel of rows is
 * decoded once (the ISA's aqlm_rows, scale applied), requantized to int8 with
 * one scale per row and 256-value block, and every token of the batch is
 * multiplied against it with integer dot products (vpdpbusd, maddubs, sdot).
 * The decode is paid once per panel and batch, so from a few dozen tokens on
 * the multiply-adds set the pace, at 64 per instruction on AVX-512 VNNI.
 *
 * Scheme (this file's scalar kernel is the spec every SIMD one must match bit
 * for bit): for block b of KVQ_I8T_KB values, the weight row's scale is
 * sw = max|W_b| / 127 and q_w = round(W / sw); token t's activations likewise
 * sa = max|x_b| / 127, q_x = round(x / sa) (both in [-127, 127]). Then
 *   y[t][o] = sum_b (float)(q_w . q_x)_b * (sw * sa), summed in block order
 * with one fused multiply-add per block, the dot product exact in int32.
 * Each weight is off by at most sw/2 and each activation by sa/2, so per
 * output
 *   |y - W.x| <= sum_b ( sw/2 * |x_b|_1 + sa/2 * |W_b|_1 + nb_vals * sw*sa/4 )
 * plus f32 rounding; tests/test_matmul.c checks every output against it.
 * On the 2x8 and 1x16 fixtures this path changes perplexity by less than the
 * README's budget; kvq_model_params.exact turns it off. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu/i8tile/i8tile_kernels.h"

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

int kvq_i8t_cols_pad(int cols) { return (int)round_up((size_t)cols, KVQ_I8T_KB); }

/* q = round(v * 127 / max|v|); a NaN scale makes the outputs that use the block
 * NaN, as the exact path's would be. */
float kvq_i8t_qblock_scalar(const float *v, int n, int8_t *q, int32_t *sum) {
    float mx = 0.0f;
    for (int k = 0; k < n; k++) mx = fabsf(v[k]) > mx || v[k] != v[k] ? fabsf(v[k]) : mx;
    int32_t s = 0;
    if (!(mx <= 3.0e38f)) {
        memset(q, 0, KVQ_I8T_KB);
        if (sum) *sum = 0;
        return NAN;
    }
    float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
    for (int k = 0; k < n; k++) {
        float r = v[k] * inv;
        r = r < -127.0f ? -127.0f : r > 127.0f ? 127.0f : r;
        q[k] = (int8_t)kvq_round_ne(r);
        s += q[k];
    }
    memset(q + n, 0, (size_t)(KVQ_I8T_KB - n));
    if (sum) *sum = s;
    return mx / 127.0f;
}

void kvq_i8t_quant_x(kvq_i8t_qblock_fn qb, const float *x, int cols, int8_t *q, float *sa, int flip) {
    int kp = kvq_i8t_cols_pad(cols);
    for (int k0 = 0, b = 0; k0 < kp; k0 += KVQ_I8T_KB, b++) {
        int n = cols - k0 < KVQ_I8T_KB ? cols - k0 : KVQ_I8T_KB;
        sa[b] = qb(x + k0, n, q + k0, NULL);
        if (flip)
            for (int k = 0; k < KVQ_I8T_KB; k++) q[k0 + k] = (int8_t)((uint8_t)q[k0 + k] ^ 0x80u);
    }
}

void kvq_i8t_pack(kvq_i8t_qblock_fn qb, const float *rows, int nr, int cols, int8_t *wp, float *sw, int32_t *wsum) {
    int kp = kvq_i8t_cols_pad(cols), nb = kp / KVQ_I8T_KB;
    int8_t q[KVQ_I8T_KB];
    for (int r = 0; r < KVQ_I8T_PR; r++) {
        int v = r / 16, lane = r % 16;
        for (int b = 0; b < nb; b++) {
            int k0 = b * KVQ_I8T_KB, n = r < nr ? (cols - k0 < KVQ_I8T_KB ? cols - k0 : KVQ_I8T_KB) : 0;
            float s = qb(rows + (size_t)r * cols + k0, n, q, &wsum[b * KVQ_I8T_PR + r]);
            sw[b * KVQ_I8T_PR + r] = n ? s : 0.0f;
            int8_t *dst = wp + ((size_t)b * KVQ_I8T_NV + (size_t)v) * KVQ_I8T_VBYTES + (size_t)lane * 4;
            for (int k4 = 0; k4 < KVQ_I8T_KB / 4; k4++) memcpy(dst + (size_t)k4 * 64, q + 4 * k4, 4);
        }
    }
}

/* The spec: signed activations (flip 0), wsum unused. */
void kvq_i8t_panel_scalar(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                          size_t kp, const float *sa, size_t nb, int nt, float *yt) {
    for (int t = 0; t < nt; t++)
        for (int b = b0; b < b1; b++)
            for (int r = 0; r < KVQ_I8T_PR; r++) {
                const int8_t *w = wp + ((size_t)b * KVQ_I8T_NV + (size_t)(r / 16)) * KVQ_I8T_VBYTES + (size_t)(r % 16) * 4;
                const int8_t *x = xq + (size_t)t * kp + (size_t)b * KVQ_I8T_KB;
                int32_t dot = 0;
                for (int k4 = 0; k4 < KVQ_I8T_KB / 4; k4++)
                    for (int j = 0; j < 4; j++) dot += w[k4 * 64 + j] * x[4 * k4 + j];
                float *y = &yt[(size_t)t * KVQ_I8T_PR + r];
                *y = fmaf((float)dot, sw[b * KVQ_I8T_PR + r] * sa[(size_t)t * nb + (size_t)b], *y);
            }
}

/* The panel kernel for this CPU, or NULL where only the spec exists (the
 * caller then keeps its other paths: scalar int8 would be slower than them). */
const kvq_i8t_kernel *kvq_i8t_kernel_for_cpu(void) {
#if defined(__x86_64__)
    static const kvq_i8t_kernel vnni = {kvq_i8t_panel_vnni, kvq_i8t_qblock_avx512, 1},
                                avx512 = {kvq_i8t_panel_avx2, kvq_i8t_qblock_avx512, 0},
                                avx2 = {kvq_i8t_panel_avx2, kvq_i8t_qblock_avx2, 0};
#if defined(KVQ_HAVE_AVXVNNI)
    static const kvq_i8t_kernel avxvnni = {kvq_i8t_panel_avxvnni, kvq_i8t_qblock_avx2, 0};
    if (kvq_cpu_isa() == KVQ_ISA_AVX2 && kvq_cpu_has_avxvnni()) return &avxvnni;
#endif
    switch (kvq_cpu_isa()) {
    case KVQ_ISA_AVX512: return kvq_cpu_has_vnni() ? &vnni : &avx512;
    case KVQ_ISA_AVX2: return &avx2;
    default: return NULL;
    }
#elif defined(__aarch64__)
    static const kvq_i8t_kernel neon = {kvq_i8t_panel_neon, kvq_i8t_qblock_scalar, 0};
    return kvq_cpu_isa() == KVQ_ISA_NEON && kvq_cpu_has_dotprod() ? &neon : NULL;
#else
    return NULL;
#endif
}

/* Scratch layout: the n tokens' int8 values and block scales, shared; then per
 * thread its f32 panel rows, int8 panel, sw, wsum and the panel's outputs for
 * all tokens, each piece 64-byte aligned. */
static size_t shared_bytes(size_t kp, size_t nb, int n) { return round_up((size_t)n * kp, 64) + round_up((size_t)n * nb * 4, 64); }
static size_t thread_bytes(int cols, size_t kp, size_t nb, int n) {
    return round_up((size_t)KVQ_I8T_PR * (size_t)cols * 4, 64) + KVQ_I8T_PR * kp + 2 * round_up(nb * KVQ_I8T_PR * 4, 64) +
           (size_t)n * KVQ_I8T_PR * 4;
}

size_t kvq_i8t_scratch_bytes(int cols, int n, int nt) {
    size_t kp = (size_t)kvq_i8t_cols_pad(cols), nb = kp / KVQ_I8T_KB;
    return shared_bytes(kp, nb, n) + (size_t)nt * thread_bytes(cols, kp, nb, n);
}

void kvq_cpu_matmul_i8t(const kvq_cpu_weight *w, const kvq_i8t_kernel *ik, kvq_rows_fn rows_fn, const float *x,
                        float *y, int n, int nt, void *buf) {
    int cols = w->cols, rows = w->rows, kp = kvq_i8t_cols_pad(cols), nb = kp / KVQ_I8T_KB;
    int panels = (rows + KVQ_I8T_PR - 1) / KVQ_I8T_PR;
    int8_t *xq = buf;
    float *sa = (float *)((char *)buf + round_up((size_t)n * kp, 64));
    char *p = (char *)buf + shared_bytes((size_t)kp, (size_t)nb, n);
    size_t per = thread_bytes(cols, (size_t)kp, (size_t)nb, n);
    if (nt > panels) nt = panels;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads(), a, b;
        kvq_split(n, T, t, &a, &b);
        for (int i = a; i < b; i++)
            kvq_i8t_quant_x(ik->qblock, x + (size_t)i * cols, cols, xq + (size_t)i * kp, sa + (size_t)i * nb, ik->flip);
        char *mine = p + (size_t)t * per;
        float *f32 = (float *)mine;
        int8_t *wp = (int8_t *)(mine + round_up((size_t)KVQ_I8T_PR * (size_t)cols * 4, 64));
        float *sw = (float *)((char *)wp + (size_t)KVQ_I8T_PR * kp);
        int32_t *wsum = (int32_t *)((char *)sw + round_up((size_t)nb * KVQ_I8T_PR * 4, 64));
        float *yt = (float *)((char *)wsum + round_up((size_t)nb * KVQ_I8T_PR * 4, 64));
#pragma omp barrier
        /* panels handed out as threads ask: the two vCPUs of a VM run 10-30% apart */
#pragma omp for schedule(dynamic, 1)
        for (int pi = 0; pi < panels; pi++) {
            int r0 = pi * KVQ_I8T_PR, r1 = r0 + KVQ_I8T_PR < rows ? r0 + KVQ_I8T_PR : rows;
            rows_fn(w, r0, r1, f32);
            kvq_i8t_pack(ik->qblock, f32, r1 - r0, cols, wp, sw, wsum);
            memset(yt, 0, (size_t)n * KVQ_I8T_PR * sizeof *yt);
            /* a chunk of blocks (64 KB of panel) stays in L2 while every token passes */
            for (int b0 = 0; b0 < nb; b0 += KVQ_I8T_KC) {
                int b1 = b0 + KVQ_I8T_KC < nb ? b0 + KVQ_I8T_KC : nb;
                ik->panel(wp, sw, wsum, b0, b1, xq, (size_t)kp, sa, (size_t)nb, n, yt);
            }
            for (int i = 0; i < n; i++) {
                float *yi = y + (size_t)i * rows;
                const float *ti = yt + (size_t)i * KVQ_I8T_PR;
                for (int r = r0; r < r1; r++) yi[r] = ti[r - r0] + (w->bias ? w->bias[r] : 0.0f);
            }
        }
    }
}
