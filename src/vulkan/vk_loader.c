/* Loads libvulkan at run time: a machine without a Vulkan loader still runs kvq
 * on the CPU, and the Vulkan backend's init says why it cannot start. */
#include <dlfcn.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>

#include "vulkan/vk_fns.h"

kvq_vk_fns kvq_vk;

static PFN_vkGetInstanceProcAddr g_gipa;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_why[256];

static void load_once(void) {
    /* KVQ_VK_LOADER (tests) names another loader library, e.g. one that does not exist. */
    const char *name = getenv("KVQ_VK_LOADER");
    void *lib = dlopen(name && *name ? name : "libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(name && *name)) lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(g_why, sizeof g_why, "no Vulkan loader (libvulkan.so.1 not found)");
        return;
    }
    g_gipa = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
    if (!g_gipa) {
        snprintf(g_why, sizeof g_why, "the Vulkan loader has no vkGetInstanceProcAddr");
        return;
    }
    kvq_vk.CreateInstance = (PFN_vkCreateInstance)g_gipa(NULL, "vkCreateInstance");
    kvq_vk.EnumerateInstanceVersion = (PFN_vkEnumerateInstanceVersion)g_gipa(NULL, "vkEnumerateInstanceVersion");
    kvq_vk.EnumerateInstanceExtensionProperties =
        (PFN_vkEnumerateInstanceExtensionProperties)g_gipa(NULL, "vkEnumerateInstanceExtensionProperties");
    if (!kvq_vk.CreateInstance) snprintf(g_why, sizeof g_why, "the Vulkan loader has no vkCreateInstance");
}

int kvq_vk_load_global(char *why, size_t size) {
    pthread_once(&g_once, load_once);
    if (g_why[0]) {
        snprintf(why, size, "%s", g_why);
        return -1;
    }
    return 0;
}

void kvq_vk_load_instance(VkInstance inst) {
#define KVQ_VK_LOAD(n) \
    if (!kvq_vk.n) kvq_vk.n = (PFN_vk##n)g_gipa(inst, "vk" #n);
    KVQ_VK_FUNCS(KVQ_VK_LOAD)
#undef KVQ_VK_LOAD
}
