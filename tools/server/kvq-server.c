/* kvq-server: an OpenAI-compatible HTTP server (chat and text completions,
 * streamed or not) with a chat page at /, many conversations on one model:
 * -np slots, each its own region of the (quantized) KV cache, one scheduler
 * thread batching their tokens. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

#include "common.h"
#include "server.h"

const char *SRV_PROG = "kvq-server";
static const char *P = "kvq-server";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvq-server [-m DIR] [--host ADDR] [--port N] [-np N] [-c N] [options]\n"
            "  -m, --model DIR       HF model directory (default: the bundled demo model), or ORG/NAME[:REV]\n"
            "                        (alias -hf): from the Hugging Face cache, else downloaded into it\n"
            "  --plan                print download, disk, memory at -c and -ctk/-ctv, RAM, fit and speed; exit\n"
            "  --host ADDR           address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
            "  --port N              TCP port (default 8080; 0 picks a free one). The bound address is\n"
            "                        printed on stdout: 'kvq-server: listening on http://ADDR:PORT'\n"
            "  -np, --parallel N     slots: conversations generated at once (default 4)\n"
            "  -c, --ctx-size N      context length of each slot (default: min(trained, 4096); 0: trained)\n"
            "  --queue N             requests that may wait for a slot; beyond, 503 (default 64)\n"
            "  --chunk N             prompt tokens read per step between decode steps (default 256)\n"
            "  -b, --batch-size N    tokens per forward pass (default 512)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "  -ctk, --cache-type-k T   K cache type: f32, f16, q8 (q8_0), q4 (q4_0) (default f16)\n"
            "  -ctv, --cache-type-v T   V cache type: f32, f16, q8 (q8_0), q4 (q4_0) (default f16)\n"
            "  --kv-rotate / --no-kv-rotate   Hadamard-rotate quantized K/V (default: on for q4)\n"
            "  --backend NAME        auto (default: a GPU when present, else the CPU), cpu or vulkan\n"
            "  --device N|NAME       GPU device index or part of its name (also KVQ_VK_DEVICE)\n"
            "  -ngl, --n-gpu-layers N   with a GPU backend: the last N layers on it, the rest on the CPU\n"
            "                        (0: the CPU alone; all / -1: every layer, the default; auto: what the device's\n"
            "                        free memory holds with the slots' caches)\n"
            "  --aqlm-cb8            CPU: keep 1x16 AQLM codebooks as int8 (faster decode, ~1%% weight change)\n"
            "  --aqlm-lut8           CPU with AVX-512 VBMI: 2x8 AQLM through int8 tables\n"
            "  --no-aqlm-i8          CPU: 1x16 AQLM through its fp16 codebook, exact gathers (the default without VNNI)\n"
            "  --aqlm-i8             CPU: 1x16 through int8 codewords and integer dot products, ~1%% matmul change (the\n"
            "                        default with AVX-512 VNNI or AVX-VNNI, where it decodes faster; off with --exact)\n"
            "  --exact               CPU: prompts through the exact AQLM paths too (default: int8 tiles, README)\n"
            "  --chat-template NAME  none, llama2, llama3, mistral, chatml, phi3, gemma, command-r\n"
            "                        (default: recognized from tokenizer_config.json)\n"
            "  --alias NAME          model id in /v1/models and in answers (default: the directory's name)\n"
            "  --api-key KEY         require 'Authorization: Bearer KEY' (all routes but / and /health)\n"
            "  --slot-save-path DIR  where POST /slots/{id}?action=save|restore keep slots' KV caches\n"
            "  --prefix-cache MIB    keep evicted slots' caches in DIR (up to MIB) for new requests sharing their prefix\n"
            "  --draft DIR           speculative decoding with a smaller model of the same tokenizer as drafter\n"
            "  --lookup N            speculative decoding by prompt lookup: drafts continue the context's last N tokens\n"
            "  --draft-max K         drafts per slot and step (default 8 with --draft, 6 with --lookup; at most 16)\n"
            "  --draft-min-p P       --draft stops drafting when its top probability is below P (default 0: off)\n"
            "  -h, --help            this help\n"
            "  --version             print the version\n"
            "Routes: POST /v1/chat/completions, /v1/completions, /v1/embeddings, /tokenize, /detokenize;\n"
            "        POST /slots/{id}?action=save|restore|erase (save/restore: body {\"filename\": NAME});\n"
            "        GET /v1/models, /health, /metrics, / (chat page). SIGINT/SIGTERM: exit 0.\n");
}

static int parse(int argc, char **argv, srv_opts *o) {
    o->host = "127.0.0.1";
    o->port = 8080;
    o->n_slots = 4;
    o->queue = 64;
    o->chunk = 256;
    o->ngl = -1;
    o->type_k = o->type_v = KVQ_CACHE_F16;
    o->kv_rotate = -1;
    o->aqlm_i8 = 1;
    const kvq_tool_model_flags mf = {&o->model_dir, &o->backend, &o->device, &o->n_ctx, &o->n_batch, &o->threads,
                                     &o->type_k, &o->type_v, &o->kv_rotate, &o->aqlm_cb8, &o->aqlm_lut8, &o->aqlm_i8, &o->ngl, &o->exact, &o->plan};
    for (int i = 1; i < argc; i++) {
        int mr = kvq_tool_model_flag(P, &mf, argc, argv, &i);
        if (mr < 0) return 1;
        if (mr) continue;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (FLAG_IS("-h", "--help")) { usage(stdout); return -1; }
        else if (FLAG_IS("--host", "--host")) { FLAG_VALUE(); o->host = v; }
        else if (FLAG_IS("--chat-template", "--chat-template")) { FLAG_VALUE(); o->chat_template = v; }
        else if (FLAG_IS("--alias", "-a")) { FLAG_VALUE(); o->alias = v; }
        else if (FLAG_IS("--api-key", "--api-key")) { FLAG_VALUE(); o->api_key = v; }
        else if (FLAG_IS("--port", "--port")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 0, 65535, &o->port)) goto bad; }
        else if (FLAG_IS("-np", "--parallel")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 1, 256, &o->n_slots)) goto bad; }
        else if (FLAG_IS("--slot-save-path", "--slot-save-path")) { FLAG_VALUE(); o->slot_save_path = v; }
        else if (FLAG_IS("--prefix-cache", "--prefix-cache")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 1, 1 << 24, &o->prefix_mib)) goto bad; }
        else if (FLAG_IS("--queue", "--queue")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 0, 1 << 20, &o->queue)) goto bad; }
        else if (FLAG_IS("--chunk", "--chunk")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 1, 1 << 20, &o->chunk)) goto bad; }
        else if (FLAG_IS("--draft", "-md")) { FLAG_VALUE(); o->draft_dir = v; }
        else if (FLAG_IS("--lookup", "--lookup")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 1, 64, &o->lookup_n)) goto bad; }
        else if (FLAG_IS("--draft-max", "--draft-max")) { FLAG_VALUE(); if (kvq_tool_parse_int(v, 1, 16, &o->draft_max)) goto bad; }
        else if (FLAG_IS("--draft-min-p", "--draft-min-p")) { FLAG_VALUE(); if (kvq_tool_parse_float(v, &o->draft_min_p) || o->draft_min_p < 0 || o->draft_min_p > 1) goto bad; }
        else return kvq_tool_die(P, "unknown option '%s' (see --help)", a) + 1;
        continue;
    bad:
        return kvq_tool_die(P, "bad value '%s' for %s", v, a) + 1;
    }
    if (o->chat_template && kvq_tool_check_template_name(P, o->chat_template)) return 1;
    struct stat st;
    if (o->slot_save_path && (stat(o->slot_save_path, &st) != 0 || !S_ISDIR(st.st_mode)))
        return kvq_tool_die(P, "%s: --slot-save-path is not a directory", o->slot_save_path) + 1;
    if (o->prefix_mib && !o->slot_save_path) return kvq_tool_die(P, "--prefix-cache needs --slot-save-path DIR (where its files go)") + 1;
    return 0;
}

static void model_name(const srv_opts *o, char *out, size_t size) {
    if (o->alias) {
        snprintf(out, size, "%s", o->alias);
        return;
    }
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", o->model_dir);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    const char *base = strrchr(tmp, '/');
    snprintf(out, size, "%s", base && base[1] ? base + 1 : tmp);
}

int main(int argc, char **argv) {
    if (kvq_tool_version(P, argc, argv)) return 0;
    srv_opts o = {0};
    int pr = parse(argc, argv, &o);
    if (pr) return pr < 0 ? 0 : 1;
    if (!o.model_dir && !(o.model_dir = kvq_tool_demo_model())) return kvq_tool_die(P, "no -m given and the demo model is not found");
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = o.backend;
    mp.n_gpu_layers = o.ngl;
    mp.plan_ctx = o.n_ctx > 0 ? (int)o.n_ctx : 0;
    mp.plan_type_k = (int)o.type_k, mp.plan_type_v = (int)o.type_v;
    mp.device = o.device;
    mp.n_threads = (int)o.threads;
    mp.aqlm_cb8 = o.aqlm_cb8;
    mp.aqlm_lut8 = o.aqlm_lut8;
    mp.aqlm_i8 = o.aqlm_i8;
    mp.exact = o.exact;
    if (o.plan) return kvq_tool_plan(P, o.model_dir, o.n_ctx, o.type_k, o.type_v, &mp, (int)o.n_slots);
    if (!o.alias && kvq_tool_hub_name(o.model_dir)) o.alias = o.model_dir; /* the API names it ORG/NAME, not by its commit */
    if (kvq_tool_model_dir(P, &o.model_dir, 1) || kvq_tool_model_dir(P, &o.draft_dir, 1)) return 1;

    /* SIGINT/SIGTERM are taken by sigwait below: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    double t0 = kvq_tool_now();
    kvq_model *m;
    if (kvq_model_load(o.model_dir, &mp, &m) != KVQ_OK) return kvq_tool_die(P, "%s", kvq_last_error());
    kvq_tool_report_backend(P, m);
    kvq_chat_template *tmpl = NULL;
    kvq_status st = kvq_chat_template_load(o.model_dir, o.chat_template, &tmpl);
    if (st == KVQ_ERR_UNSUPPORTED) {
        fprintf(stderr, "%s: %s; chat messages are joined as plain text\n", P, kvq_last_error());
        st = kvq_chat_template_load(o.model_dir, "none", &tmpl);
    }
    if (st != KVQ_OK) {
        kvq_model_free(m);
        return kvq_tool_die(P, "%s", kvq_last_error());
    }
    o.n_ctx = kvq_tool_ctx(o.n_ctx, m);
    if (o.n_ctx > kvq_model_n_ctx_train(m))
        fprintf(stderr, "%s: -c %ld is above the trained context (%d)\n", P, o.n_ctx, kvq_model_n_ctx_train(m));

    int rc = 1, port = 0;
    srv_server *s = NULL;
    srv_http *h = NULL;
    char name[256];
    model_name(&o, name, sizeof name);
    if (srv_sched_start(&s, &o, m) || srv_http_start(&h, s, &o, name, tmpl, &port)) goto out;
    srv_snapshot sn;
    srv_snapshot_get(s, &sn);
    fprintf(stderr, "%s: %s, %ld slots of %ld tokens, KV cache %.2f MiB (K %s, V %s), chat template %s, loaded in %.2f s\n", P,
            name, o.n_slots, (long)srv_n_ctx(s), (double)sn.kv_total / (1 << 20), kvq_cache_type_name((kvq_cache_type)o.type_k),
            kvq_cache_type_name((kvq_cache_type)o.type_v), kvq_chat_template_name(tmpl), kvq_tool_now() - t0);
    int v6 = strchr(o.host, ':') != NULL;
    printf("%s: listening on http://%s%s%s:%d\n", P, v6 ? "[" : "", o.host, v6 ? "]" : "", port);
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "%s: %s: stopping\n", P, sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_http_quiesce(h); /* no new connections */
    srv_sched_stop(s);   /* queued requests get 503, running streams end */
    srv_http_drain(h, 10); /* ... and their last bytes go out */
    rc = 0;
out:
    srv_http_stop(h); /* waits for the open connections */
    srv_sched_free(s);
    kvq_chat_template_free(tmpl);
    kvq_model_free(m);
    return rc;
}
