/* kvq-chat: generate text from a prompt (-p), or a minimal line-by-line session without -p. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kvq.h"

static const char *P = "kvq-chat";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvq-chat [options]\n"
            "  -m, --model DIR       HF model directory (default: the bundled demo model)\n"
            "  -p, --prompt TEXT     prompt; generate and exit (without -p: read prompts from stdin, one per line)\n"
            "  -n, --n-predict N     tokens to generate (default 128)\n"
            "  -c, --ctx-size N      context length (default: min(trained, 4096))\n"
            "  -b, --batch-size N    prompt tokens per forward pass (default 512)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "  --temp T              temperature, 0 = greedy (default 0.8)\n"
            "  --top-k K             top-k (default 40, 0 = off)\n"
            "  --top-p P             top-p (default 0.95, 1 = off)\n"
            "  --seed S              sampling seed (default 0)\n"
            "  -ctk, --cache-type-k T   K cache type: f32, f16, q8, q4 (default f16)\n"
            "  -ctv, --cache-type-v T   V cache type: f32, f16, q8, q4 (default f16)\n"
            "  --kv-rotate / --no-kv-rotate   Hadamard-rotate quantized K/V (default: on for q4)\n"
            "  --backend NAME        auto (default: a GPU when present, else the CPU), cpu or vulkan\n"
            "  --device N|NAME       GPU device index or part of its name (also KVQ_VK_DEVICE)\n"
            "  --ids                 print generated token ids instead of text\n"
            "  --verbose-prompt      print the prompt's token ids on stderr\n"
            "  --logits-out FILE     write float32 logits of the last prompt position\n"
            "  -h, --help            this help\n"
            "  --version             print the version\n");
}

typedef struct {
    const char *model, *prompt, *logits_out, *backend, *device;
    long n_predict, n_ctx, n_batch, threads;
    kvq_sampler_params sp;
    int type_k, type_v, kv_rotate, print_ids, verbose_prompt;
} opts;

static int parse(int argc, char **argv, opts *o) {
    o->sp = kvq_sampler_default_params();
    o->n_predict = 128;
    o->type_k = o->type_v = KVQ_CACHE_F16;
    o->kv_rotate = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_ARG()                                                     \
    do {                                                               \
        if (!v) return kvq_tool_die(P, "option %s needs a value", a) + 1; \
        i++;                                                           \
    } while (0)
        double d;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return -1; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED_ARG(); o->model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEED_ARG(); o->prompt = v; }
        else if (!strcmp(a, "--logits-out")) { NEED_ARG(); o->logits_out = v; }
        else if (!strcmp(a, "--backend")) { NEED_ARG(); o->backend = v; }
        else if (!strcmp(a, "--device")) { NEED_ARG(); o->device = v; }
        else if (!strcmp(a, "--ids")) o->print_ids = 1;
        else if (!strcmp(a, "--verbose-prompt")) o->verbose_prompt = 1;
        else if (!strcmp(a, "--kv-rotate")) o->kv_rotate = 1;
        else if (!strcmp(a, "--no-kv-rotate")) o->kv_rotate = 0;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { NEED_ARG(); if (kvq_tool_parse_int(v, 0, 1 << 30, &o->n_predict)) goto bad; }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { NEED_ARG(); if (kvq_tool_parse_int(v, 0, 1 << 30, &o->n_ctx)) goto bad; }
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) { NEED_ARG(); if (kvq_tool_parse_int(v, 1, 1 << 20, &o->n_batch)) goto bad; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { NEED_ARG(); if (kvq_tool_parse_int(v, 1, 1024, &o->threads)) goto bad; }
        else if (!strcmp(a, "--top-k")) { NEED_ARG(); if (kvq_tool_parse_int(v, 0, 1 << 30, &n)) goto bad; o->sp.top_k = (int)n; }
        else if (!strcmp(a, "--seed")) { NEED_ARG(); if (kvq_tool_parse_int(v, 0, 0x7fffffffffffffffL, &n)) goto bad; o->sp.seed = (uint64_t)n; }
        else if (!strcmp(a, "--temp")) { NEED_ARG(); if (kvq_tool_parse_float(v, &d) || d < 0) goto bad; o->sp.temp = (float)d; }
        else if (!strcmp(a, "--top-p")) { NEED_ARG(); if (kvq_tool_parse_float(v, &d) || d <= 0 || d > 1) goto bad; o->sp.top_p = (float)d; }
        else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) { NEED_ARG(); if ((o->type_k = kvq_cache_type_parse(v)) < 0) goto bad; }
        else if (!strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) { NEED_ARG(); if ((o->type_v = kvq_cache_type_parse(v)) < 0) goto bad; }
        else return kvq_tool_die(P, "unknown option '%s' (see --help)", a) + 1;
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a) + 1;
#undef NEED_ARG
    }
    return 0;
}

/* Generates up to n tokens after the prompt already evaluated in c, streaming to stdout. */
static int generate(kvq_context *c, const kvq_model *m, kvq_sampler *s, const opts *o, int *n_gen) {
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    kvq_detok *dt = kvq_detok_new(tok, 1);
    char piece[1024];
    int first = 1;
    *n_gen = 0;
    for (long i = 0; i < o->n_predict; i++) {
        int32_t id = kvq_sample(s, kvq_logits(c), kvq_model_n_vocab(m));
        if (kvq_token_is_eog(tok, id)) break;
        if (o->print_ids) {
            printf(first ? "%d" : " %d", id);
        } else if (dt && kvq_detok_push(dt, id, piece, sizeof piece) > 0) {
            fputs(piece, stdout);
        }
        first = 0;
        fflush(stdout);
        (*n_gen)++;
        if (i + 1 == o->n_predict) break;
        if (kvq_eval(c, &id, 1) != KVQ_OK) {
            kvq_detok_free(dt);
            return kvq_tool_die(P, "%s", kvq_last_error());
        }
    }
    if (!o->print_ids && dt && kvq_detok_flush(dt, piece, sizeof piece) > 0) fputs(piece, stdout);
    if (o->print_ids || *n_gen) putchar('\n');
    fflush(stdout);
    kvq_detok_free(dt);
    return 0;
}

static int run_prompt(kvq_context *c, const kvq_model *m, kvq_sampler *s, const opts *o, const char *text) {
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    int n = kvq_tokenize(tok, text, strlen(text), 1, NULL, 0);
    if (n < 0) return kvq_tool_die(P, "%s", kvq_last_error());
    if (n == 0) return kvq_tool_die(P, "empty prompt");
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    if (!ids) return kvq_tool_die(P, "out of memory");
    kvq_tokenize(tok, text, strlen(text), 1, ids, n);
    if (o->verbose_prompt) {
        fprintf(stderr, "%s: prompt ids:", P);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fputc('\n', stderr);
    }
    double t0 = kvq_tool_now();
    if (kvq_eval(c, ids, n) != KVQ_OK) {
        free(ids);
        return kvq_tool_die(P, "%s", kvq_last_error());
    }
    free(ids);
    double t1 = kvq_tool_now();
    if (o->logits_out) {
        FILE *f = fopen(o->logits_out, "wb");
        size_t nv = (size_t)kvq_model_n_vocab(m);
        if (!f || fwrite(kvq_logits(c), sizeof(float), nv, f) != nv || fclose(f) != 0)
            return kvq_tool_die(P, "%s: cannot write logits", o->logits_out);
    }
    int n_gen = 0;
    if (generate(c, m, s, o, &n_gen)) return 1;
    double t2 = kvq_tool_now();
    fprintf(stderr, "%s: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.1f tok/s)\n", P, n,
            t1 - t0, n / (t1 - t0), n_gen, t2 - t1, n_gen > 0 ? n_gen / (t2 - t1) : 0.0);
    fprintf(stderr, "%s: KV cache %.2f MiB in use of %.2f MiB allocated (K %s, V %s)\n", P,
            (double)kvq_kv_bytes_used(c) / (1 << 20), (double)kvq_kv_bytes_total(c) / (1 << 20),
            kvq_cache_type_name((kvq_cache_type)o->type_k), kvq_cache_type_name((kvq_cache_type)o->type_v));
    return 0;
}

int main(int argc, char **argv) {
    if (kvq_tool_version(P, argc, argv)) return 0;
    opts o = {0};
    int r = parse(argc, argv, &o);
    if (r) return r < 0 ? 0 : 1;
    if (!o.model && !(o.model = kvq_tool_demo_model()))
        return kvq_tool_die(P, "no -m given and the demo model (models/demo) was not found");
    kvq_model_params mp = kvq_model_default_params();
    mp.n_threads = (int)o.threads;
    mp.backend = o.backend;
    mp.device = o.device;
    double t0 = kvq_tool_now();
    kvq_model *m;
    if (kvq_model_load(o.model, &mp, &m) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    fprintf(stderr, "%s: loaded %s in %.2f s: %s\n", P, o.model, kvq_tool_now() - t0, kvq_model_desc(m));
    kvq_tool_report_backend(P, m);
    kvq_context_params cp = kvq_context_default_params();
    cp.n_ctx = (int)o.n_ctx;
    if (o.n_batch) cp.n_batch = (int)o.n_batch;
    cp.type_k = (kvq_cache_type)o.type_k;
    cp.type_v = (kvq_cache_type)o.type_v;
    cp.kv_rotate = o.kv_rotate;
    kvq_context *c;
    if (kvq_context_new(m, &cp, &c) != KVQ_OK) {
        kvq_model_free(m);
        return kvq_tool_die(P, "%s", kvq_last_error());
    }
    kvq_sampler *s = kvq_sampler_new(&o.sp);
    int rc = 0;
    if (o.prompt) {
        rc = run_prompt(c, m, s, &o, o.prompt);
    } else {
        char line[8192];
        fprintf(stderr, "%s: reading prompts from stdin, one per line (Ctrl-D ends)\n", P);
        while (!rc && fgets(line, sizeof line, stdin)) {
            line[strcspn(line, "\n")] = 0;
            if (!line[0]) continue;
            kvq_kv_truncate(c, 0);
            rc = run_prompt(c, m, s, &o, line);
        }
    }
    kvq_sampler_free(s);
    kvq_context_free(c);
    kvq_model_free(m);
    return rc;
}
