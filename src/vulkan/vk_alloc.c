/* Device memory: buffers are placed in a few large allocations (blocks) instead of one
 * vkAllocateMemory each. Drivers cap the number of allocations (4096 is common) and make
 * each one slow, and a 70B model has ~2000 tensors. Blocks start at 32 MiB and double up to
 * 1 GiB (KVQ_VK_BLOCK_MAX lowers it), so a model takes a few dozen at most; KVQ_VK_MAX_ALLOCS
 * caps the count (tests). When device-local memory is full, buffers go to host-visible
 * memory the GPU reads over the bus (slower; KVQ_VK_HOST_FALLBACK=0 turns it off), and the
 * bytes placed there are reported in the plan line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vulkan/vk_internal.h"

#define BLOCK_MIN ((size_t)32 << 20)
#define BLOCK_MAX ((size_t)1 << 30)
#define PLAN_ALIGN 256

typedef struct {
    VkDeviceSize off, size;
} vk_hole;

struct vk_block {
    vk_block *next;
    VkDeviceMemory mem;
    VkDeviceSize size, used;
    uint32_t type;
    int host;          /* host-visible memory taken because the device was full */
    vk_hole *holes;    /* free ranges, sorted by offset, never adjacent */
    int n_holes, cap_holes;
};

static int find_mem(kvq_bctx *b, uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) {
    for (uint32_t i = 0; i < b->mem_props.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = b->mem_props.memoryTypes[i].propertyFlags;
        if ((bits & (1u << i)) && (f & want) == want && !(f & avoid)) return (int)i;
    }
    return -1;
}

static size_t env_size(const char *name, size_t def) {
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    return *end == 0 ? (size_t)v : def;
}

void vk_alloc_init(kvq_bctx *b, VkDeviceSize max_alloc) {
    b->max_alloc = max_alloc ? (size_t)max_alloc : BLOCK_MAX;
    size_t cap = env_size("KVQ_VK_BLOCK_MAX", BLOCK_MAX);
    if (cap < 4096) cap = 4096;
    if (cap > b->max_alloc) cap = b->max_alloc;
    b->block_max = cap;
    b->block_next = BLOCK_MIN < cap ? BLOCK_MIN : cap;
    b->max_allocs = (int)env_size("KVQ_VK_MAX_ALLOCS", 0);
    const char *fb = getenv("KVQ_VK_HOST_FALLBACK");
    b->host_fallback = !(fb && !strcmp(fb, "0"));
}

/* ---- holes ---- */

static int hole_insert(vk_block *k, int at, vk_hole h) {
    if (k->n_holes == k->cap_holes) {
        int cap = k->cap_holes ? 2 * k->cap_holes : 8;
        vk_hole *n = realloc(k->holes, sizeof *n * (size_t)cap);
        if (!n) return -1;
        k->holes = n, k->cap_holes = cap;
    }
    memmove(k->holes + at + 1, k->holes + at, sizeof *k->holes * (size_t)(k->n_holes - at));
    k->holes[at] = h;
    k->n_holes++;
    return 0;
}

static void hole_remove(vk_block *k, int at) {
    memmove(k->holes + at, k->holes + at + 1, sizeof *k->holes * (size_t)(k->n_holes - at - 1));
    k->n_holes--;
}

/* First fit; returns the offset or UINT64_MAX. */
static VkDeviceSize block_take(vk_block *k, VkDeviceSize size, VkDeviceSize align) {
    for (int i = 0; i < k->n_holes; i++) {
        vk_hole h = k->holes[i];
        VkDeviceSize at = (h.off + align - 1) / align * align;
        if (at < h.off || at + size < at || at + size > h.off + h.size) continue;
        VkDeviceSize front = at - h.off, back = h.off + h.size - (at + size);
        if (front && back) {
            if (hole_insert(k, i + 1, (vk_hole){at + size, back})) return UINT64_MAX;
            k->holes[i].size = front;
        } else if (front) {
            k->holes[i].size = front;
        } else if (back) {
            k->holes[i] = (vk_hole){at + size, back};
        } else {
            hole_remove(k, i);
        }
        k->used += size;
        return at;
    }
    return UINT64_MAX;
}

static void block_give(vk_block *k, VkDeviceSize off, VkDeviceSize size) {
    int i = 0;
    while (i < k->n_holes && k->holes[i].off < off) i++;
    int joined = 0;
    if (i > 0 && k->holes[i - 1].off + k->holes[i - 1].size == off) { /* extends the hole before */
        k->holes[i - 1].size += size;
        joined = 1;
        if (i < k->n_holes && off + size == k->holes[i].off) {
            k->holes[i - 1].size += k->holes[i].size;
            hole_remove(k, i);
        }
    } else if (i < k->n_holes && off + size == k->holes[i].off) { /* extends the hole after */
        k->holes[i].off = off;
        k->holes[i].size += size;
        joined = 1;
    }
    if (!joined && hole_insert(k, i, (vk_hole){off, size})) {
        /* no memory for the list: the range stays taken until the block goes */
        return;
    }
    k->used -= size;
}

/* ---- blocks ---- */

static vk_block *block_new(kvq_bctx *b, VkDeviceSize size, uint32_t type, int host, VkResult *r) {
    if (b->max_allocs && b->n_allocs >= b->max_allocs) {
        *r = VK_ERROR_TOO_MANY_OBJECTS;
        return NULL;
    }
    vk_block *k = calloc(1, sizeof *k);
    if (!k || hole_insert(k, 0, (vk_hole){0, size})) {
        if (k) free(k->holes);
        free(k);
        *r = VK_ERROR_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = size, .memoryTypeIndex = type};
    *r = vkAllocateMemory(b->dev, &mai, NULL, &k->mem);
    if (*r != VK_SUCCESS) {
        free(k->holes);
        free(k);
        return NULL;
    }
    k->size = size, k->type = type, k->host = host;
    k->next = b->blocks, b->blocks = k;
    b->n_allocs++;
    if (!host) b->block_bytes += size;
    return k;
}

static void block_free(kvq_bctx *b, vk_block *k) {
    for (vk_block **p = &b->blocks; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    vkFreeMemory(b->dev, k->mem, NULL);
    b->n_allocs--;
    if (!k->host) b->block_bytes -= k->size;
    free(k->holes);
    free(k);
}

/* Places req in a block of memory type `type` (host: fallback blocks), making a new block
 * when none has room: the next size in the sequence, or exactly what is needed when that is
 * more, or when a full-size block does not fit what the device has left. */
static vk_block *place(kvq_bctx *b, const VkMemoryRequirements *req, uint32_t type, int host, VkDeviceSize *off, VkResult *r) {
    for (vk_block *k = b->blocks; k; k = k->next)
        if (k->type == type && k->host == host && k->size - k->used >= req->size &&
            (*off = block_take(k, req->size, req->alignment)) != UINT64_MAX)
            return k;
    if (req->size > b->max_alloc) {
        *r = VK_ERROR_OUT_OF_DEVICE_MEMORY;
        return NULL;
    }
    VkDeviceSize size = req->size > b->block_next ? req->size : b->block_next;
    vk_block *k = block_new(b, size, type, host, r);
    if (!k && *r == VK_ERROR_OUT_OF_DEVICE_MEMORY && size > req->size) k = block_new(b, req->size, type, host, r);
    if (!k) return NULL;
    if (size >= b->block_next) b->block_next = 2 * b->block_next < b->block_max ? 2 * b->block_next : b->block_max;
    *off = block_take(k, req->size, req->alignment);
    return k;
}

static const char *fail_reason(kvq_bctx *b, VkResult r, char *buf, size_t size) {
    if (r == VK_ERROR_TOO_MANY_OBJECTS && b->max_allocs)
        snprintf(buf, size, "KVQ_VK_MAX_ALLOCS=%d device allocations reached", b->max_allocs);
    else
        snprintf(buf, size, "%s", vk_result_str(r));
    return buf;
}

kvq_buf *vk_buf_new(kvq_bctx *b, size_t bytes, int host) {
    kvq_buf *x = calloc(1, sizeof *x);
    if (!x) {
        kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of host memory");
        return NULL;
    }
    size_t sz = (bytes + 15) & ~(size_t)15;
    if (sz == 0) sz = 16;
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = sz,
                              .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                       VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vkCreateBuffer(b->dev, &bci, NULL, &x->buf);
    if (r != VK_SUCCESS) goto fail;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(b->dev, x->buf, &req);
    if (host) { /* staging and read-back: their own allocation, mapped for good */
        int t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                                    VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0);
        if (t < 0) t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
        if (t < 0) {
            r = VK_ERROR_OUT_OF_DEVICE_MEMORY;
            goto fail;
        }
        if (b->max_allocs && b->n_allocs >= b->max_allocs) {
            r = VK_ERROR_TOO_MANY_OBJECTS;
            goto fail;
        }
        VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size,
                                    .memoryTypeIndex = (uint32_t)t};
        if ((r = vkAllocateMemory(b->dev, &mai, NULL, &x->mem)) != VK_SUCCESS) goto fail;
        b->n_allocs++;
        if ((r = vkBindBufferMemory(b->dev, x->buf, x->mem, 0)) != VK_SUCCESS) goto fail;
        if ((r = vkMapMemory(b->dev, x->mem, 0, VK_WHOLE_SIZE, 0, &x->map)) != VK_SUCCESS) goto fail;
        x->bytes = bytes;
        return x;
    }
    /* device-local, preferring memory the host cannot see (VRAM proper on discrete GPUs) */
    int t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    if (t < 0) t = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (t < 0) t = find_mem(b, req.memoryTypeBits, 0, 0);
    if (t < 0) {
        r = VK_ERROR_OUT_OF_DEVICE_MEMORY;
        goto fail;
    }
    if (b->dev_limit && (req.size > b->dev_limit || b->dev_bytes > b->dev_limit - req.size))
        r = VK_ERROR_OUT_OF_DEVICE_MEMORY; /* KVQ_VK_MEMORY_LIMIT: as a full device would say */
    else
        x->block = place(b, &req, (uint32_t)t, 0, &x->off, &r);
    if (!x->block && r == VK_ERROR_OUT_OF_DEVICE_MEMORY && b->host_fallback) {
        /* the device is full: memory the GPU reaches over the bus, preferably not device-local */
        int h = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
        if (h < 0) h = find_mem(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, 0);
        if (h >= 0 && (x->block = place(b, &req, (uint32_t)h, 1, &x->off, &r))) b->count.host_fallback_bytes += req.size;
    }
    if (!x->block) goto fail;
    x->size = req.size;
    if (!x->block->host) b->dev_bytes += x->size;
    if ((r = vkBindBufferMemory(b->dev, x->buf, x->block->mem, x->off)) != VK_SUCCESS) goto fail;
    x->bytes = bytes;
    return x;
fail:
    if (x->block) {
        if (x->block->host) b->count.host_fallback_bytes -= req.size;
        else if (x->size) b->dev_bytes -= x->size;
        block_give(x->block, x->off, req.size);
        if (!x->block->used) block_free(b, x->block);
    }
    if (x->buf) vkDestroyBuffer(b->dev, x->buf, NULL);
    if (x->mem) {
        vkFreeMemory(b->dev, x->mem, NULL);
        b->n_allocs--;
    }
    free(x);
    char why[96];
    kvq_fail(r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_TOO_MANY_OBJECTS
                 ? KVQ_ERR_NOMEM : KVQ_ERR_BACKEND,
             "vulkan: cannot allocate %zu bytes of %s memory (%s)", bytes, host ? "host-visible" : "device",
             fail_reason(b, r, why, sizeof why));
    return NULL;
}

void vk_buf_destroy(kvq_bctx *b, kvq_buf *x) {
    if (!x) return;
    if (x->map && x->mem) vkUnmapMemory(b->dev, x->mem);
    vkDestroyBuffer(b->dev, x->buf, NULL);
    if (x->mem) {
        vkFreeMemory(b->dev, x->mem, NULL);
        b->n_allocs--;
    }
    if (x->block) {
        if (x->block->host) b->count.host_fallback_bytes -= x->size;
        else b->dev_bytes -= x->size;
        block_give(x->block, x->off, x->size);
        if (!x->block->used) block_free(b, x->block);
    }
    free(x);
}

void vk_alloc_close(kvq_bctx *b) {
    while (b->blocks) block_free(b, b->blocks);
}

int vk_alloc_plan(const kvq_bctx *b, const size_t *sizes, int n) {
    size_t cap = b->block_max, next = BLOCK_MIN < cap ? BLOCK_MIN : cap, room = 0;
    int blocks = 0;
    for (int i = 0; i < n; i++) {
        size_t s = (sizes[i] + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
        if (s <= room) {
            room -= s;
            continue;
        }
        size_t size = s > next ? s : next;
        blocks++;
        room = size - s;
        if (size >= next) next = 2 * next < cap ? 2 * next : cap;
    }
    return blocks + 1; /* the staging ring has its own */
}
