/* kvq-ppl: perplexity of a text file, optionally with KL divergence against a reference KV cache type. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kvq.h"

static const char *P = "kvq-ppl";

/* --kl-at: positions of a chunk whose KL is also reported on its own, as the mean over
 * the KL_WINDOW positions ending there (long-context checks: how far the cache holds up). */
#define KL_WINDOW 256
#define KL_AT_MAX 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvq-ppl -f TEXT [options]\n"
            "  -m, --model DIR       HF model directory (default: the bundled demo model), or ORG/NAME[:REV]\n"
            "                        (alias -hf): from the Hugging Face cache, else downloaded into it\n"
            "  --plan                print download, disk, memory at -c and -ctk/-ctv, RAM, fit and speed; exit\n"
            "  -f, --file TEXT       text file to score (tokenized without BOS)\n"
            "  --ids FILE            score token ids instead (whitespace-separated integers, e.g. a generated stream)\n"
            "  -c, --ctx-size N      tokens per chunk (default 512); each chunk is evaluated as BOS + N-1 tokens\n"
            "  --chunks K            score only the first K chunks (default: all)\n"
            "  -b, --batch-size N    tokens per forward pass (default: N of -c)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "  -ctk, -ctv T          K / V cache types: f32, f16, q8 (q8_0), q4 (q4_0) (default f16)\n"
            "  --kv-rotate / --no-kv-rotate   Hadamard-rotate quantized K/V (default: on for q4)\n"
            "  --kl-base T           also run with cache type T for K and V and report KL divergence against it\n"
            "  --kl-exact            report KL divergence against the same model with --exact (a second load)\n"
            "  --kl-at P,P,...       with --kl-base: also the KL of the %d positions of each chunk ending at position P\n"
            "  --backend NAME        auto (default: a GPU when present, else the CPU), cpu or vulkan\n"
            "  -ngl N                with a GPU backend: the last N layers on it, the rest on the CPU (all / -1: every layer; auto: what fits)\n"
            "  --device N|NAME       GPU device index or part of its name (also KVQ_VK_DEVICE)\n"
            "  --aqlm-cb8            CPU: keep 1x16 AQLM codebooks as int8 (faster decode, ~1%% weight change)\n"
            "  --aqlm-lut8           CPU with AVX-512 VBMI: 2x8 AQLM through int8 tables (faster prompts, ~1%% matmul change)\n"
            "  --no-aqlm-i8          CPU: 1x16 AQLM through its fp16 codebook, exact gathers (the default without VNNI)\n"
            "  --aqlm-i8             CPU: 1x16 through int8 codewords and integer dot products, ~1%% matmul change (the\n"
            "                        default with AVX-512 VNNI or AVX-VNNI, where it decodes faster; off with --exact)\n"
            "  --exact               CPU and Vulkan: prompts through the exact AQLM paths too (default: int8 tiles, README)\n"
            "  -h, --help            this help\n"
            "  --version             print the version\n"
            "Last stdout line: ppl = <value>\n", KL_WINDOW);
}

/* log-softmax normaliser of one row */
static double log_sum_exp(const float *x, int n) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    return mx + log(s);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* KL(base || test) of the two next-token distributions. */
static double kl_div(const float *base, const float *test, int n) {
    double lb = log_sum_exp(base, n), lt = log_sum_exp(test, n), kl = 0;
    for (int i = 0; i < n; i++) {
        double pb = base[i] - lb;
        kl += exp(pb) * (pb - (test[i] - lt));
    }
    return kl > 0 ? kl : 0;
}

static int parse_list(const char *s, long *out, int max) {
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || n == max || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n;
}

/* Whitespace-separated token ids of a file, malloc'd; -1 after an error line. */
static int read_ids(const char *path, int32_t **out) {
    FILE *f = fopen(path, "r");
    if (!f) return kvq_tool_die(P, "%s: cannot open: %s", path, strerror(errno)), -1;
    int n = 0, cap = 0;
    int32_t *ids = NULL;
    long v;
    int r;
    while ((r = fscanf(f, "%ld", &v)) == 1) {
        if (v < 0 || v > INT32_MAX) break;
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            int32_t *t = realloc(ids, sizeof *ids * (size_t)cap);
            if (!t) break;
            ids = t;
        }
        ids[n++] = (int32_t)v;
    }
    int bad = r != EOF || ferror(f);
    fclose(f);
    if (bad || n == 0) {
        free(ids);
        return kvq_tool_die(P, "%s: expected whitespace-separated token ids (non-negative integers)", path), -1;
    }
    *out = ids;
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static kvq_context *make_ctx(kvq_model *m, int n_ctx, int n_batch, int tk, int tv, int rot) {
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.type_k = (kvq_cache_type)tk;
    cp.type_v = (kvq_cache_type)tv;
    cp.kv_rotate = rot;
    cp.logits_all = 1;
    kvq_context *c = NULL;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) return NULL;
    kvq_tool_report_context(P, c);
    return c;
}

int main(int argc, char **argv) {
    if (kvq_tool_version(P, argc, argv)) return 0;
    const char *model = NULL, *file = NULL, *ids_file = NULL, *backend = NULL, *device = NULL;
    long kl_at[KL_AT_MAX];
    int n_kl_at = 0;
    long n_ctx = 512, chunks = 0, n_batch = 0, threads = 0;
    int plan = 0, tk = KVQ_CACHE_F16, tv = KVQ_CACHE_F16, kl_base = -1, rot = -1, cb8 = 0, lut8 = 0, i8 = 1, exact = 0, kl_exact = 0, ngl = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        static const char *const flags[] = {"-h", "--help", "--kv-rotate", "--no-kv-rotate", "--aqlm-cb8", "--aqlm-lut8", "--aqlm-i8", "--no-aqlm-i8", "--exact", "--kl-exact", "--plan"};
        static const char *const valued[] = {"-m", "--model", "-hf", "--hf-repo", "-f", "--file", "--backend", "--device", "-c", "--ctx-size", "--chunks",
                                             "-b", "--batch-size", "-t", "--threads", "-ctk", "--cache-type-k", "-ctv",
                                             "--cache-type-v", "--kl-base", "-ngl", "--n-gpu-layers", "--ids", "--kl-at"};
        int takes = 0, known = 0;
        for (size_t k = 0; k < sizeof flags / sizeof *flags; k++) known |= !strcmp(a, flags[k]);
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) takes |= !strcmp(a, valued[k]);
        if (!known && !takes) return kvq_tool_die(P, "unknown option '%s' (see --help)", a);
        if (takes && !v) return kvq_tool_die(P, "option %s needs a value (see --help)", a);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--kv-rotate")) rot = 1;
        else if (!strcmp(a, "--no-kv-rotate")) rot = 0;
        else if (!strcmp(a, "--aqlm-cb8")) cb8 = 1;
        else if (!strcmp(a, "--aqlm-lut8")) lut8 = 1;
        else if (!strcmp(a, "--aqlm-i8")) i8 = 2;
        else if (!strcmp(a, "--no-aqlm-i8")) i8 = 0;
        else if (!strcmp(a, "--exact")) exact = 1;
        else if (!strcmp(a, "--kl-exact")) kl_exact = 1;
        else if (!strcmp(a, "--plan")) plan = 1;
        else if (kvq_tool_is_model_flag(a)) model = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--ids")) ids_file = v;
        else if (!strcmp(a, "--kl-at")) { if ((n_kl_at = parse_list(v, kl_at, KL_AT_MAX)) < 1) goto bad; }
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) { if (kvq_tool_parse_ngl(v, &ngl)) return kvq_tool_die(P, "bad -ngl '%s'", v); }
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { if (kvq_tool_parse_int(v, 2, 1 << 24, &n_ctx)) goto bad; }
        else if (!strcmp(a, "--chunks")) { if (kvq_tool_parse_int(v, 0, 1 << 30, &chunks)) goto bad; }
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) { if (kvq_tool_parse_int(v, 1, 1 << 24, &n_batch)) goto bad; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (kvq_tool_parse_int(v, 1, 1024, &threads)) goto bad; }
        else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) { if ((tk = kvq_tool_parse_cache_type(v)) < 0) goto bad_type; }
        else if (!strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) { if ((tv = kvq_tool_parse_cache_type(v)) < 0) goto bad_type; }
        else if (!strcmp(a, "--kl-base")) { if ((kl_base = kvq_tool_parse_cache_type(v)) < 0) goto bad_type; }
        if (takes) i++;
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a);
    bad_type:
        return kvq_tool_die(P, "bad value '%s' for %s: the cache types are " KVQ_TOOL_CACHE_TYPES, v, a);
    }
    if (plan) {
        if (!model && !(model = kvq_tool_demo_model())) return kvq_tool_die(P, "no -m given and the demo model was not found");
        kvq_model_params pp = kvq_model_default_params();
        pp.n_threads = (int)threads, pp.backend = backend, pp.device = device, pp.n_gpu_layers = ngl;
        return kvq_tool_plan(P, model, n_ctx, tk, tv, &pp, 1);
    }
    if (!file == !ids_file) return kvq_tool_die(P, "give a text file (-f FILE) or token ids (--ids FILE)");
    if (kl_exact && (kl_base >= 0 || exact)) return kvq_tool_die(P, "--kl-exact goes with neither --kl-base nor --exact");
    if (n_kl_at && kl_base < 0 && !kl_exact) return kvq_tool_die(P, "--kl-at needs --kl-base or --kl-exact");
    for (int i = 0; i < n_kl_at; i++)
        if (kl_at[i] > n_ctx || kl_at[i] < KL_WINDOW)
            return kvq_tool_die(P, "--kl-at %ld: positions must lie in %d..%ld (-c)", kl_at[i], KL_WINDOW, n_ctx);
    if (!model && !(model = kvq_tool_demo_model())) return kvq_tool_die(P, "no -m given and the demo model was not found");
    if (kvq_tool_model_dir(P, &model, 1)) return 1;
    if (!n_batch || n_batch > n_ctx) n_batch = n_ctx;

    int32_t *ids = NULL;
    int n_tok = 0;
    char *text = NULL;
    long len = 0;
    if (ids_file && (n_tok = read_ids(ids_file, &ids)) < 0) return 1;
    FILE *f = file ? fopen(file, "rb") : NULL;
    if (file) {
        if (!f) return kvq_tool_die(P, "%s: cannot open: %s", file, strerror(errno));
        len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
        if (len < 0 || fseek(f, 0, SEEK_SET) != 0) return kvq_tool_die(P, "%s: cannot read: %s", file, strerror(errno));
        if (len == 0) return kvq_tool_die(P, "%s: file is empty", file);
        text = malloc((size_t)len + 1);
        if (!text) return kvq_tool_die(P, "%s: out of memory for %ld bytes", file, len);
        if (fread(text, 1, (size_t)len, f) != (size_t)len)
            return kvq_tool_die(P, "%s: cannot read: %s", file, ferror(f) ? strerror(errno) : "file shrank while reading");
        fclose(f);
        text[len] = 0;
    }

    kvq_model_params mp = kvq_model_default_params();
    mp.n_threads = (int)threads;
    mp.backend = backend;
    mp.n_gpu_layers = ngl;
    mp.plan_ctx = (int)n_ctx;
    mp.plan_type_k = tk, mp.plan_type_v = tv;
    mp.device = device;
    mp.aqlm_cb8 = cb8;
    mp.aqlm_lut8 = lut8;
    mp.aqlm_i8 = i8;
    mp.exact = exact;
    kvq_model *m;
    if (kvq_model_load(model, &mp, &m) != KVQ_OK) {
        free(text);
        return kvq_tool_die(P, "%s", kvq_last_error());
    }
    kvq_tool_report_backend(P, m);
    kvq_model *mb = NULL; /* --kl-exact: the same checkpoint with exact prompt paths, the base of the KL */
    if (kl_exact) {
        kvq_model_params mpx = mp;
        mpx.exact = 1;
        if (kvq_model_load(model, &mpx, &mb) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    }
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    if (text) {
        n_tok = kvq_tokenize(tok, text, (size_t)len, 0, NULL, 0);
        if (n_tok == 0) return kvq_tool_die(P, "%s: no tokens in the text (only whitespace?)", file);
        ids = n_tok > 0 ? malloc(sizeof *ids * (size_t)n_tok) : NULL;
        if (!ids || kvq_tokenize(tok, text, (size_t)len, 0, ids, n_tok) != n_tok)
            return kvq_tool_die(P, "%s: cannot tokenize: %s", file, kvq_last_error());
        free(text);
    }
    if (!file) file = ids_file;
    long n_chunks = n_tok / n_ctx;
    if (chunks > 0 && chunks < n_chunks) n_chunks = chunks;
    if (n_chunks < 1) return kvq_tool_die(P, "%s: %d tokens is less than one chunk of %ld", file, n_tok, n_ctx);
    int32_t bos = kvq_token_bos(tok);
    if (bos < 0) return kvq_tool_die(P, "%s: the tokenizer has no BOS token", model);

    kvq_context *c = make_ctx(m, (int)n_ctx, (int)n_batch, tk, tv, rot);
    kvq_context *cb = kl_base >= 0 ? make_ctx(m, (int)n_ctx, (int)n_batch, kl_base, kl_base, rot)
                      : mb        ? make_ctx(mb, (int)n_ctx, (int)n_batch, tk, tv, rot)
                                  : NULL;
    if (!c || ((kl_base >= 0 || mb) && !cb)) return kvq_tool_die(P, "%s", kvq_last_error());
    int nv = kvq_model_n_vocab(m);
    size_t n_scored = (size_t)n_chunks * n_ctx;
    double nll = 0;
    double *kls = cb ? malloc(sizeof(double) * n_scored) : NULL;
    size_t agree = 0, k = 0;
    double at_kl[KL_AT_MAX] = {0}, at_agree[KL_AT_MAX] = {0};
    int32_t *in = malloc(sizeof *in * (size_t)n_ctx);
    double t0 = kvq_tool_now();
    for (long ch = 0; ch < n_chunks; ch++) {
        const int32_t *chunk = ids + ch * n_ctx;
        in[0] = bos;
        memcpy(in + 1, chunk, sizeof *in * (size_t)(n_ctx - 1));
        kvq_kv_truncate(c, 0);
        if (cb) kvq_kv_truncate(cb, 0);
        /* a batch at a time, scored before the next: logits of n_batch rows, not n_ctx */
        for (long i0 = 0; i0 < n_ctx; i0 += n_batch) {
            int nb = (int)(n_ctx - i0 < n_batch ? n_ctx - i0 : n_batch);
            if (kvq_eval(c, in + i0, nb) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
            if (cb && kvq_eval(cb, in + i0, nb) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
            for (int r = 0; r < nb; r++) {
                const long i = i0 + r;
                const float *row = kvq_logits_row(c, r);
                nll += log_sum_exp(row, nv) - row[chunk[i]];
                if (cb) {
                    const float *brow = kvq_logits_row(cb, r);
                    double kl = kl_div(brow, row, nv);
                    int same = argmax(brow, nv) == argmax(row, nv);
                    kls[k++] = kl;
                    agree += same;
                    for (int w = 0; w < n_kl_at; w++) /* window of positions (kl_at - KL_WINDOW, kl_at], 1-based */
                        if (i + 1 > kl_at[w] - KL_WINDOW && i + 1 <= kl_at[w]) at_kl[w] += kl, at_agree[w] += same;
                }
            }
        }
        fprintf(stderr, "%s: chunk %ld/%ld: ppl so far %.4f\n", P, ch + 1, n_chunks, exp(nll / ((ch + 1) * (double)n_ctx)));
    }
    double dt = kvq_tool_now() - t0;
    fprintf(stderr, "%s: %zu tokens scored in %.2f s (%.1f tok/s%s), K %s, V %s\n", P, n_scored, dt,
            (double)n_scored * (cb ? 2 : 1) / dt, cb ? ", both runs" : "", kvq_cache_type_name((kvq_cache_type)tk),
            kvq_cache_type_name((kvq_cache_type)tv));
    if (cb) {
        double sum = 0;
        for (size_t i = 0; i < k; i++) sum += kls[i];
        qsort(kls, k, sizeof *kls, cmp_double);
        size_t p99 = (size_t)ceil(0.99 * (double)k) - 1;
        printf("kl_base = %s\n", mb ? "exact" : kvq_cache_type_name((kvq_cache_type)kl_base));
        printf("mean_kld = %.6f\n", sum / (double)k);
        printf("p99_kld = %.6f\n", kls[p99]);
        printf("top1_agree = %.2f%%\n", 100.0 * (double)agree / (double)k);
        for (int w = 0; w < n_kl_at; w++) {
            double cnt = (double)KL_WINDOW * (double)n_chunks;
            printf("kl_at pos=%ld window=%d mean_kld=%.6f top1_agree=%.2f%%\n", kl_at[w], KL_WINDOW, at_kl[w] / cnt,
                   100.0 * at_agree[w] / cnt);
        }
    }
    printf("ppl = %.4f\n", exp(nll / (double)n_scored));
    free(kls);
    free(in);
    free(ids);
    kvq_context_free(cb);
    kvq_context_free(c);
    kvq_model_free(mb);
    kvq_model_free(m);
    return 0;
}
