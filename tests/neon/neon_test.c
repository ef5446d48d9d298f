/* Standalone check of the NEON attention kernels (no cmocka): built for
 * aarch64 by run.sh and run under qemu. Compares kvq_cpu_attention with the
 * NEON and scalar paths against kvq_ref_attention, and the CPU store bytes
 * against the reference store. Exit status 1 on any mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "neon_check.h"
#include "ref/ref.h"

static uint64_t g_st = 0x9E3779B97F4A7C15ull;
static float randf(void) { /* about N(0,1), with the odd outlier */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        g_st ^= g_st << 13;
        g_st ^= g_st >> 7;
        g_st ^= g_st << 17;
        s += (float)((g_st >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
    return (g_st & 255) == 0 ? 6.0f * s : 0.866f * s;
}

static int g_fail;

static void check_store(void) {
    for (int t = 0; t < 4; t++)
        for (int rot = 0; rot < 2; rot++)
            for (int hd = 32; hd <= 256; hd *= 2)
                for (int rep = 0; rep < 20; rep++) {
                    float x[256];
                    uint8_t a[1024], b[1024];
                    for (int i = 0; i < hd; i++) x[i] = randf() * (rep == 0 ? 0.0f : rep == 1 ? 1e6f : 1.0f);
                    kvq_ref_kv_store_row((kvq_cache_type)t, rot, x, a, hd);
                    kvq_cpu_kv_store_row((kvq_cache_type)t, rot, x, b, hd);
                    if (memcmp(a, b, kvq_kv_row_bytes((kvq_cache_type)t, hd)) != 0) {
                        printf("FAIL store bytes: type %d rotate %d hd %d\n", t, rot, hd);
                        g_fail = 1;
                    }
                }
}

static void check_attn(int n_head, int n_kv, int hd, int pos0, int n, int window, kvq_cache_type tk,
                       kvq_cache_type tv, int rot, int threads) {
    const int n_ctx = pos0 + n;
    const size_t kb = kvq_kv_row_bytes(tk, hd), vb = kvq_kv_row_bytes(tv, hd), qn = (size_t)n * n_head * hd;
    uint8_t *K = malloc((size_t)n_kv * n_ctx * kb), *V = malloc((size_t)n_kv * n_ctx * vb);
    float *q = malloc(qn * 4), *ref = malloc(qn * 4), *out = malloc(qn * 4), x[256];
    if (!K || !V || !q || !ref || !out) abort();
    for (int r = 0; r < n_kv * n_ctx; r++) {
        for (int i = 0; i < hd; i++) x[i] = randf();
        kvq_cpu_kv_store_row(tk, rot, x, K + (size_t)r * kb, hd);
        for (int i = 0; i < hd; i++) x[i] = randf();
        kvq_cpu_kv_store_row(tv, rot, x, V + (size_t)r * vb, hd);
    }
    for (size_t i = 0; i < qn; i++) q[i] = 1.5f * randf();
    const float scale = 1.0f / sqrtf((float)hd);
    kvq_ref_attention(n_head, n_kv, hd, scale, window, tk, rot, K, tv, rot, V, n_ctx, q, ref, pos0, n);
    kvq_cpu_attn_args args = {
        .a = {.n_head = n_head, .n_head_kv = n_kv, .head_dim = hd, .scale = scale, .window = window},
        .type_k = tk, .type_v = tv, .rotate_k = rot, .rotate_v = rot, .k = K, .v = V, .n_ctx = n_ctx};
    const kvq_isa isas[] = {KVQ_ISA_NEON, KVQ_ISA_SCALAR};
    for (int ii = 0; ii < 2; ii++) {
        if (!kvq_cpu_isa_available(isas[ii])) {
            printf("FAIL: %s not available\n", kvq_isa_name(isas[ii]));
            g_fail = 1;
            continue;
        }
        kvq_cpu_set_isa(isas[ii]);
        kvq_cpu_attention(&args, q, out, pos0, n, threads);
        const double e = rel_l2(out, ref, qn);
        if (!(e <= 1e-4)) {
            printf("FAIL %s: rel err %.3g (heads %d/%d hd %d pos0 %d n %d window %d K%d V%d rot %d)\n",
                   kvq_isa_name(isas[ii]), e, n_head, n_kv, hd, pos0, n, window, (int)tk, (int)tv, rot);
            g_fail = 1;
        }
    }
    free(K);
    free(V);
    free(q);
    free(ref);
    free(out);
}

int main(void) {
    check_store();
    int cases = 0;
    for (int tk = 0; tk < 4; tk++)
        for (int tv = 0; tv < 4; tv++)
            for (int rot = 0; rot < 2; rot++, cases++)
                check_attn(8, 2, 64, 70, 1 + 3 * rot, 0, (kvq_cache_type)tk, (kvq_cache_type)tv, rot, 1 + rot);
    /* context edges, GQA 1/4/8, head dims, windows, prompts, split-K */
    const int shapes[][6] = {{4, 4, 64, 0, 1, 0},    {8, 2, 128, 30, 1, 0},  {8, 1, 64, 32, 1, 0},
                             {32, 8, 128, 999, 1, 0}, {8, 1, 128, 1100, 1, 0}, {8, 2, 64, 400, 1, 9},
                             {4, 4, 64, 0, 33, 0},    {16, 2, 64, 300, 7, 40}, {4, 2, 256, 100, 3, 0},
                             {12, 4, 64, 90, 5, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int tt = 0; tt < 3; tt++, cases++) {
            const int *s = shapes[i];
            const kvq_cache_type t = tt == 0 ? KVQ_CACHE_Q4 : tt == 1 ? KVQ_CACHE_Q8 : KVQ_CACHE_F16;
            check_attn(s[0], s[1], s[2], s[3], s[4], s[5], t, t, tt == 0, 2);
        }
    printf("%s: %d attention cases, NEON and scalar vs reference\n", g_fail ? "FAILED" : "ok", cases);
    return g_fail;
}
