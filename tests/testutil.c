#include "testutil.h"

#include "backend.h"
#include "kvq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tu_fixture(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/fixtures/%s", KVQ_SHARED_DIR, rel);
    struct stat st;
    return stat(buf, &st) == 0 ? buf : NULL;
}

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) fail_msg("short read %s", path);
    fclose(f);
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

float tu_randf(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return (float)((x >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

void tu_rand_fill(float *x, size_t n, uint64_t *state) {
    for (size_t i = 0; i < n; i++) x[i] = tu_randf(state);
}

double tu_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double tu_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d;
    }
    return m;
}

char *tu_run(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    if (!p) fail_msg("popen failed: %s", cmd);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return buf;
}

const char *tu_tmpdir(void) {
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvq-test-XXXXXX");
        if (!mkdtemp(dir)) fail_msg("mkdtemp failed");
    }
    return dir;
}

kvq_bctx *tu_backend_start(int i, const kvq_backend **be) {
    *be = kvq_backend_get(i);
    kvq_backend_opts o = {.n_threads = 2, .allow_software = 1, .exact = 1}; /* the int8 prompt tiles: test_matmul */
    kvq_bctx *b = NULL;
    if (!*be || (*be)->init(&o, &b) != KVQ_OK) {
        printf("[ SKIPPED  ] backend %s does not start here: %s\n", *be ? (*be)->name : "?", kvq_last_error());
        return NULL;
    }
    printf("[ BACKEND  ] %s\n", (*be)->describe(b));
    return b;
}

int32_t *tu_valid_tokens(const kvq_tokenizer *tok, int ctx, int32_t **targets) {
    const char *p = tu_fixture("text/brown-valid.txt");
    assert_non_null(p);
    size_t len;
    char *text = tu_read_file(p, &len);
    if (len > (size_t)ctx * 64) len = (size_t)ctx * 64; /* plenty of text for ctx tokens */
    int n = kvq_tokenize(tok, text, len, 0, NULL, 0);
    assert_true(n > ctx);
    int32_t *all = malloc(sizeof *all * (size_t)n);
    assert_non_null(all);
    kvq_tokenize(tok, text, len, 0, all, n);
    free(text);
    int32_t *in = malloc(sizeof *in * (size_t)ctx);
    assert_non_null(in);
    in[0] = kvq_token_bos(tok);
    memcpy(in + 1, all, sizeof *in * (size_t)(ctx - 1));
    *targets = all;
    return in;
}

double tu_nll(const float *row, int n, int target) {
    double mx = row[0], s = 0;
    for (int j = 1; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < n; j++) s += exp(row[j] - mx);
    return mx + log(s) - row[target];
}

int tu_backend_starts(const char *name) {
    const kvq_backend *be = kvq_backend_find(name);
    kvq_bctx *b = NULL;
    kvq_backend_opts o = {.n_threads = 2, .allow_software = 1};
    if (!be || be->init(&o, &b) != KVQ_OK) {
        printf("[  SKIPPED ] backend %s does not start here: %s\n", name, be ? kvq_last_error() : "not built");
        return 0;
    }
    be->release(b);
    return 1;
}

int tu_env_backend(const char **name) {
    const char *want = getenv("KVQ_TEST_BACKEND");
    *name = want && *want ? want : NULL;
    return !*name || tu_backend_starts(want);
}

int tu_env_gpu_layers(void) {
    const char *v = getenv("KVQ_TEST_NGL");
    return v && *v ? atoi(v) : -1;
}

void tu_top3(const float *x, int n, int *out) {
    out[0] = out[1] = out[2] = -1;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 3; k++) {
            if (out[k] < 0 || x[i] > x[out[k]]) {
                for (int j = 2; j > k; j--) out[j] = out[j - 1];
                out[k] = i;
                break;
            }
        }
    }
}

int32_t tu_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void tu_greedy(struct kvq_context *c, int n_vocab, int32_t *out, int n) {
    for (int i = 0; i < n; i++) {
        out[i] = tu_argmax(kvq_logits(c), n_vocab);
        assert_int_equal(kvq_eval(c, &out[i], 1), KVQ_OK);
    }
}

double tu_i8_block_bound(const float *wo, const float *xt, int cols, int kb) {
    double bound = 0.0;
    for (int k0 = 0; k0 < cols; k0 += kb) {
        int k1 = k0 + kb < cols ? k0 + kb : cols;
        double mw = 0, mx = 0, lw = 0, lx = 0;
        for (int k = k0; k < k1; k++) {
            mw = fmax(mw, fabs(wo[k])), mx = fmax(mx, fabs(xt[k]));
            lw += fabs(wo[k]), lx += fabs(xt[k]);
        }
        double sw = mw / 127, sa = mx / 127;
        bound += sw / 2 * lx + sa / 2 * lw + (k1 - k0) * sw * sa / 4;
    }
    return bound;
}

void tu_same_as_alone(const float *y, const float *alone, int n, int rows, const char *what, const char *isa, int nt) {
    for (size_t i = 0; i < (size_t)n * (size_t)rows; i++)
        if (memcmp(&y[i], &alone[i], sizeof(float)))
            fail_msg("%s isa=%s n=%d threads=%d: token %zu row %zu is %.9g in the batch, %.9g alone", what, isa, n, nt,
                     i / (size_t)rows, i % (size_t)rows, y[i], alone[i]);
}
