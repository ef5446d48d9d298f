/* kvq-chat: a conversation with a model (chat template, incremental KV cache,
 * line editing, context shift), or one-shot generation from -p / -f. */
#include <fcntl.h>
#include <langinfo.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"
#include "kvq.h"

const char *CHAT_PROG = "kvq-chat";
static const char *P = "kvq-chat";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvq-chat [options]            conversation (stdin a TTY: line editing; else one turn per line)\n"
            "       kvq-chat -p TEXT [options]    generate a continuation of TEXT and exit\n"
            "  -m, --model DIR       HF model directory (default: the bundled demo model), or ORG/NAME[:REV]\n"
            "                        (alias -hf): from the Hugging Face cache, else downloaded into it\n"
            "  --plan                print download, disk, memory at -c and -ctk/-ctv, RAM, fit and speed; exit\n"
            "  -p, --prompt TEXT     prompt; print it and its continuation, then exit\n"
            "  -f, --file FILE       read the prompt from FILE\n"
            "  --chat                with -p/-f: wrap the prompt in the chat template as one user turn\n"
            "  --no-display-prompt   with -p/-f: print the continuation alone\n"
            "  -n, --n-predict N     tokens to generate (-1: until end of turn or full context;\n"
            "                        default 128 with -p, -1 in a conversation)\n"
            "  -c, --ctx-size N      context length (default: min(trained, 4096); 0: the trained context)\n"
            "  -b, --batch-size N    prompt tokens per forward pass (default 512)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "  --chat-template NAME  none, llama2, llama3, mistral, chatml, phi3, gemma, command-r\n"
            "                        (default: recognized from tokenizer_config.json)\n"
            "  --system TEXT         system message\n"
            "  --keep N              tokens at the start kept when the context is full (default 0)\n"
            "  --ignore-eos          do not stop at end-of-turn tokens (or, without a template, at a newline)\n"
            "  --temp T              temperature, 0 = greedy (default 0.8)\n"
            "  --top-k K             top-k (default 40, 0 = off)\n"
            "  --top-p P             top-p (default 0.95, 1 = off)\n"
            "  --min-p P             min-p (default 0.05, 0 = off)\n"
            "  --repeat-penalty F    repeat penalty (default 1.0 = off)\n"
            "  --repeat-last-n N     tokens the penalty looks back at (default 64)\n"
            "  --seed S              sampling seed (default -1: random; shown by /stats)\n"
            "  -ctk, --cache-type-k T   K cache type: f32, f16, q8 (q8_0), q4 (q4_0) (default f16)\n"
            "  -ctv, --cache-type-v T   V cache type: f32, f16, q8 (q8_0), q4 (q4_0) (default f16)\n"
            "  --kv-rotate / --no-kv-rotate   Hadamard-rotate quantized K/V (default: on for q4)\n"
            "  --backend NAME        auto (default: a GPU when present, else the CPU), cpu or vulkan\n"
            "  -ngl, --n-gpu-layers N  with a GPU backend: the last N layers (and the LM head) on it, the\n"
            "                        rest on the CPU; 0 = the CPU alone; all / -1 = every layer (default);\n"
            "                        auto = what the device's free memory holds (with the -c cache)\n"
            "  --device N|NAME       GPU device index or part of its name (also KVQ_VK_DEVICE)\n"
            "  --aqlm-cb8            CPU: keep 1x16 AQLM codebooks as int8 (faster decode, ~1%% weight change)\n"
            "  --aqlm-lut8           CPU with AVX-512 VBMI: 2x8 AQLM through int8 tables (faster prompts, ~1%% matmul change)\n"
            "  --no-aqlm-i8          CPU: 1x16 AQLM through its fp16 codebook, exact gathers (the default without VNNI)\n"
            "  --aqlm-i8             CPU: 1x16 through int8 codewords and integer dot products, ~1%% matmul change (the\n"
            "                        default with AVX-512 VNNI or AVX-VNNI, where it decodes faster; off with --exact)\n"
            "  --exact               CPU and Vulkan: prompts through the exact AQLM paths too (default: int8 tiles, README)\n"
            "  --draft DIR           speculative decoding: DIR (a smaller model, same tokenizer) drafts tokens\n"
            "                        the model verifies in one batched step (same output, faster decode)\n"
            "  --lookup N            speculative decoding without a second model: draft the tokens that\n"
            "                        followed the last earlier occurrence of the context's last N tokens\n"
            "  --draft-max K         drafts per step (default 8 with --draft, 6 with --lookup)\n"
            "  --draft-min-p P       --draft: stop drafting when the draft's top probability is below P\n"
            "  --json                with -p/-f: the continuation is one JSON object (constrained sampling)\n"
            "  --json-schema FILE    with -p/-f: the continuation is one JSON value valid under FILE's schema\n"
            "  --ids                 with -p: print generated token ids instead of text\n"
            "  --verbose-prompt      print the prompt's token ids on stderr\n"
            "  --logits-out FILE     with -p: write float32 logits of the last prompt position\n"
            "  --prompt-cache FILE   KV cache of the prompt on disk: start from the longest prefix FILE\n"
            "                        holds (same model, -ctk/-ctv), and write it there when it grew\n"
            "  -h, --help            this help\n"
            "  --version             print the version\n"
            "In a conversation, /help lists the commands (/reset, /stats, /system, /save, /load, /quit).\n");
}

static int parse(int argc, char **argv, chat_opts *o) {
    o->sp = kvq_sampler_default_params();
    o->n_predict = -2;
    o->seed = -1;
    o->type_k = o->type_v = KVQ_CACHE_F16;
    o->kv_rotate = -1;
    o->ngl = -1;
    o->aqlm_i8 = 1;
    const kvq_tool_model_flags mf = {&o->model, &o->backend, &o->device, &o->n_ctx, &o->n_batch, &o->threads,
                                     &o->type_k, &o->type_v, &o->kv_rotate, &o->aqlm_cb8, &o->aqlm_lut8, &o->aqlm_i8, &o->ngl, &o->exact, &o->plan};
    for (int i = 1; i < argc; i++) {
        int mr = kvq_tool_model_flag(P, &mf, argc, argv, &i);
        if (mr < 0) return 1;
        if (mr) continue;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        long n;
        if (FLAG_IS("-h", "--help")) { usage(stdout); return -1; }
        else if (FLAG_IS("-p", "--prompt")) { FLAG_VALUE(); o->prompt = v; }
        else if (FLAG_IS("-f", "--file")) { FLAG_VALUE(); o->prompt_file = v; }
        else if (FLAG_IS("--logits-out", "--logits-out")) { FLAG_VALUE(); o->logits_out = v; }
        else if (FLAG_IS("--prompt-cache", "--prompt-cache")) { FLAG_VALUE(); o->prompt_cache = v; }
        else if (FLAG_IS("--chat-template", "--chat-template")) { FLAG_VALUE(); o->chat_template = v; }
        else if (FLAG_IS("--system", "-sys")) { FLAG_VALUE(); o->system = v; }
        else if (FLAG_IS("--ids", "--ids")) o->print_ids = 1;
        else if (FLAG_IS("--json", "--json")) o->json = 1;
        else if (FLAG_IS("--json-schema", "--json-schema")) { FLAG_VALUE(); o->json_schema = v; }
        else if (FLAG_IS("--chat", "--chat")) o->chat = 1;
        else if (FLAG_IS("--ignore-eos", "--ignore-eos")) o->ignore_eos = 1;
        else if (FLAG_IS("--no-display-prompt", "--no-display-prompt")) o->no_display_prompt = 1;
        else if (FLAG_IS("--verbose-prompt", "--verbose-prompt")) o->verbose_prompt = 1;
        else if (FLAG_IS("-n", "--n-predict")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, -1, 1 << 30, &o->n_predict)) goto bad; }
        else if (FLAG_IS("--keep", "--keep")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 0, 1 << 30, &o->keep)) goto bad; }
        else if (FLAG_IS("--top-k", "--top-k")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 0, 1 << 30, &n)) goto bad; o->sp.top_k = (int)n; }
        else if (FLAG_IS("--repeat-last-n", "--repeat-last-n")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 0, 1 << 20, &n)) goto bad; o->sp.repeat_last_n = (int)n; }
        else if (FLAG_IS("--seed", "-s")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, -1, 0x7fffffffffffffffL, &o->seed)) goto bad; }
        else if (FLAG_IS("--draft", "--draft")) { FLAG_VALUE(); o->draft = v; }
        else if (FLAG_IS("--lookup", "--lookup")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 1, 64, &o->lookup)) goto bad; }
        else if (FLAG_IS("--draft-max", "--draft-max")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 1, 64, &o->draft_max)) goto bad; }
        else if (FLAG_IS("--draft-min-p", "--draft-min-p")) { FLAG_VALUE(); if (kvq_tool_parse_float(v, &d) || d < 0 || d > 1) goto bad; o->draft_min_p = d; }
        else if (FLAG_IS("--temp", "--temp")) { FLAG_VALUE(); if (kvq_tool_parse_float(v, &d) || d < 0) goto bad; o->sp.temp = (float)d; }
        else if (FLAG_IS("--top-p", "--top-p")) { FLAG_VALUE(); if (kvq_tool_parse_float(v, &d) || d <= 0 || d > 1) goto bad; o->sp.top_p = (float)d; }
        else if (FLAG_IS("--min-p", "--min-p")) { FLAG_VALUE(); if (kvq_tool_parse_float(v, &d) || d < 0 || d > 1) goto bad; o->sp.min_p = (float)d; }
        else if (FLAG_IS("--repeat-penalty", "--repeat-penalty")) { FLAG_VALUE(); if (kvq_tool_parse_float(v, &d) || d <= 0) goto bad; o->sp.repeat_penalty = (float)d; }
        else return kvq_tool_die(P, "unknown option '%s' (see --help)", a) + 1;
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a) + 1;
    }
    if (o->prompt && o->prompt_file) return kvq_tool_die(P, "give -p or -f, not both") + 1;
    if (o->draft && o->lookup) return kvq_tool_die(P, "give --draft or --lookup, not both") + 1;
    if ((o->json || o->json_schema) && (o->draft || o->lookup))
        return kvq_tool_die(P, "--json and --json-schema do not combine with --draft or --lookup") + 1;
    if ((o->json || o->json_schema) && !o->prompt && !o->prompt_file)
        return kvq_tool_die(P, "--json and --json-schema need -p or -f") + 1;
    /* before the model loads: a typo costs nothing */
    if (o->chat_template && kvq_tool_check_template_name(P, o->chat_template)) return 1;
    return 0;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, (cap *= 2) + 1);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

/* One-shot: prompt ids (BOS + text, or the template around one user turn). */
static int32_t *prompt_ids(const chat_opts *o, const kvq_tokenizer *tok, const char *text, int *n) {
    char *rendered = NULL;
    const char *src = text;
    int bos = 1;
    if (o->chat) {
        kvq_chat_template *t;
        if (kvq_chat_template_load(o->model, o->chat_template, &t) != KVQ_OK) {
            kvq_tool_die(P, "%s", kvq_last_error());
            return NULL;
        }
        kvq_chat_msg m[2] = {{.role = "system", .content = o->system ? o->system : ""}, {.role = "user", .content = text}};
        int skip = o->system ? 0 : 1;
        int len = kvq_chat_render(t, m + skip, 2 - skip, 1, NULL, 0);
        if (len >= 0 && (rendered = malloc((size_t)len + 1))) kvq_chat_render(t, m + skip, 2 - skip, 1, rendered, (size_t)len + 1);
        kvq_chat_template_free(t);
        if (!rendered) {
            kvq_tool_die(P, "%s", len < 0 ? kvq_last_error() : "out of memory");
            return NULL;
        }
        src = rendered;
        bos = 0; /* the template placed it */
    }
    int32_t *ids = NULL;
    *n = kvq_tokenize(tok, src, strlen(src), bos, NULL, 0);
    if (*n < 0) kvq_tool_die(P, "%s", kvq_last_error());
    else if (*n == 0) kvq_tool_die(P, "empty prompt");
    else if (!(ids = malloc(sizeof *ids * (size_t)*n))) kvq_tool_die(P, "out of memory");
    else kvq_tokenize(tok, src, strlen(src), bos, ids, *n);
    free(rendered);
    return ids;
}

/* --prompt-cache: restores the file into c when it is there and keeps the prefix it shares
 * with the prompt (one token short of all of it: the last is evaluated again for logits).
 * Returns where evaluation starts; a refused file is a warning and a cold start. */
static int prompt_cache_load(kvq_context *c, const chat_opts *o, const int32_t *ids, int n) {
    if (!o->prompt_cache || access(o->prompt_cache, F_OK) != 0) return 0;
    int32_t *saved = malloc(sizeof *saved * (size_t)kvq_n_ctx(c));
    int n_saved = 0, p = 0;
    if (!saved || kvq_context_restore(c, o->prompt_cache, saved, kvq_n_ctx(c), &n_saved) != KVQ_OK) {
        fprintf(stderr, "%s: warning: %s; evaluating the whole prompt\n", P, saved ? kvq_last_error() : "out of memory");
        free(saved);
        kvq_kv_truncate(c, 0);
        return 0;
    }
    while (p < n_saved && p < n && saved[p] == ids[p]) p++;
    if (p == n) p = n - 1;
    free(saved);
    kvq_kv_truncate(c, p);
    fprintf(stderr, "%s: %s: %d of the prompt's %d tokens taken from the cache file (the time below counts the rest)\n", P,
            o->prompt_cache, p, n);
    return p;
}

/* --json / --json-schema FILE: the constraint the continuation is sampled under. */
static int json_constraint_open(const chat_opts *o, const kvq_tokenizer *tok, kvq_json_constraint **out) {
    char *schema = NULL, err[256];
    if (o->json_schema && !(schema = read_file(o->json_schema))) return kvq_tool_die(P, "%s: cannot read", o->json_schema);
    if (schema && !schema[strspn(schema, " \t\r\n")]) { /* the library reads an empty schema as --json */
        free(schema);
        return kvq_tool_die(P, "%s: empty schema", o->json_schema);
    }
    *out = kvq_json_constraint_new(tok, schema, 1, err, sizeof err);
    free(schema);
    if (!*out) return kvq_tool_die(P, "%s: %s", o->json_schema ? o->json_schema : "--json", err);
    return 0;
}

static int one_shot(kvq_context *c, const kvq_model *m, kvq_sampler *s, chat_spec *cs, const chat_opts *o, int n_ctx) {
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    char *file_text = NULL;
    const char *text = o->prompt;
    if (o->prompt_file && !(text = file_text = read_file(o->prompt_file)))
        return kvq_tool_die(P, "%s: cannot read", o->prompt_file);
    int n;
    int32_t *ids = prompt_ids(o, tok, text, &n);
    if (!ids) {
        free(file_text);
        return 1;
    }
    if (o->verbose_prompt) {
        fprintf(stderr, "%s: prompt ids:", P);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fputc('\n', stderr);
    }
    if (n >= n_ctx) {
        free(ids);
        free(file_text);
        return kvq_tool_die(P, "prompt is %d tokens, the context holds %d (-c %d would fit)", n, n_ctx, n + 128);
    }
    double t0 = kvq_tool_now();
    int rc = 0, from = prompt_cache_load(c, o, ids, n);
    if (kvq_eval(c, ids + from, n - from) != KVQ_OK) rc = kvq_tool_die(P, "%s", kvq_last_error());
    if (!rc && o->prompt_cache && from < n - 1 && kvq_context_save(c, o->prompt_cache, ids, n) != KVQ_OK)
        fprintf(stderr, "%s: warning: %s\n", P, kvq_last_error());
    double t1 = kvq_tool_now();
    if (!rc && o->logits_out) {
        FILE *f = fopen(o->logits_out, "wb");
        size_t nv = (size_t)kvq_model_n_vocab(m);
        if (!f || fwrite(kvq_logits(c), sizeof(float), nv, f) != nv || fclose(f) != 0)
            rc = kvq_tool_die(P, "%s: cannot write logits", o->logits_out);
    }
    kvq_detok *dt = kvq_detok_new(tok, 1);
    char piece[1024];
    int display = !o->print_ids && !o->no_display_prompt;
    if (display && !o->chat) {
        /* the prompt as given, then the continuation decoded in its context so spaces stay */
        fputs(text, stdout);
        for (int i = 0; dt && i < n; i++) kvq_detok_push(dt, ids[i], piece, sizeof piece);
    } else if (display) {
        fputs(text, stdout);
        fputc('\n', stdout);
    }
    for (int i = 0; i < n; i++) kvq_sampler_accept(s, ids[i]);
    kvq_json_constraint *jc = NULL;
    if (!rc && (o->json || o->json_schema)) rc = json_constraint_open(o, tok, &jc);
    if (!rc && cs) rc = chat_spec_start(cs, ids, n);
    long n_gen = 0, limit = o->n_predict == -2 ? 128 : o->n_predict;
    while (!rc && !chat_interrupted && (limit < 0 || n_gen < limit)) {
        /* under a schema the value decides the end: stop once nothing else may follow */
        if (jc && kvq_json_constraint_complete(jc) == 2) break;
        int32_t id = cs   ? chat_spec_next(cs, s, limit < 0 ? 0 : limit - n_gen)
                     : jc ? kvq_json_constraint_sample(jc, s, kvq_logits(c), kvq_model_n_vocab(m))
                          : kvq_sample(s, kvq_logits(c), kvq_model_n_vocab(m));
        if (id < 0) {
            rc = 1;
            break;
        }
        if (kvq_token_is_eog(tok, id) && (jc || !o->ignore_eos)) break;
        if (jc) kvq_json_constraint_accept(jc, id);
        if (o->print_ids) printf(n_gen ? " %d" : "%d", id);
        else if (dt && kvq_detok_push(dt, id, piece, sizeof piece) > 0) fputs(piece, stdout);
        fflush(stdout);
        n_gen++;
        /* spec: the steps evaluate (and the sampler records); id sits at position n + n_gen - 1 */
        if ((limit >= 0 && n_gen == limit) || (cs ? n + n_gen - 1 : kvq_n_past(c)) >= n_ctx) break;
        if (cs) continue;
        if (kvq_eval(c, &id, 1) != KVQ_OK) rc = kvq_tool_die(P, "%s", kvq_last_error());
        kvq_sampler_accept(s, id);
    }
    if (!rc && !o->print_ids && dt && kvq_detok_flush(dt, piece, sizeof piece) > 0) fputs(piece, stdout);
    if (!rc && (o->print_ids || n_gen || display)) putchar('\n');
    fflush(stdout);
    kvq_detok_free(dt);
    kvq_json_constraint_free(jc);
    free(ids);
    free(file_text);
    if (rc) return rc;
    double t2 = kvq_tool_now();
    fprintf(stderr, "%s: prompt %d tokens in %.3f s (%.1f tok/s), generated %ld tokens in %.3f s (%.1f tok/s)", P,
            n - from, t1 - t0, (n - from) / (t1 - t0), n_gen, t2 - t1, n_gen > 0 ? n_gen / (t2 - t1) : 0.0);
    if (cs) chat_spec_print(cs, stderr, "; speculative: ");
    fputc('\n', stderr);
    fprintf(stderr, "%s: KV cache %.2f MiB in use of %.2f MiB allocated (K %s, V %s)\n", P,
            (double)kvq_kv_bytes_used(c) / (1 << 20), (double)kvq_kv_bytes_total(c) / (1 << 20),
            kvq_cache_type_name((kvq_cache_type)o->type_k), kvq_cache_type_name((kvq_cache_type)o->type_v));
    return 0;
}

/* The conversation loop: one user turn per input, /commands, Ctrl-C and Ctrl-D. */
static int converse(chat_session *S, int tty) {
    chat_input *in = chat_input_open(tty, S->color);
    if (!in) return kvq_tool_die(P, "cannot set up line input");
    if (tty)
        fprintf(stderr, "%s: template %s, context %d tokens. Type a message; /help for commands, Ctrl-C stops a reply, "
                        "Ctrl-D exits.\n", P, kvq_chat_template_name(S->t), S->n_ctx);
    int rc = 0;
    for (;;) {
        char *line;
        int st = chat_input_read(in, &line);
        if (st == CHAT_IN_EOF || st == CHAT_IN_INTR_EMPTY) break;
        if (st == CHAT_IN_INTR_TEXT) continue; /* Ctrl-C with text: drop the line, as a shell does */
        if (tty && line[0] == '/') {
            int r = chat_command(S, line);
            free(line);
            if (r == 1) break;
            if (r == 2) { rc = 1; break; }
            continue;
        }
        if (tty && !line[0]) { /* an empty line at the prompt is nothing to answer */
            free(line);
            continue;
        }
        chat_interrupted = 0;
        rc = chat_turn(S, line);
        free(line);
        if (rc) break;
    }
    chat_input_close(in);
    return rc;
}

static uint64_t random_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) s = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return s & 0x7fffffffffffffffull;
}

int main(int argc, char **argv) {
    if (kvq_tool_version(P, argc, argv)) return 0;
    chat_opts o = {0};
    int r = parse(argc, argv, &o);
    if (r) return r < 0 ? 0 : 1;
    if (!o.model && !(o.model = kvq_tool_demo_model()))
        return kvq_tool_die(P, "no -m given and the demo model (models/demo) was not found");
    const char *shown = o.model; /* a hub name stays the name in messages, not its snapshot's path */
    if (!o.plan && (kvq_tool_model_dir(P, &o.model, 1) || kvq_tool_model_dir(P, &o.draft, 1))) return 1;
    int one = o.prompt || o.prompt_file;
    int tty = !one && isatty(STDIN_FILENO);
    if (tty) { /* libedit edits and shows UTF-8 only in a UTF-8 locale */
        setlocale(LC_CTYPE, "");
        if (strcmp(nl_langinfo(CODESET), "UTF-8")) setlocale(LC_CTYPE, "C.UTF-8");
    }
    kvq_model_params mp = kvq_model_default_params();
    mp.n_threads = (int)o.threads;
    mp.backend = o.backend;
    mp.n_gpu_layers = o.ngl;
    mp.plan_ctx = o.n_ctx > 0 ? (int)o.n_ctx : 0;
    mp.plan_type_k = (int)o.type_k, mp.plan_type_v = (int)o.type_v;
    mp.device = o.device;
    mp.aqlm_cb8 = o.aqlm_cb8;
    mp.aqlm_lut8 = o.aqlm_lut8;
    mp.aqlm_i8 = o.aqlm_i8;
    mp.exact = o.exact;
    if (o.plan) return kvq_tool_plan(P, o.model, o.n_ctx, o.type_k, o.type_v, &mp, 1);
    double t0 = kvq_tool_now();
    kvq_model *m;
    chat_progress prog;
    chat_progress_start(&prog, o.model);
    kvq_status ls = kvq_model_load(o.model, &mp, &m);
    chat_progress_stop(&prog);
    if (ls != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    fprintf(stderr, "%s: loaded %s in %.2f s: %s\n", P, shown, kvq_tool_now() - t0, kvq_model_desc(m));
    kvq_tool_report_backend(P, m);
    o.n_ctx = kvq_tool_ctx(o.n_ctx, m);
    int train = kvq_model_n_ctx_train(m);
    if (train > 0 && o.n_ctx > train)
        fprintf(stderr, "%s: warning: -c %ld is above the model's trained context (%d); quality past it is not assured\n", P,
                o.n_ctx, train);
    uint64_t seed = o.seed < 0 ? random_seed() : (uint64_t)o.seed;
    o.sp.seed = seed;
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
    kvq_tool_report_context(P, c);
    o.n_ctx = kvq_n_ctx(c); /* -c 0: the library's default */
    kvq_sampler *s = kvq_sampler_new(&o.sp);
    chat_spec spec, *cs = NULL;
    if (o.draft || o.lookup) { /* before a --prompt-cache fills the context */
        if (chat_spec_open(&spec, &o, &mp, m, c)) {
            chat_spec_close(&spec);
            kvq_sampler_free(s);
            kvq_context_free(c);
            kvq_model_free(m);
            return 1;
        }
        cs = &spec;
    }
    chat_install_sigint();
    int rc;
    if (one) {
        rc = one_shot(c, m, s, cs, &o, (int)o.n_ctx);
    } else {
        if (o.n_predict == -2) o.n_predict = -1;
        chat_session S;
        rc = chat_session_init(&S, &o, m, c);
        if (!rc) {
            S.s = s;
            S.spec = cs;
            S.seed = seed;
            S.tty = tty;
            S.color = tty && isatty(STDOUT_FILENO) && isatty(STDERR_FILENO) && !getenv("NO_COLOR");
            rc = converse(&S, tty);
            if (cs) { /* the conversation's counterpart of one-shot's timing line */
                fprintf(stderr, "%s: generated %ld tokens in %.3f s (%.1f tok/s)", P, S.n_gen, S.t_gen, S.t_gen > 0 ? S.n_gen / S.t_gen : 0.0);
                chat_spec_print(cs, stderr, "; speculative: ");
                fputc('\n', stderr);
            }
        }
        chat_session_free(&S);
    }
    if (cs) chat_spec_close(cs);
    kvq_sampler_free(s);
    kvq_context_free(c);
    kvq_model_free(m);
    return rc;
}
