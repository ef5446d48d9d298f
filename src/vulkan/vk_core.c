/* Vulkan core: instance and device choice, buffers, the staging ring, pipelines
 * and the recording/submit cycle that every op file uses (see vk_internal.h). */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vulkan/vk_internal.h"
#include "vulkan/vk_spirv.h"

#define STAGE_BYTES (8u << 20)  /* initial staging ring; grows for larger writes */
#define DSETS_PER_POOL 1024     /* descriptor sets between forced submits */
#define FENCE_TIMEOUT_NS (600ull * 1000 * 1000 * 1000)

static const char *vk_result_str(VkResult r) {
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case VK_ERROR_INITIALIZATION_FAILED: return "initialization failed";
    case VK_ERROR_DEVICE_LOST: return "device lost";
    case VK_ERROR_MEMORY_MAP_FAILED: return "memory map failed";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "incompatible driver";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "feature not present";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "extension not present";
    case VK_ERROR_TOO_MANY_OBJECTS: return "too many objects";
    case VK_TIMEOUT: return "timeout";
    default: return "error";
    }
}

void vk_error(kvq_bctx *b, kvq_status s, const char *fmt, ...) {
    if (b->err) return;
    b->err = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err_msg, sizeof b->err_msg, fmt, ap);
    va_end(ap);
}

/* ---- device choice ---- */

static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
    }
}

static int has_compute_queue(VkPhysicalDevice pd, uint32_t *fam) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties qf[32];
    if (n > 32) n = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, qf);
    /* prefer a compute family without graphics (dedicated compute queue) */
    int best = -1;
    for (uint32_t i = 0; i < n; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            if (best < 0 || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) best = (int)i;
    if (best < 0) return 0;
    *fam = (uint32_t)best;
    return 1;
}

static int name_matches(const char *name, const char *want) {
    size_t nl = strlen(name), wl = strlen(want);
    for (size_t i = 0; i + wl <= nl; i++) {
        size_t j = 0;
        while (j < wl && tolower((unsigned char)name[i + j]) == tolower((unsigned char)want[j])) j++;
        if (j == wl) return 1;
    }
    return 0;
}

/* Picks the physical device: the named one (index or part of the name), else the best
 * type (discrete > integrated > virtual > CPU), software ones only when allowed. */
static kvq_status pick_device(kvq_bctx *b, const char *want, int allow_sw) {
    uint32_t n = 0;
    VkResult r = vkEnumeratePhysicalDevices(b->inst, &n, NULL);
    if (r != VK_SUCCESS || n == 0) return kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: no Vulkan device found");
    VkPhysicalDevice pds[16];
    if (n > 16) n = 16;
    vkEnumeratePhysicalDevices(b->inst, &n, pds);
    int best = -1, best_rank = -1;
    char seen[512] = "";
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        uint32_t fam;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        size_t l = strlen(seen);
        snprintf(seen + l, sizeof seen - l, "%s%u: %s", i ? ", " : "", i, p.deviceName);
        if (!has_compute_queue(pds[i], &fam)) continue;
        if (want && *want) {
            char *end;
            long idx = strtol(want, &end, 10);
            if ((*end == 0 && idx == (long)i) || (*end != 0 && name_matches(p.deviceName, want))) {
                best = (int)i;
                break;
            }
            continue;
        }
        int rank = type_rank(p.deviceType);
        if (rank == 1 && !allow_sw) continue;
        if (rank > best_rank) best = (int)i, best_rank = rank;
    }
    if (best < 0) {
        if (want && *want) return kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: no device '%s' (devices: %s)", want, seen);
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: no GPU (only software devices: %s; --backend vulkan uses them)", seen);
    }
    b->phys = pds[best];
    has_compute_queue(b->phys, &b->qfam);
    return KVQ_OK;
}

static int has_ext(const VkExtensionProperties *e, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(e[i].extensionName, name)) return 1;
    return 0;
}

/* KVQ_VK_DISABLE=fp16,int8,... clears capabilities so tests run the baseline shaders. */
static int disabled(const char *cap) {
    const char *s = getenv("KVQ_VK_DISABLE");
    if (!s) return 0;
    size_t l = strlen(cap);
    for (const char *p = s; (p = strstr(p, cap)); p += l)
        if ((p == s || p[-1] == ',') && (p[l] == 0 || p[l] == ',')) return 1;
    return !strcmp(s, "all");
}

static kvq_status create_device(kvq_bctx *b) {
    vkGetPhysicalDeviceProperties(b->phys, &b->props);
    vkGetPhysicalDeviceMemoryProperties(b->phys, &b->mem_props);
    uint32_t api = b->props.apiVersion;
    uint32_t next = 0;
    vkEnumerateDeviceExtensionProperties(b->phys, NULL, &next, NULL);
    VkExtensionProperties *ext = calloc(next ? next : 1, sizeof *ext);
    if (!ext) return kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of memory");
    vkEnumerateDeviceExtensionProperties(b->phys, NULL, &next, ext);

    VkPhysicalDeviceShaderFloat16Int8Features f16i8 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
    VkPhysicalDevice16BitStorageFeatures s16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    VkPhysicalDevice8BitStorageFeatures s8 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES};
    VkPhysicalDeviceShaderIntegerDotProductFeatures idot = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    const char *exts[6];
    uint32_t n_ext = 0;
    void *chain = NULL;
    int want_f16i8 = api >= VK_API_VERSION_1_2 || has_ext(ext, next, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
    int want_s8 = api >= VK_API_VERSION_1_2 || has_ext(ext, next, VK_KHR_8BIT_STORAGE_EXTENSION_NAME);
    int want_idot = api >= VK_API_VERSION_1_3 || has_ext(ext, next, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    s16.pNext = chain, chain = &s16;
    if (want_f16i8) f16i8.pNext = chain, chain = &f16i8;
    if (want_s8) s8.pNext = chain, chain = &s8;
    if (want_idot) idot.pNext = chain, chain = &idot;
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = chain};
    vkGetPhysicalDeviceFeatures2(b->phys, &f2);
    if (api < VK_API_VERSION_1_2 && want_f16i8) exts[n_ext++] = VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME;
    if (api < VK_API_VERSION_1_2 && want_s8) {
        exts[n_ext++] = VK_KHR_8BIT_STORAGE_EXTENSION_NAME;
        if (has_ext(ext, next, VK_KHR_STORAGE_BUFFER_STORAGE_CLASS_EXTENSION_NAME))
            exts[n_ext++] = VK_KHR_STORAGE_BUFFER_STORAGE_CLASS_EXTENSION_NAME;
    }
    if (api < VK_API_VERSION_1_3 && want_idot) exts[n_ext++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
    b->caps.mem_budget = has_ext(ext, next, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    if (b->caps.mem_budget) exts[n_ext++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    free(ext);

    vk_caps *c = &b->caps;
    c->fp16 = want_f16i8 && f16i8.shaderFloat16 && !disabled("fp16");
    c->int8 = want_f16i8 && f16i8.shaderInt8 && !disabled("int8");
    c->int16 = f2.features.shaderInt16 && !disabled("int16");
    c->storage16 = s16.storageBuffer16BitAccess && !disabled("storage16");
    c->storage8 = want_s8 && s8.storageBuffer8BitAccess && !disabled("storage8");
    c->int_dot = want_idot && idot.shaderIntegerDotProduct && !disabled("intdot");

    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, .pNext = &sg};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
    vkGetPhysicalDeviceProperties2(b->phys, &p2);
    c->subgroup_arith = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                        (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) && !disabled("subgroup");
    c->subgroup_size = c->subgroup_arith ? (int)sg.subgroupSize : 0;

    /* enable exactly what we use */
    f16i8.shaderFloat16 = (VkBool32)c->fp16;
    f16i8.shaderInt8 = (VkBool32)c->int8;
    s16.storageBuffer16BitAccess = (VkBool32)c->storage16;
    s16.uniformAndStorageBuffer16BitAccess = s16.storagePushConstant16 = s16.storageInputOutput16 = VK_FALSE;
    s8.storageBuffer8BitAccess = (VkBool32)c->storage8;
    s8.uniformAndStorageBuffer8BitAccess = s8.storagePushConstant8 = VK_FALSE;
    idot.shaderIntegerDotProduct = (VkBool32)c->int_dot;
    VkPhysicalDeviceFeatures en = {.shaderInt16 = (VkBool32)c->int16};
    VkPhysicalDeviceFeatures2 ef = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = chain, .features = en};

    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = b->qfam,
                                   .queueCount = 1, .pQueuePriorities = &prio};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &ef, .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci, .enabledExtensionCount = n_ext, .ppEnabledExtensionNames = exts};
    VkResult r = vkCreateDevice(b->phys, &dci, NULL, &b->dev);
    if (r != VK_SUCCESS) return kvq_fail(KVQ_ERR_BACKEND, "vulkan: cannot create a device on %s (%s)", b->props.deviceName, vk_result_str(r));
    vkGetDeviceQueue(b->dev, b->qfam, 0, &b->queue);

    VkDeviceSize maxb = b->props.limits.maxStorageBufferRange;
    if (m3.maxMemoryAllocationSize && m3.maxMemoryAllocationSize < maxb) maxb = m3.maxMemoryAllocationSize;
    const char *env = getenv("KVQ_VK_MAX_BUFFER");
    if (env && *env) {
        unsigned long long v = strtoull(env, NULL, 10);
        if (v >= 4096 && v < maxb) maxb = v;
    }
    b->max_buffer = maxb & ~(VkDeviceSize)255;
    const char *lim = getenv("KVQ_VK_MEMORY_LIMIT");
    if (lim && *lim) b->dev_limit = (size_t)strtoull(lim, NULL, 10);
    b->min_align = b->props.limits.minStorageBufferOffsetAlignment;
    if (b->min_align < 16) b->min_align = 16;
    for (int i = 0; i < 3; i++) b->max_groups[i] = b->props.limits.maxComputeWorkGroupCount[i];
    return KVQ_OK;
}

/* ---- memory ---- */

static int find_mem(kvq_bctx *b, uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) {
    for (uint32_t i = 0; i < b->mem_props.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = b->mem_props.memoryTypes[i].propertyFlags;
        if ((bits & (1u << i)) && (f & want) == want && !(f & avoid)) return (int)i;
    }
    return -1;
}

kvq_buf *vk_buf_new(kvq_bctx *b, size_t bytes, int host) {
    kvq_buf *x = calloc(1, sizeof *x);
    if (!x) {
        kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of host memory");
        return NULL;
    }
    size_t sz = (bytes + 15) & ~(size_t)15;
    if (sz == 0) sz = 16;
    VkResult r = VK_SUCCESS;
    if (!host && b->dev_limit && (sz > b->dev_limit || b->dev_bytes > b->dev_limit - sz)) {
        r = VK_ERROR_OUT_OF_DEVICE_MEMORY; /* as a full device would say */
        goto fail;
    }
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = sz,
                              .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                       VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    r = vkCreateBuffer(b->dev, &bci, NULL, &x->buf);
    if (r != VK_SUCCESS) goto fail;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(b->dev, x->buf, &req);
    int t;
    if (host) {
        t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                                VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0);
        if (t < 0) t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
    } else {
        /* device-local, preferring memory the host cannot see (VRAM proper on discrete GPUs) */
        t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
        if (t < 0) t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
        if (t < 0) t = find_mem(b, req.memoryTypeBits, 0, 0);
    }
    if (t < 0) {
        r = VK_ERROR_OUT_OF_DEVICE_MEMORY;
        goto fail;
    }
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = (uint32_t)t};
    r = vkAllocateMemory(b->dev, &mai, NULL, &x->mem);
    if (r != VK_SUCCESS) goto fail;
    r = vkBindBufferMemory(b->dev, x->buf, x->mem, 0);
    if (r != VK_SUCCESS) goto fail;
    if (host && (r = vkMapMemory(b->dev, x->mem, 0, VK_WHOLE_SIZE, 0, &x->map)) != VK_SUCCESS) goto fail;
    x->bytes = bytes;
    x->dev_size = host ? 0 : sz;
    b->dev_bytes += x->dev_size;
    return x;
fail:
    if (x->buf) vkDestroyBuffer(b->dev, x->buf, NULL);
    if (x->mem) vkFreeMemory(b->dev, x->mem, NULL);
    free(x);
    kvq_fail(r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? KVQ_ERR_NOMEM : KVQ_ERR_BACKEND,
             "vulkan: cannot allocate %zu bytes of %s memory (%s)", bytes, host ? "host-visible" : "device", vk_result_str(r));
    return NULL;
}

void vk_buf_free(kvq_bctx *b, kvq_buf *x) {
    if (!x) return;
    if (x->map) vkUnmapMemory(b->dev, x->mem);
    b->dev_bytes -= x->dev_size;
    vkDestroyBuffer(b->dev, x->buf, NULL);
    vkFreeMemory(b->dev, x->mem, NULL);
    free(x);
}

/* ---- recording ---- */

static void full_barrier(kvq_bctx *b) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(b->cmd, st, st, 0, 1, &mb, 0, NULL, 0, NULL);
}

static int begin(kvq_bctx *b) {
    if (b->recording) return 1;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VkResult r = vkBeginCommandBuffer(b->cmd, &bi);
    if (r != VK_SUCCESS) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: cannot begin a command buffer (%s)", vk_result_str(r));
        return 0;
    }
    if (b->qpool) {
        vkCmdResetQueryPool(b->cmd, b->qpool, 0, 2);
        vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, b->qpool, 0);
    }
    b->recording = 1;
    return 1;
}

/* Submits and waits, keeping any recorded error for the caller of vk_submit. */
static void run_pending(kvq_bctx *b) {
    if (!b->recording) return;
    b->recording = 0;
    if (b->qpool) vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, b->qpool, 1);
    VkResult r = vkEndCommandBuffer(b->cmd);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &b->cmd};
    if (r == VK_SUCCESS) r = vkQueueSubmit(b->queue, 1, &si, b->fence);
    if (r == VK_SUCCESS) r = vkWaitForFences(b->dev, 1, &b->fence, VK_TRUE, FENCE_TIMEOUT_NS);
    if (r != VK_SUCCESS) vk_error(b, KVQ_ERR_BACKEND, "vulkan: %s while running the recorded work", vk_result_str(r));
    vkResetFences(b->dev, 1, &b->fence);
    vkResetCommandBuffer(b->cmd, 0);
    vkResetDescriptorPool(b->dev, b->dpool, 0);
    b->dsets_used = 0;
    b->stage_used = 0;
    b->rope.inv_freq = NULL; /* its table lived in the staging ring */
    b->n_dispatch = 0;
    b->last_ms = -1;
    uint64_t ts[2];
    if (r == VK_SUCCESS && b->qpool &&
        vkGetQueryPoolResults(b->dev, b->qpool, 0, 2, sizeof ts, ts, sizeof ts[0], VK_QUERY_RESULT_64_BIT) == VK_SUCCESS) {
        uint64_t mask = b->ts_bits >= 64 ? ~0ull : ((1ull << b->ts_bits) - 1);
        b->last_ms = (double)((ts[1] - ts[0]) & mask) * b->props.limits.timestampPeriod * 1e-6;
    }
}

kvq_status vk_submit(kvq_bctx *b) {
    run_pending(b);
    kvq_status s = b->err;
    if (s) {
        kvq_fail(s, "%s", b->err_msg);
        b->err = KVQ_OK;
        b->err_msg[0] = 0;
    }
    return s;
}

/* Room for n bytes (aligned) in the staging ring; submits pending work or grows the ring. */
static size_t stage_alloc(kvq_bctx *b, size_t n) {
    size_t off = (b->stage_used + b->min_align - 1) & ~(size_t)(b->min_align - 1);
    if (off + n <= b->stage->bytes) {
        b->stage_used = off + n;
        return off;
    }
    run_pending(b);
    if (n > b->stage->bytes) {
        kvq_buf *bigger = vk_buf_new(b, n + STAGE_BYTES, 1);
        if (!bigger) {
            vk_error(b, KVQ_ERR_NOMEM, "%s", kvq_last_error());
            return SIZE_MAX;
        }
        vk_buf_free(b, b->stage);
        b->stage = bigger;
    }
    b->stage_used = n;
    return 0;
}

vk_bind vk_stage(kvq_bctx *b, const void *src, size_t n) {
    size_t off = stage_alloc(b, n ? n : 4);
    if (off == SIZE_MAX) return vk_whole(b->dummy);
    memcpy((char *)b->stage->map + off, src, n);
    return (vk_bind){b->stage->buf, off, n ? n : 4};
}

void vk_record_write(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n) {
    if (!n) return;
    if (off > dst->bytes || n > dst->bytes - off) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: write of %zu bytes at %zu past a %zu-byte buffer", n, off, dst->bytes);
        return;
    }
    size_t so = stage_alloc(b, n);
    if (so == SIZE_MAX || !begin(b)) return;
    memcpy((char *)b->stage->map + so, src, n);
    full_barrier(b);
    VkBufferCopy c = {.srcOffset = so, .dstOffset = off, .size = n};
    vkCmdCopyBuffer(b->cmd, b->stage->buf, dst->buf, 1, &c);
    full_barrier(b);
}

void vk_record_copy(kvq_bctx *b, const kvq_buf *src, size_t so, kvq_buf *dst, size_t dof, size_t n) {
    if (!n) return;
    if (so > src->bytes || n > src->bytes - so || dof > dst->bytes || n > dst->bytes - dof) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: copy of %zu bytes past a buffer's end", n);
        return;
    }
    if (!begin(b)) return;
    VkBufferCopy c = {.srcOffset = so, .dstOffset = dof, .size = n};
    vkCmdCopyBuffer(b->cmd, src->buf, dst->buf, 1, &c);
    full_barrier(b);
}

void vk_record_copy_regions(kvq_bctx *b, const kvq_buf *src, kvq_buf *dst, VkBufferCopy *reg, uint32_t n) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        VkBufferCopy c = reg[i];
        if (!c.size) continue;
        if (c.srcOffset > src->bytes || c.size > src->bytes - c.srcOffset || c.dstOffset > dst->bytes ||
            c.size > dst->bytes - c.dstOffset) {
            vk_error(b, KVQ_ERR_ARG, "vulkan: copy of %llu bytes past a buffer's end", (unsigned long long)c.size);
            return;
        }
        /* a region that continues the previous one on both sides joins it */
        if (m && reg[m - 1].srcOffset + reg[m - 1].size == c.srcOffset && reg[m - 1].dstOffset + reg[m - 1].size == c.dstOffset)
            reg[m - 1].size += c.size;
        else
            reg[m++] = c;
    }
    if (!m || !begin(b)) return;
    vkCmdCopyBuffer(b->cmd, src->buf, dst->buf, m, reg);
    full_barrier(b);
}

kvq_status vk_upload_now(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n) {
    /* in ring-sized pieces, each its own submit: big weights need no big staging buffer */
    for (size_t done = 0; done < n;) {
        size_t part = n - done < STAGE_BYTES ? n - done : STAGE_BYTES;
        vk_record_write(b, dst, off + done, (const char *)src + done, part);
        run_pending(b);
        if (b->err) return vk_submit(b);
        done += part;
    }
    return KVQ_OK;
}

kvq_buf *vk_scratch(kvq_bctx *b, int slot, size_t bytes) {
    if (slot < 0 || slot >= 8) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: scratch slot %d", slot);
        return NULL;
    }
    if (b->scratch[slot] && b->scratch[slot]->bytes >= bytes) return b->scratch[slot];
    run_pending(b); /* the old buffer may still be in use by recorded work */
    vk_buf_free(b, b->scratch[slot]);
    size_t sz = bytes + bytes / 4 + 4096;
    b->scratch[slot] = vk_buf_new(b, sz, 0);
    if (!b->scratch[slot]) vk_error(b, KVQ_ERR_NOMEM, "%s (scratch)", kvq_last_error());
    return b->scratch[slot];
}

/* ---- pipelines ---- */

const vk_pipe *vk_pipe_get(kvq_bctx *b, const char *name, const uint32_t *spec, int n_spec) {
    char key[64];
    int kl = snprintf(key, sizeof key, "%s", name);
    for (int i = 0; i < n_spec && kl < (int)sizeof key; i++) kl += snprintf(key + kl, sizeof key - (size_t)kl, ":%u", spec[i]);
    for (int i = 0; i < b->n_pipes; i++)
        if (!strcmp(b->pipes[i].key, key)) return &b->pipes[i];
    const kvq_vk_spirv *sp = NULL;
    for (int i = 0; i < kvq_vk_spirv_count; i++)
        if (!strcmp(kvq_vk_spirv_table[i].name, name)) sp = &kvq_vk_spirv_table[i];
    if (!sp || b->n_pipes >= VK_MAX_PIPES || n_spec > 16) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: %s '%s'", sp ? "too many pipelines for" : "no shader named", name);
        return NULL;
    }
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
    vk_pipe *p = &b->pipes[b->n_pipes];
    r = vkCreateComputePipelines(b->dev, VK_NULL_HANDLE, 1, &ci, NULL, &p->pipe);
    vkDestroyShaderModule(b->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: cannot build pipeline %s (%s)", key, vk_result_str(r));
        return NULL;
    }
    snprintf(p->key, sizeof p->key, "%s", key);
    b->n_pipes++;
    return p;
}

void vk_dispatch(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc, uint32_t pc_bytes,
                 uint32_t gx, uint32_t gy, uint32_t gz) {
    if (!p || gx == 0 || gy == 0 || gz == 0) return;
    if (gx > b->max_groups[0] || gy > b->max_groups[1] || gz > b->max_groups[2] || n_bind > VK_MAX_BINDINGS ||
        pc_bytes > VK_PC_BYTES) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: dispatch %s of %ux%ux%u groups is over the device's limits", p->key, gx, gy, gz);
        return;
    }
    if (b->dsets_used >= DSETS_PER_POOL) run_pending(b);
    if (!begin(b)) return;
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = b->dpool,
                                      .descriptorSetCount = 1, .pSetLayouts = &b->dsl};
    VkDescriptorSet ds;
    VkResult r = vkAllocateDescriptorSets(b->dev, &ai, &ds);
    if (r != VK_SUCCESS) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: cannot allocate a descriptor set (%s)", vk_result_str(r));
        return;
    }
    b->dsets_used++;
    VkDescriptorBufferInfo bi[VK_MAX_BINDINGS];
    VkWriteDescriptorSet w[VK_MAX_BINDINGS];
    for (int i = 0; i < VK_MAX_BINDINGS; i++) {
        if (i < n_bind && bind[i].buf)
            bi[i] = (VkDescriptorBufferInfo){bind[i].buf, bind[i].off, bind[i].range ? bind[i].range : VK_WHOLE_SIZE};
        else
            bi[i] = (VkDescriptorBufferInfo){b->dummy->buf, 0, VK_WHOLE_SIZE};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = ds, .dstBinding = (uint32_t)i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[i]};
    }
    vkUpdateDescriptorSets(b->dev, VK_MAX_BINDINGS, w, 0, NULL);
    vkCmdBindPipeline(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    vkCmdBindDescriptorSets(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, b->layout, 0, 1, &ds, 0, NULL);
    if (pc_bytes) vkCmdPushConstants(b->cmd, b->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pc_bytes, pc);
    vkCmdDispatch(b->cmd, gx, gy, gz);
    full_barrier(b);
    b->n_dispatch++;
}

/* ---- open / close ---- */

static kvq_status create_objects(kvq_bctx *b) {
    VkResult r;
    VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, .queueFamilyIndex = b->qfam};
    if ((r = vkCreateCommandPool(b->dev, &cpi, NULL, &b->cmd_pool))) goto fail;
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = b->cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if ((r = vkAllocateCommandBuffers(b->dev, &cai, &b->cmd))) goto fail;
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = vkCreateFence(b->dev, &fci, NULL, &b->fence))) goto fail;
    VkDescriptorSetLayoutBinding lb[VK_MAX_BINDINGS];
    for (int i = 0; i < VK_MAX_BINDINGS; i++)
        lb[i] = (VkDescriptorSetLayoutBinding){(uint32_t)i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    VkDescriptorSetLayoutCreateInfo dli = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = VK_MAX_BINDINGS, .pBindings = lb};
    if ((r = vkCreateDescriptorSetLayout(b->dev, &dli, NULL, &b->dsl))) goto fail;
    VkPushConstantRange pcr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, VK_PC_BYTES};
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                      .pSetLayouts = &b->dsl, .pushConstantRangeCount = 1, .pPushConstantRanges = &pcr};
    if ((r = vkCreatePipelineLayout(b->dev, &pli, NULL, &b->layout))) goto fail;
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, DSETS_PER_POOL * VK_MAX_BINDINGS};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = DSETS_PER_POOL,
                                      .poolSizeCount = 1, .pPoolSizes = &ps};
    if ((r = vkCreateDescriptorPool(b->dev, &dpi, NULL, &b->dpool))) goto fail;
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(b->phys, &nq, NULL);
    VkQueueFamilyProperties qf[32];
    if (nq > 32) nq = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(b->phys, &nq, qf);
    b->ts_bits = b->qfam < nq ? qf[b->qfam].timestampValidBits : 0;
    if (b->ts_bits && b->props.limits.timestampComputeAndGraphics) {
        VkQueryPoolCreateInfo qpi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 2};
        if (vkCreateQueryPool(b->dev, &qpi, NULL, &b->qpool) != VK_SUCCESS) b->qpool = VK_NULL_HANDLE;
    }
    b->last_ms = -1;
    b->dummy = vk_buf_new(b, 256, 0);
    b->stage = vk_buf_new(b, STAGE_BYTES, 1);
    if (!b->dummy || !b->stage) return KVQ_ERR_NOMEM;
    return KVQ_OK;
fail:
    return kvq_fail(KVQ_ERR_BACKEND, "vulkan: cannot set up %s (%s)", b->props.deviceName, vk_result_str(r));
}

kvq_status kvq_vk_open(const kvq_backend_opts *o, kvq_bctx **out) {
    *out = NULL;
    char why[256];
    if (kvq_vk_load_global(why, sizeof why)) return kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: %s", why);
    kvq_bctx *b = calloc(1, sizeof *b);
    if (!b) return kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of memory");
    uint32_t api = VK_API_VERSION_1_1;
    if (vkEnumerateInstanceVersion) {
        uint32_t v = 0;
        vkEnumerateInstanceVersion(&v);
        api = v >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : v >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_1;
    }
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "kvq", .pEngineName = "kvq", .apiVersion = api};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = vkCreateInstance(&ici, NULL, &b->inst);
    if (r != VK_SUCCESS) {
        free(b);
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: cannot create an instance (%s; no driver installed?)", vk_result_str(r));
    }
    kvq_vk_load_instance(b->inst);
    b->n_threads = o && o->n_threads > 0 ? o->n_threads : 1;
    const char *want = o && o->device && *o->device ? o->device : getenv("KVQ_VK_DEVICE");
    int allow_sw = (o && o->allow_software) || (want && *want);
    kvq_status s = pick_device(b, want, allow_sw);
    if (!s) s = create_device(b);
    if (!s) s = create_objects(b);
    if (s) {
        kvq_vk_close(b);
        return s;
    }
    b->software = b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    *out = b;
    return KVQ_OK;
}

void kvq_vk_close(kvq_bctx *b) {
    if (!b) return;
    if (b->dev) {
        vkDeviceWaitIdle(b->dev);
        for (int i = 0; i < b->n_pipes; i++) vkDestroyPipeline(b->dev, b->pipes[i].pipe, NULL);
        for (int i = 0; i < 8; i++) vk_buf_free(b, b->scratch[i]);
        vk_buf_free(b, b->readback);
        vk_buf_free(b, b->stage);
        vk_buf_free(b, b->dummy);
        if (b->qpool) vkDestroyQueryPool(b->dev, b->qpool, NULL);
        if (b->dpool) vkDestroyDescriptorPool(b->dev, b->dpool, NULL);
        if (b->layout) vkDestroyPipelineLayout(b->dev, b->layout, NULL);
        if (b->dsl) vkDestroyDescriptorSetLayout(b->dev, b->dsl, NULL);
        if (b->fence) vkDestroyFence(b->dev, b->fence, NULL);
        if (b->cmd_pool) vkDestroyCommandPool(b->dev, b->cmd_pool, NULL);
        vkDestroyDevice(b->dev, NULL);
    }
    if (b->inst) vkDestroyInstance(b->inst, NULL);
    free(b);
}

/* Device-local bytes this process may still allocate: over the device-local heaps, the
 * budget VK_EXT_memory_budget reports less what is in use, else the heaps' size less what kvq
 * holds; KVQ_VK_BUDGET=<bytes> replaces it (tests force a small device). */
size_t kvq_vk_mem_budget(kvq_bctx *b) {
    const char *env = getenv("KVQ_VK_BUDGET");
    if (env && *env) return (size_t)strtoull(env, NULL, 10);
    VkPhysicalDeviceMemoryBudgetPropertiesEXT mb = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
    VkPhysicalDeviceMemoryProperties2 mp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
                                            .pNext = b->caps.mem_budget ? &mb : NULL};
    vkGetPhysicalDeviceMemoryProperties2(b->phys, &mp);
    size_t free_bytes = 0;
    for (uint32_t h = 0; h < mp.memoryProperties.memoryHeapCount; h++) {
        if (!(mp.memoryProperties.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)) continue;
        VkDeviceSize size = mp.memoryProperties.memoryHeaps[h].size, used = b->dev_bytes;
        if (b->caps.mem_budget) size = mb.heapBudget[h], used = mb.heapUsage[h];
        free_bytes += size > used ? (size_t)(size - used) : 0;
    }
    if (b->dev_limit && b->dev_limit - (b->dev_bytes < b->dev_limit ? b->dev_bytes : b->dev_limit) < free_bytes)
        free_bytes = b->dev_limit - (b->dev_bytes < b->dev_limit ? b->dev_bytes : b->dev_limit);
    return free_bytes;
}
