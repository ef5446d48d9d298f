/* kvq-bench spec: speculative decoding (kvq_spec_*) against plain greedy decode of the same
 * number of tokens from the same prompt, in one run. Also times one verify forward of K+1
 * tokens against a one-token step: with a perfect, free draft a step yields K+1 tokens for
 * that ratio, which bounds what any draft can give (free_draft_speedup). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "common.h"
#include "kvq.h"

static const char *P = "kvq-bench spec";
static int g_cpu_time; /* --cpu-time */

/* Wall seconds, or with --cpu-time the process's CPU seconds: at -t 1 on a machine shared with
 * other jobs the CPU time of the work moves far less than the wall time around it. */
static double now(void) {
    if (!g_cpu_time) return kvq_tool_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(FILE *f) {
    fprintf(f,
            "usage: kvq-bench spec [-m DIR | --synthetic NAME --scheme 2x8|1x16 [--synthetic-dir D]]\n"
            "                      (--draft DIR|self | --lookup N) [--draft-max K] [--draft-min-p P] [-n N] [-t N]\n"
            "                      [--prompt TEXT | --prompt-file FILE [--prompt-tokens N]] [--prompt-repeat R] [--reps R] [--cpu-time]\n"
            "  Greedy speculative decode of N tokens (default 32) against plain greedy decode of as many, same\n"
            "  prompt, same run. One line:\n"
            "  spec draft=<self|lookup|DIR> k= n= accept_rate= tokens_per_step= tg_tps= tg_base_tps= speedup=\n"
            "       verify_ratio= free_draft_speedup= same=\n"
            "  --draft self    the model drafts for itself (every draft stands: the acceptance upper bound)\n"
            "  --lookup N      prompt lookup of N-grams (no draft model)\n"
            "  --draft-max K   drafts per step (default 4)\n"
            "  --prompt-file   the first --prompt-tokens (default 64) tokens of FILE as the passage\n"
            "  --prompt-repeat R   the passage R times over (default 1), so lookup finds what follows\n"
            "  --reps R        both decodes R times, alternating; the best time of each (default 1)\n"
            "  --cpu-time      time by the process's CPU time (with -t 1: steadier on a busy machine)\n"
            "  --backend B     cpu (default), vulkan or auto; -ngl N|auto: the last N layers on the GPU\n"
            "  verify_ratio    time of one forward of K+1 tokens / one token (logits for every row)\n"
            "  same            1 when the speculative tokens equal plain decode's (they must, greedy)\n");
    return 0;
}

/* BOS (when the tokenizer has one) + the passage (text, or the first n_tok tokens of a file)
 * repeated rep times. */
static int32_t *make_prompt(const kvq_tokenizer *tok, const char *text, const char *file, long n_tok, long rep, int *n) {
    char *buf = NULL;
    if (file) {
        FILE *f = fopen(file, "rb");
        size_t cap = 1 << 16, len = 0; /* the passage is short: the file's start is enough */
        if (!f || !(buf = malloc(cap + 1))) {
            if (f) fclose(f);
            kvq_tool_die(P, "%s: cannot read", file);
            return NULL;
        }
        len = fread(buf, 1, cap, f);
        buf[len] = 0;
        fclose(f);
        text = buf;
    }
    int all = kvq_tokenize(tok, text, strlen(text), 0, NULL, 0), m = all;
    if (file && m > n_tok) m = (int)n_tok;
    int32_t *one = all > 0 ? malloc(sizeof *one * (size_t)all) : NULL, *ids = NULL;
    int bos = kvq_token_bos(tok) >= 0;
    if (one && (ids = malloc(sizeof *ids * (size_t)(bos + m * rep)))) {
        kvq_tokenize(tok, text, strlen(text), 0, one, all);
        if (bos) ids[0] = kvq_token_bos(tok);
        for (long r = 0; r < rep; r++) memcpy(ids + bos + r * m, one, sizeof *one * (size_t)m);
        *n = bos + m * (int)rep;
    } else {
        kvq_tool_die(P, "empty prompt or out of memory");
    }
    free(one);
    free(buf);
    return ids;
}

static kvq_context *new_ctx(kvq_model *m, int n_ctx) {
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.logits_all = 1; /* as the verify forward: logits for every row of a batch */
    kvq_context *c = NULL;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) kvq_tool_die(P, "%s", kvq_last_error());
    return c;
}

static kvq_sampler *greedy(void) {
    kvq_sampler_params sp = kvq_sampler_default_params();
    sp.temp = 0;
    return kvq_sampler_new(&sp);
}

/* Plain decode of n tokens after the prompt into out; seconds of the decode alone. */
static double run_base(kvq_context *c, int n_vocab, const int32_t *ids, int n_ids, int n, int32_t *out) {
    kvq_sampler *s = greedy();
    if (kvq_eval(c, ids, n_ids) != KVQ_OK) return -1;
    double t0 = now();
    for (int i = 0; i < n; i++) {
        out[i] = kvq_sample(s, kvq_logits(c), n_vocab);
        kvq_sampler_accept(s, out[i]);
        if (i + 1 < n && kvq_eval(c, &out[i], 1) != KVQ_OK) return -1;
    }
    double t = now() - t0;
    kvq_sampler_free(s);
    return t;
}

/* Best of 3: one forward of k tokens at the cache's end, then the cache cut back. */
static double step_time(kvq_context *c, const int32_t *toks, int k) {
    int at = kvq_n_past(c);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        if (kvq_eval(c, toks, k) != KVQ_OK) return -1;
        double t = now() - t0;
        if (t < best) best = t;
        kvq_kv_truncate(c, at);
    }
    return best;
}

/* Speculative decode of n tokens after the prompt into got, on fresh contexts (dm NULL: lookup);
 * seconds of the steps alone (the prompt is read by both models first), or -1. */
static double run_spec(kvq_model *m, kvq_model *dm, int n_ctx, kvq_spec_params sp, const int32_t *ids, int n_ids, int n,
                       int32_t *got, uint64_t *drafted, uint64_t *accepted, int *steps) {
    kvq_context *c = new_ctx(m, n_ctx), *d = dm ? new_ctx(dm, n_ctx) : NULL;
    kvq_spec *s = NULL;
    kvq_sampler *smp = greedy();
    double t = -1;
    sp.draft = d;
    if (!c || (dm && !d) || kvq_spec_new(c, &sp, &s) != KVQ_OK || kvq_spec_prompt(s, ids, n_ids) != KVQ_OK) goto done;
    for (int i = 0; i < n_ids; i++) kvq_sampler_accept(smp, ids[i]);
    *steps = 0;
    double t0 = now();
    for (int have = 0; have < n; (*steps)++) {
        int r = kvq_spec_step(s, smp, got + have, n - have);
        if (r <= 0) goto done;
        have += r;
    }
    t = now() - t0;
    kvq_spec_stats(s, drafted, accepted);
done:
    kvq_sampler_free(smp);
    kvq_spec_free(s);
    kvq_context_free(c);
    kvq_context_free(d);
    return t;
}

int kvq_bench_spec(int argc, char **argv) {
    const char *dir = NULL, *synth = NULL, *scheme = "1x16", *synth_root = NULL, *draft = NULL, *text = NULL, *file = NULL;
    long n = 32, threads = 0, lookup = 0, k = 4, n_tok = 64, rep = 1, reps = 1;
    double min_p = 0;
    const char *backend = "cpu";
    int ngl = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!strcmp(a, "--cpu-time")) {
            g_cpu_time = 1;
            continue;
        }
        if (!v) return kvq_tool_die(P, "unknown option or missing value: %s (see --help)", a);
        i++;
        if (kvq_tool_is_model_flag(a)) dir = v;
        else if (!strcmp(a, "--synthetic")) synth = v;
        else if (!strcmp(a, "--scheme")) scheme = v;
        else if (!strcmp(a, "--synthetic-dir")) synth_root = v;
        else if (!strcmp(a, "--draft")) draft = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "-ngl")) { if (kvq_tool_parse_ngl(v, &ngl)) goto bad; }
        else if (!strcmp(a, "--prompt")) text = v;
        else if (!strcmp(a, "--prompt-file")) file = v;
        else if (!strcmp(a, "--lookup")) { if (kvq_tool_parse_int(v, 1, 64, &lookup)) goto bad; }
        else if (!strcmp(a, "--draft-max")) { if (kvq_tool_parse_int(v, 1, 64, &k)) goto bad; }
        else if (!strcmp(a, "--draft-min-p")) { if (kvq_tool_parse_float(v, &min_p) || min_p < 0 || min_p > 1) goto bad; }
        else if (!strcmp(a, "-n")) { if (kvq_tool_parse_int(v, 2, 1 << 16, &n)) goto bad; }
        else if (!strcmp(a, "-t")) { if (kvq_tool_parse_int(v, 1, 1024, &threads)) goto bad; }
        else if (!strcmp(a, "--prompt-tokens")) { if (kvq_tool_parse_int(v, 1, 1 << 16, &n_tok)) goto bad; }
        else if (!strcmp(a, "--reps")) { if (kvq_tool_parse_int(v, 1, 100, &reps)) goto bad; }
        else if (!strcmp(a, "--prompt-repeat")) { if (kvq_tool_parse_int(v, 1, 64, &rep)) goto bad; }
        else return kvq_tool_die(P, "unknown option '%s' (see --help)", a);
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a);
    }
    if (!draft == !lookup) return kvq_tool_die(P, "give --draft DIR|self or --lookup N (see --help)");
    if (text && file) return kvq_tool_die(P, "give --prompt or --prompt-file, not both");
    char synth_dir[4096];
    double bytes;
    if (synth) {
        if (dir) return kvq_tool_die(P, "give either -m or --synthetic, not both");
        if (kvq_bench_synth_dir(synth, scheme, synth_root, synth_dir, sizeof synth_dir, &bytes)) return 1;
        dir = synth_dir;
    }
    if (!dir && !(dir = kvq_tool_demo_model())) return kvq_tool_die(P, "no -m given and the demo model was not found");
    if (kvq_tool_model_dir(P, &dir, 1) || (draft && strcmp(draft, "self") && kvq_tool_model_dir(P, &draft, 1))) return 1;
    if (!text && !file) text = "The jury said that the city of Atlanta should take steps to improve its schools, and";

    kvq_model_params mp = kvq_model_default_params();
    mp.n_threads = (int)threads;
    mp.backend = backend;
    mp.n_gpu_layers = ngl;
    kvq_model *m = NULL, *dm = NULL;
    if (kvq_model_load(dir, &mp, &m) != KVQ_OK) return kvq_tool_die(P, "%s: %s", dir, kvq_last_error());
    int self = draft && !strcmp(draft, "self"), rc = 1;
    if (draft && !self && kvq_model_load(draft, &mp, &dm) != KVQ_OK) {
        kvq_model_free(m);
        return kvq_tool_die(P, "--draft %s: %s", draft, kvq_last_error());
    }
    if (self) dm = m;
    int n_ids = 0;
    int32_t *ids = make_prompt(kvq_model_tokenizer(m), text, file, n_tok, rep, &n_ids);
    int32_t *base = malloc(sizeof *base * (size_t)n), *got = malloc(sizeof *got * (size_t)(n + k + 2));
    int32_t pad[65] = {0};
    int n_ctx = (n_ids + (int)n + (int)k + 2 + 255) / 256 * 256;
    kvq_context *c = NULL;
    if (!ids || !base || !got) goto done;
    fprintf(stderr, "%s: %s, prompt %d tokens, %ld tokens, %s\n", P, kvq_model_desc(m), n_ids, n, kvq_model_backend_name(m));
    kvq_spec_params sp = kvq_spec_default_params();
    sp.lookup_n = (int)lookup;
    sp.draft_max = (int)k;
    sp.draft_min_p = (float)min_p;
    /* the two decodes alternate, best of --reps each: the machine's load moves between them */
    double t_base = 1e30, t_spec = 1e30, t1 = 0, tk = 0;
    uint64_t drafted = 0, accepted = 0;
    int steps = 1;
    for (long r = 0; r < reps; r++) {
        if (!(c = new_ctx(m, n_ctx))) goto done;
        double tb = run_base(c, kvq_model_n_vocab(m), ids, n_ids, (int)n, base);
        if (tb < 0) { kvq_tool_die(P, "%s", kvq_last_error()); goto done; }
        if (tb < t_base) t_base = tb;
        if (r == reps - 1) { /* a step of 1 and of K+1 where decode left the cache: verify_ratio */
            for (int i = 0; i <= k; i++) pad[i] = base[(size_t)i % (size_t)n];
            t1 = step_time(c, pad, 1), tk = step_time(c, pad, (int)k + 1);
            if (t1 <= 0 || tk <= 0) { kvq_tool_die(P, "%s", kvq_last_error()); goto done; }
        }
        kvq_context_free(c);
        c = NULL;
        double ts = run_spec(m, dm, n_ctx, sp, ids, n_ids, (int)n, got, &drafted, &accepted, &steps);
        if (ts < 0) { kvq_tool_die(P, "%s", kvq_last_error()); goto done; }
        if (ts < t_spec) t_spec = ts;
    }
    int same = !memcmp(base, got, sizeof *base * (size_t)n);
    /* tokens per verify forward (the first token comes from the prompt's logits) */
    double per_step = (double)(n - 1) / steps;
    const char *name = self ? "self" : draft ? draft : "lookup";
    printf("spec draft=%s k=%ld n=%ld drafted=%llu accepted=%llu accept_rate=%.3f tokens_per_step=%.2f tg_tps=%.3f "
           "tg_base_tps=%.3f speedup=%.3f verify_ratio=%.3f free_draft_speedup=%.3f same=%d\n",
           name, k, n, (unsigned long long)drafted, (unsigned long long)accepted,
           drafted ? (double)accepted / (double)drafted : 0.0, per_step, n / t_spec, n / t_base, t_base / t_spec, tk / t1,
           per_step / (tk / t1), same);
    if (!same) fprintf(stderr, "%s: speculative tokens differ from plain greedy decode\n", P);
    rc = !same;
done:
    kvq_context_free(c);
    free(ids), free(base), free(got);
    if (dm && dm != m) kvq_model_free(dm);
    kvq_model_free(m);
    return rc;
}
