/* --plan: what a model costs before any weight is fetched or loaded: download, disk, memory at
 * the chosen context and cache types (the loader's own estimate), this machine's RAM, and a
 * decode speed bound from the measured memory bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>

#include "common.h"
#include "cpu/cpu_kernels.h"
#include "hub/hub.h"
#include "hub/hub_http.h"
#include "resources.h"

/* Tensor bytes of the safetensors files of a local directory (index shards or model.safetensors). */
static int local_weights(const char *prog, const char *dir, kvq_hub_plan_info *pi) {
    kvq_hub_files w = {0};
    char p[KVQ_HUB_PATH + 300], *text;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    kvq_status s = KVQ_OK;
    if (kvq_read_file(p, &text, NULL) == KVQ_OK) {
        s = kvq_hub_index_shards(text, p, &w);
        free(text);
    } else {
        s = kvq_hub_files_add(&w, "model.safetensors", 0);
    }
    for (int i = 0; s == KVQ_OK && i < w.n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, w.names[i]);
        FILE *f = fopen(p, "rb");
        unsigned char h[8];
        struct stat st;
        if (!f || fstat(fileno(f), &st) || fread(h, 1, 8, f) != 8) s = kvq_fail(KVQ_ERR_IO, "%s: cannot read", p);
        if (f) fclose(f);
        if (s != KVQ_OK) break;
        uint64_t hl = 0;
        for (int k = 7; k >= 0; k--) hl = hl << 8 | h[k];
        if (hl > (uint64_t)st.st_size - 8) s = kvq_fail(KVQ_ERR_FORMAT, "%s: bad safetensors header length", p);
        else pi->weight_bytes += (uint64_t)st.st_size - 8 - hl, pi->cached_bytes += (uint64_t)st.st_size;
    }
    pi->n_weight_files = w.n;
    kvq_hub_files_free(&w);
    return s == KVQ_OK ? 0 : kvq_tool_die(prog, "%s", kvq_last_error());
}

static double gib(double b) { return b / (1 << 30); }

int kvq_tool_plan(const char *prog, const char *model, long n_ctx, int type_k, int type_v, const kvq_model_params *mp, int n_seq) {
    kvq_hub_plan_info pi = {0};
    int hub = kvq_tool_hub_name(model);
    if (hub) {
        kvq_hub_name n;
        kvq_hub_parse_name(model, &n);
        kvq_hub_opts o = {.prog = prog, .meta_only = 1};
        if (kvq_hub_plan(&n, &o, &pi) != KVQ_OK) return kvq_tool_die(prog, "%s", kvq_last_error());
    } else {
        snprintf(pi.snapshot, sizeof pi.snapshot, "%s", model);
        if (local_weights(prog, model, &pi)) return 1;
    }
    kvq_hparams hp;
    if (kvq_hparams_load(pi.snapshot, &hp) != KVQ_OK) {
        kvq_hparams_free(&hp);
        return kvq_tool_die(prog, "%s", kvq_last_error());
    }
    int ctx = n_ctx == KVQ_TOOL_CTX_TRAINED ? hp.n_ctx_train : n_ctx > 0 ? (int)n_ctx : (hp.n_ctx_train < 4096 ? hp.n_ctx_train : 4096);
    int batch = ctx < 512 ? ctx : 512;
    kvq_mem_need need;
    kvq_status s = kvq_mem_estimate(&hp, ctx, batch, 0, (kvq_cache_type)type_k, (kvq_cache_type)type_v, &need);
    char scheme[64] = "unquantized";
    if (hp.aqlm) snprintf(scheme, sizeof scheme, "AQLM %dx%d, groups of %d", hp.aqlm_codebooks, hp.aqlm_nbits, hp.aqlm_in_group);
    printf("model: %s (%s, %d layers, %s), trained context %d\n", model, hp.arch, hp.n_layer, scheme, hp.n_ctx_train);
    kvq_hparams_free(&hp);
    if (s != KVQ_OK) return kvq_tool_die(prog, "%s", kvq_last_error());

    char a[32], b[32], d[32];
    char where[KVQ_HUB_PATH];
    if (hub) kvq_hub_cache_root(where, sizeof where);
    else snprintf(where, sizeof where, "%s", model);
    int64_t disk = kvq_hub_disk_free(where);
    int disk_ok = disk < 0 || (uint64_t)disk >= pi.download_bytes;
    if (!hub)
        printf("download: none (a local directory: %s in %d weight file%s)\n", kvq_hub_bytes((double)pi.cached_bytes, b, sizeof b),
               pi.n_weight_files, pi.n_weight_files == 1 ? "" : "s");
    else
        printf("download: %s in %d weight file%s (%s already here); disk free %s in %s: %s\n", kvq_hub_bytes((double)pi.download_bytes, a, sizeof a),
           pi.n_weight_files, pi.n_weight_files == 1 ? "" : "s", kvq_hub_bytes((double)pi.cached_bytes, b, sizeof b),
           disk < 0 ? "unknown" : kvq_hub_bytes((double)disk, d, sizeof d), where, disk_ok ? "fits" : "does NOT fit");

    if (n_seq < 1) n_seq = 1;
    double per = (double)need.total * n_seq, total = (double)pi.weight_bytes + per;
    char slots[48] = "";
    if (n_seq > 1) snprintf(slots, sizeof slots, " x %d slots", n_seq);
    printf("memory at -c %d%s, -ctk %s, -ctv %s: %.2f GiB (weights %.2f GiB, KV cache %.2f GiB, buffers %.2f GiB)\n", ctx, slots,
           kvq_cache_type_name((kvq_cache_type)type_k), kvq_cache_type_name((kvq_cache_type)type_v), gib(total), gib((double)pi.weight_bytes),
           gib((double)need.kv * n_seq), gib((double)(need.act + need.logits) * n_seq));
    struct sysinfo si;
    double ram = sysinfo(&si) == 0 ? (double)si.totalram * si.mem_unit : 0;
    size_t avail = kvq_mem_available();
    double av = avail == SIZE_MAX ? ram : (double)avail;
    printf("RAM: %.2f GiB, %.2f GiB available: %s on the CPU\n", gib(ram), gib(av), total <= av ? "fits" : "does NOT fit");

    /* where the loader would put the weights (the GPU's layers with -ngl, its memory), from the
     * checkpoint's headers: known once the weights are local */
    if (pi.download_bytes == 0) {
        kvq_model_params p = *mp;
        p.plan_ctx = ctx, p.plan_type_k = type_k, p.plan_type_v = type_v;
        char line[512];
        if (kvq_model_plan_only(pi.snapshot, &p, line, sizeof line) == KVQ_OK)
            printf("placement: %s\n", strncmp(line, "plan: ", 6) ? line : line + 6);
        else
            printf("placement: unknown (%s)\n", kvq_last_error());
    } else {
        printf("placement: GPU layers and device memory are planned once the weights are in the cache\n");
    }
    /* decode streams every weight once per token: bandwidth / weight bytes bounds tokens per second */
    double bw = kvq_cpu_read_bw_gbs((size_t)256 << 20, mp->n_threads > 0 ? mp->n_threads : get_nprocs(), 3);
    if (bw > 0 && pi.weight_bytes > 0)
        printf("speed: memory bandwidth %.1f GB/s; decode at most ~%.1f tok/s (weights read once per token; AQLM decode is "
               "often bound by codebook lookups instead)\n",
               bw, bw * 1e9 / ((double)pi.weight_bytes + (double)need.kv));
    return 0;
}
