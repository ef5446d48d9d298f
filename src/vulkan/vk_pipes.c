/* Pipelines: built from the embedded SPIR-V when first asked for (at weight upload for
 * the matmuls and elementwise ops, vk_weights.c), through a VkPipelineCache
 * that is kept on disk (one file per device and driver), so a second run builds its
 * pipelines from the driver's cache instead of compiling them again. Each pipeline
 * also records which bindings its shader writes, read from the SPIR-V decorations,
 * for the barrier tracking in vk_record.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"
#include "vulkan/vk_internal.h"
#include "vulkan/vk_spirv.h"

#define PCACHE_MAX_BYTES (64u << 20) /* a larger file is not ours: ignored */

/* ---- SPIR-V: which bindings are declared, which of them are read-only ---- */

enum { OP_TYPE_POINTER = 32, OP_VARIABLE = 59, OP_DECORATE = 71, OP_MEMBER_DECORATE = 72 };
enum { DEC_NON_WRITABLE = 24, DEC_BINDING = 33 };

/* Sets p->reads / p->writes: bit i for binding i (set 0) declared read-only / writable. A
 * buffer block is read-only when the variable or every member of its block is NonWritable.
 * Anything that cannot be parsed counts as written (a barrier too many, never one too few). */
static void reflect(vk_pipe *p, const uint32_t *w, size_t n_words) {
    p->reads = 0, p->writes = (uint16_t)((1u << VK_MAX_BINDINGS) - 1);
    if (n_words < 5 || w[0] != 0x07230203u || w[3] == 0 || w[3] > (1u << 20)) return;
    uint32_t bound = w[3];
    int32_t *binding = malloc(sizeof(int32_t) * bound);
    uint32_t *pointee = calloc(bound, sizeof(uint32_t)), *var_type = calloc(bound, sizeof(uint32_t));
    uint8_t *nonwr_var = calloc(bound, 1);
    uint32_t *members = calloc(bound, 4), *nonwr_members = calloc(bound, 4); /* bit k: member k */
    if (!binding || !pointee || !var_type || !nonwr_var || !members || !nonwr_members) goto out;
    for (uint32_t i = 0; i < bound; i++) binding[i] = -1;
    for (size_t i = 5; i < n_words;) {
        uint32_t op = w[i] & 0xffffu, wc = w[i] >> 16;
        if (wc == 0 || i + wc > n_words) goto out;
        const uint32_t *a = w + i + 1;
        if (op == OP_DECORATE && wc >= 3 && a[0] < bound) {
            if (a[1] == DEC_BINDING && wc >= 4) binding[a[0]] = (int32_t)a[2];
            if (a[1] == DEC_NON_WRITABLE) nonwr_var[a[0]] = 1;
        } else if (op == OP_MEMBER_DECORATE && wc >= 4 && a[0] < bound) {
            if (a[1] >= 32) goto out; /* buffer blocks have a member or two, push constants a few more */
            members[a[0]] |= 1u << a[1];
            if (a[2] == DEC_NON_WRITABLE) nonwr_members[a[0]] |= 1u << a[1];
        } else if (op == OP_TYPE_POINTER && wc >= 4 && a[0] < bound) {
            pointee[a[0]] = a[2];
        } else if (op == OP_VARIABLE && wc >= 4 && a[1] < bound) {
            var_type[a[1]] = a[0];
        }
        i += wc;
    }
    uint16_t rd = 0, wr = 0;
    for (uint32_t v = 0; v < bound; v++) {
        if (binding[v] < 0) continue;
        if (binding[v] >= VK_MAX_BINDINGS) goto out;
        uint32_t pt = var_type[v], st = pt < bound ? pointee[pt] : 0;
        int ro = nonwr_var[v] || (st && st < bound && members[st] && nonwr_members[st] == members[st]);
        uint16_t bit = (uint16_t)(1u << binding[v]);
        if (ro) rd |= bit;
        else wr |= bit;
    }
    p->reads = (uint16_t)(rd & ~wr), p->writes = wr;
out:
    free(binding), free(pointee), free(var_type), free(nonwr_var), free(members), free(nonwr_members);
}

/* ---- lookup ---- */

static uint64_t key_hash(const char *name, const uint32_t *spec, int n_spec) {
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    for (int i = 0; i < n_spec; i++) h = (h ^ spec[i]) * 1099511628211ull;
    return h ^ (uint64_t)n_spec;
}

static int same_name(const char *key, const char *name) {
    size_t l = strlen(name);
    return !strncmp(key, name, l) && (key[l] == 0 || key[l] == ':');
}

const vk_pipe *vk_pipe_get(kvq_bctx *b, const char *name, const uint32_t *spec, int n_spec) {
    if (n_spec < 0 || n_spec > 16) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: %d spec constants for '%s'", n_spec, name);
        return NULL;
    }
    uint64_t h = key_hash(name, spec, n_spec);
    for (int i = 0; i < b->n_pipes; i++) {
        const vk_pipe *p = &b->pipes[i];
        if (p->hash == h && p->n_spec == n_spec && (!n_spec || !memcmp(p->spec, spec, sizeof(uint32_t) * (size_t)n_spec)) &&
            same_name(p->key, name))
            return p;
    }
    const kvq_vk_spirv *sp = NULL;
    for (int i = 0; i < kvq_vk_spirv_count; i++)
        if (!strcmp(kvq_vk_spirv_table[i].name, name)) sp = &kvq_vk_spirv_table[i];
    if (!sp || b->n_pipes >= VK_MAX_PIPES) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: %s '%s'", sp ? "too many pipelines for" : "no shader named", name);
        return NULL;
    }
    vk_pipe *p = &b->pipes[b->n_pipes];
    memset(p, 0, sizeof *p);
    int kl = snprintf(p->key, sizeof p->key, "%s", name);
    for (int i = 0; i < n_spec && kl < (int)sizeof p->key; i++)
        kl += snprintf(p->key + kl, sizeof p->key - (size_t)kl, ":%u", spec[i]);
    VkShaderModuleCreateInfo smi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = sp->bytes, .pCode = sp->code};
    VkShaderModule mod;
    VkResult r = vkCreateShaderModule(b->dev, &smi, NULL, &mod);
    if (r != VK_SUCCESS) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: shader %s rejected (%s)", name, vk_result_str(r));
        return NULL;
    }
    VkSpecializationMapEntry me[16];
    for (int i = 0; i < n_spec; i++) me[i] = (VkSpecializationMapEntry){(uint32_t)i, (uint32_t)(4 * i), 4};
    VkSpecializationInfo si = {.mapEntryCount = (uint32_t)n_spec, .pMapEntries = me, .dataSize = 4 * (size_t)n_spec, .pData = spec};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod, .pName = "main", .pSpecializationInfo = n_spec ? &si : NULL},
        .layout = b->layout,
    };
    r = vkCreateComputePipelines(b->dev, b->pcache, 1, &ci, NULL, &p->pipe);
    vkDestroyShaderModule(b->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: cannot build pipeline %s (%s)", p->key, vk_result_str(r));
        return NULL;
    }
    if (n_spec) memcpy(p->spec, spec, sizeof(uint32_t) * (size_t)n_spec);
    p->n_spec = n_spec;
    p->hash = h;
    reflect(p, sp->code, sp->bytes / 4);
    b->n_pipes++;
    b->pcache_new = 1;
    return p;
}

/* ---- the cache on disk ---- */

static int mkdir_p(char *path) { /* path is a directory; parents are made first */
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        int bad = mkdir(path, 0700) && errno != EEXIST;
        *s = '/';
        if (bad) return -1;
    }
    return mkdir(path, 0700) && errno != EEXIST ? -1 : 0;
}

/* The cache file's path, "" when caching is off (KVQ_VK_PIPELINE_CACHE=off or no home). */
static void cache_path(kvq_bctx *b, char *out, size_t size) {
    out[0] = 0;
    const char *env = getenv("KVQ_VK_PIPELINE_CACHE");
    if (env) {
        if (*env && strcmp(env, "off") && strcmp(env, "0")) snprintf(out, size, "%s", env);
        return;
    }
    char dir[400];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg == '/') snprintf(dir, sizeof dir, "%s/kvq", xdg);
    else if (home && *home == '/') snprintf(dir, sizeof dir, "%s/.cache/kvq", home);
    else return;
    if (mkdir_p(dir)) return;
    char uuid[33];
    for (int i = 0; i < 16; i++) snprintf(uuid + 2 * i, 3, "%02x", b->props.pipelineCacheUUID[i]);
    snprintf(out, size, "%s/vk-%04x-%04x-%s.bin", dir, b->props.vendorID, b->props.deviceID, uuid);
}

/* Reads the file when its header names this device and driver (the Vulkan cache header:
 * length, version 1, vendor, device, pipelineCacheUUID); NULL otherwise. */
static void *read_cache(kvq_bctx *b, const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *data = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size >= 32 && st.st_size <= (off_t)PCACHE_MAX_BYTES) {
        data = malloc((size_t)st.st_size);
        if (data && fread(data, 1, (size_t)st.st_size, f) == (size_t)st.st_size) {
            const uint8_t *h = data;
            uint32_t len, ver, vendor, device;
            memcpy(&len, h, 4), memcpy(&ver, h + 4, 4), memcpy(&vendor, h + 8, 4), memcpy(&device, h + 12, 4);
            if (len >= 32 && len <= (size_t)st.st_size && ver == VK_PIPELINE_CACHE_HEADER_VERSION_ONE &&
                vendor == b->props.vendorID && device == b->props.deviceID &&
                !memcmp(h + 16, b->props.pipelineCacheUUID, VK_UUID_SIZE)) {
                *n = (size_t)st.st_size;
                fclose(f);
                return data;
            }
        }
    }
    free(data);
    fclose(f);
    return NULL;
}

void vk_pipes_open(kvq_bctx *b) {
    cache_path(b, b->pcache_path, sizeof b->pcache_path);
    size_t n = 0;
    void *data = b->pcache_path[0] ? read_cache(b, b->pcache_path, &n) : NULL;
    VkPipelineCacheCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, .initialDataSize = n, .pInitialData = data};
    if (vkCreatePipelineCache(b->dev, &ci, NULL, &b->pcache) != VK_SUCCESS) {
        ci.initialDataSize = 0, ci.pInitialData = NULL; /* the driver refused the file: start empty */
        if (vkCreatePipelineCache(b->dev, &ci, NULL, &b->pcache) != VK_SUCCESS) b->pcache = VK_NULL_HANDLE;
    }
    free(data);
}

/* Written to a temporary file and renamed, so concurrent runs never see half a file. */
static void save_cache(kvq_bctx *b) {
    size_t n = 0;
    if (vkGetPipelineCacheData(b->dev, b->pcache, &n, NULL) != VK_SUCCESS || n == 0 || n > PCACHE_MAX_BYTES) return;
    void *data = malloc(n);
    if (!data) return;
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", b->pcache_path, (long)getpid());
    FILE *f = NULL;
    if (vkGetPipelineCacheData(b->dev, b->pcache, &n, data) == VK_SUCCESS && (f = fopen(tmp, "wb"))) {
        int ok = fwrite(data, 1, n, f) == n;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, b->pcache_path)) remove(tmp);
    }
    free(data);
}

void vk_pipes_close(kvq_bctx *b) {
    if (!b->dev) return;
    for (int i = 0; i < b->n_pipes; i++) vkDestroyPipeline(b->dev, b->pipes[i].pipe, NULL);
    b->n_pipes = 0;
    if (b->pcache) {
        if (b->pcache_new && b->pcache_path[0] && !b->dead) save_cache(b);
        vkDestroyPipelineCache(b->dev, b->pcache, NULL);
        b->pcache = VK_NULL_HANDLE;
    }
}
