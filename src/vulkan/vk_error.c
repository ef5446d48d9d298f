/* The backend's error state: the first error of an op is kept (sticky until the next
 * submit reports it), and Vulkan result codes in words. Below every other vk_*.c file. */
#include <stdarg.h>
#include <stdio.h>

#include "vulkan/vk_internal.h"

const char *vk_result_str(VkResult r) {
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
