/* -m's value as a directory (a directory that exists, else a hub name through the HF cache or
 * the hub), and the cache type names the tools accept. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "hub/hub.h"

int kvq_tool_is_model_flag(const char *a) {
    return !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-hf") || !strcmp(a, "--hf-repo");
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int kvq_tool_hub_name(const char *model) {
    kvq_hub_name n;
    return model && !is_dir(model) && kvq_hub_parse_name(model, &n);
}

int kvq_tool_model_dir(const char *prog, const char **model, int need_weights) {
    /* a few at once: the model and its draft */
    static char dirs[4][KVQ_HUB_PATH];
    static int next;
    kvq_hub_name n;
    if (!*model || is_dir(*model) || !kvq_hub_parse_name(*model, &n)) return 0;
    kvq_hub_opts o = {.prog = prog, .need_weights = need_weights};
    char *dir = dirs[next++ % 4];
    if (kvq_hub_resolve(&n, &o, dir, KVQ_HUB_PATH) != KVQ_OK) return kvq_tool_die(prog, "%s", kvq_last_error());
    *model = dir;
    return 0;
}

int kvq_tool_parse_cache_type(const char *s) {
    /* llama.cpp's spellings of the same formats (32-value blocks, one fp16 scale) */
    static const char *const alias[][2] = {{"q8_0", "q8"}, {"q4_0", "q4"}, {"fp16", "f16"}, {"fp32", "f32"}};
    for (size_t i = 0; i < sizeof alias / sizeof *alias; i++)
        if (!strcmp(s, alias[i][0])) s = alias[i][1];
    return kvq_cache_type_parse(s);
}

long kvq_tool_ctx(long n_ctx, const kvq_model *m) {
    return n_ctx == KVQ_TOOL_CTX_TRAINED ? kvq_model_n_ctx_train(m) : n_ctx;
}
