/* Vulkan core: instance and device choice, device creation, open/close and the
 * memory budget. Memory, pipelines and recording live in vk_alloc.c, vk_pipes.c and
 * vk_record.c (see vk_internal.h). */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vulkan/vk_internal.h"
#include "vulkan/vk_spirv.h"

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
    int has_nv_sm = has_ext(ext, next, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME),
        has_amd_core = has_ext(ext, next, VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME),
        has_arm_core = has_ext(ext, next, VK_ARM_SHADER_CORE_BUILTINS_EXTENSION_NAME);
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
    c->fused_reduce = !disabled("fusedreduce");
    c->attn_dec = !disabled("attndec");

    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, .pNext = &sg};
    /* compute units, where a vendor extension tells (core Vulkan does not) */
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV nv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceShaderCorePropertiesAMD amd = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
    VkPhysicalDeviceShaderCoreBuiltinsPropertiesARM arm = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_BUILTINS_PROPERTIES_ARM};
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    void *pchain = &m3;
    if (api >= VK_API_VERSION_1_2) drv.pNext = pchain, pchain = &drv;
    if (has_nv_sm) nv.pNext = pchain, pchain = &nv;
    if (has_amd_core) amd.pNext = pchain, pchain = &amd;
    if (has_arm_core) arm.pNext = pchain, pchain = &arm;
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = pchain};
    vkGetPhysicalDeviceProperties2(b->phys, &p2);
    if (api >= VK_API_VERSION_1_2)
        snprintf(b->driver, sizeof b->driver, "%.64s %.64s", drv.driverName, drv.driverInfo);
    c->compute_units = has_nv_sm ? (int)nv.shaderSMCount
                       : has_amd_core ? (int)(amd.shaderEngineCount * amd.shaderArraysPerEngineCount * amd.computeUnitsPerShaderArray)
                       : has_arm_core ? (int)arm.shaderCoreCount : 0;
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
    vk_alloc_init(b, m3.maxMemoryAllocationSize);
    const char *lim = getenv("KVQ_VK_MEMORY_LIMIT");
    if (lim && *lim) b->dev_limit = (size_t)strtoull(lim, NULL, 10);
    b->min_align = b->props.limits.minStorageBufferOffsetAlignment;
    if (b->min_align < 16) b->min_align = 16;
    for (int i = 0; i < 3; i++) b->max_groups[i] = b->props.limits.maxComputeWorkGroupCount[i];
    return KVQ_OK;
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
    if (!s) vk_pipes_open(b);
    b->software = b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU; /* before vk_record_init: its hang limit */
    if (!s) s = vk_record_init(b);
    if (s) {
        kvq_vk_close(b);
        return s;
    }
    /* workgroups a matvec spreads over: 4 per compute unit where known */
    const char *tg = getenv("KVQ_VK_TARGET_GROUPS");
    if (tg && *tg) b->target_groups = (uint32_t)strtoul(tg, NULL, 10);
    else if (b->caps.compute_units > 0 && !b->software)
        b->target_groups = (uint32_t)(4 * b->caps.compute_units < 64 ? 64 : 4 * b->caps.compute_units > 2048 ? 2048 : 4 * b->caps.compute_units);
    *out = b;
    return KVQ_OK;
}

void kvq_vk_close(kvq_bctx *b) {
    if (!b) return;
    if (b->dev) {
        if (!b->dead) vk_finish(b);
        for (int i = 0; i < (int)(sizeof b->scratch / sizeof b->scratch[0]); i++) vk_buf_free(b, b->scratch[i]);
        vk_buf_free(b, b->readback);
        vk_buf_free(b, b->stage);
        vk_buf_free(b, b->dummy);
        int hung = vk_in_flight(b);
        vk_record_close(b);
        if (hung) { /* its commands may still run: the device and all on it stay (the process leaks them) */
            free(b);
            return;
        }
        vk_pipes_close(b);
        if (!b->dead) vkDeviceWaitIdle(b->dev); /* a hung device would never answer */
        vk_alloc_close(b);
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
        VkDeviceSize size = mp.memoryProperties.memoryHeaps[h].size, used = b->block_bytes;
        if (b->caps.mem_budget) size = mb.heapBudget[h], used = mb.heapUsage[h];
        free_bytes += size > used ? (size_t)(size - used) : 0;
    }
    if (b->dev_limit && b->dev_limit - (b->dev_bytes < b->dev_limit ? b->dev_bytes : b->dev_limit) < free_bytes)
        free_bytes = b->dev_limit - (b->dev_bytes < b->dev_limit ? b->dev_bytes : b->dev_limit);
    return free_bytes;
}
