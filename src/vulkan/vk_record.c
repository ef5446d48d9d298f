/* Recording and submitting (see vk_internal.h for the model):
 * - barriers from tracked buffer ranges: a command waits only for the earlier commands
 *   whose writes it reads, or whose reads or writes it overwrites;
 * - descriptor sets cached by their bindings, so a token's dispatches reuse the sets of the
 *   token before instead of allocating and writing one each;
 * - submits pieces without waiting (VK_SLOTS command buffers in flight), so the GPU works while
 *   the host records: the first after VK_PIECE_FIRST dispatches so the GPU starts early, each
 *   next one twice as long up to VK_PIECE_MAX, so a token's pieces fit the slots and the host
 *   waits once per token, not for a free slot; a wait covers everything submitted;
 * - a lost device, or a piece the GPU does not finish within the hang limit (see wait_slot), is
 *   sticky: nothing pending is reset or submitted again, every later call fails with the same
 *   message, and what a hung GPU may still run is never destroyed (vk_in_flight). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "vulkan/vk_internal.h"

#define STAGE_BYTES (8u << 20)  /* initial staging ring; grows for larger writes */
#define VK_PIECE_FIRST 16       /* dispatches in a batch's first piece; doubling up to VK_PIECE_MAX */
#define VK_PIECE_MAX 512
#define VK_PIECE_TILES 1024     /* mm_tile workgroups in a piece (prompts): see wait_slot */
#define HANG_MS_GPU 10000       /* a piece that has not finished after this is a hung GPU */
#define HANG_MS_SOFTWARE 300000 /* lavapipe: a CPU runs the pieces, a prompt's tiles take seconds each */
#define DSET_SLOTS 8192         /* descriptor cache table (power of two) */
#define DSET_MAX 6144           /* sets before the pool is reset (at the next idle point) */

#define VK_DEFER 4 /* deferred dispatches held at once */

struct vk_dset {
    uint64_t h;
    VkDescriptorSet ds;
    VkDescriptorBufferInfo bi[VK_MAX_BINDINGS];
};

static void die(kvq_bctx *b, VkResult r, const char *what) {
    if (b->dead) return;
    b->dead = KVQ_ERR_BACKEND;
    if (r == VK_TIMEOUT)
        snprintf(b->dead_msg, sizeof b->dead_msg, "vulkan: the GPU did not finish %s within %.3g s (hung?); the device is "
                 "unusable until the model is loaded again", what, (double)b->hang_ms / 1000);
    else
        snprintf(b->dead_msg, sizeof b->dead_msg, "vulkan: %s while %s; the device is unusable until the model is loaded "
                 "again", vk_result_str(r), what);
    vk_error(b, b->dead, "%s", b->dead_msg);
}

int vk_busy(const kvq_bctx *b) {
    if (b->recording) return 1;
    for (int i = 0; i < VK_SLOTS; i++)
        if (b->slots[i].pending) return 1;
    return 0;
}

/* ---- barriers ---- */

static void emit_barrier(kvq_bctx *b, VkAccessFlags dst, VkPipelineStageFlags dst_stage) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, .dstAccessMask = dst};
    VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(b->cmd, st, dst_stage, 0, 1, &mb, 0, NULL, 0, NULL);
    b->count.barriers++;
}

static int overlaps(const vk_range *set, int n, const vk_range *r) {
    for (int i = 0; i < n; i++)
        if (set[i].buf == r->buf && set[i].lo < r->hi && r->lo < set[i].hi) return 1;
    return 0;
}

/* Before a command that reads rd[] and writes wr[] (b is recording). */
static void order(kvq_bctx *b, const vk_range *rd, int nr, const vk_range *wr, int nw) {
    int need = b->pend_full || (b->barrier_all && (b->n_pend_r || b->n_pend_w));
    for (int i = 0; i < nr && !need; i++) need = overlaps(b->pend_w, b->n_pend_w, &rd[i]);
    for (int i = 0; i < nw && !need; i++)
        need = overlaps(b->pend_w, b->n_pend_w, &wr[i]) || overlaps(b->pend_r, b->n_pend_r, &wr[i]);
    if (need) {
        emit_barrier(b, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                            VK_ACCESS_TRANSFER_WRITE_BIT,
                     VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT);
        b->n_pend_r = b->n_pend_w = b->pend_full = 0;
    }
    for (int i = 0; i < nr; i++) {
        if (b->n_pend_r < VK_TRACK) b->pend_r[b->n_pend_r++] = rd[i];
        else b->pend_full = 1;
    }
    for (int i = 0; i < nw; i++) {
        if (b->n_pend_w < VK_TRACK) b->pend_w[b->n_pend_w++] = wr[i];
        else b->pend_full = 1;
    }
}

static vk_range range_of(VkBuffer buf, VkDeviceSize off, VkDeviceSize n) {
    return (vk_range){buf, off, n == VK_WHOLE_SIZE ? UINT64_MAX : off + n};
}

/* ---- command buffers, submits and waits ---- */

static void reset_slot(kvq_bctx *b, vk_slot *s) {
    vkResetFences(b->dev, 1, &s->fence);
    vkResetCommandBuffer(s->cmd, 0);
    s->pending = 0;
}

/* Waits for one submitted piece; a timeout or a lost device is sticky.
 * The hang rule: the GPU runs pieces in order and the host waits for them oldest first, so the
 * clock of a wait starts no earlier than the piece before finished: a wait that runs out measures
 * one piece alone. Pieces are bounded (VK_PIECE_MAX dispatches of at most one batch each, at most
 * VK_PIECE_TILES prompt tiles: ~0.25 TFLOP at a 28672-wide K, well under a second on any working
 * GPU), so a piece that takes b->hang_ms (10 s; 300 s on a software device; KVQ_VK_HANG_MS) is a
 * hang, while a long prompt is many pieces that each finish in time. One dispatch is not cut, so
 * a single attention over a huge context is the case the bound does not cover. */
static int wait_slot(kvq_bctx *b, vk_slot *s) {
    if (!s->pending) return 1;
    if (b->dead) return 0;
    VkResult r = vkWaitForFences(b->dev, 1, &s->fence, VK_TRUE, (uint64_t)b->hang_ms * 1000000ull);
    if (r == VK_SUCCESS && b->fail_after >= 0 && b->fail_after-- == 0) r = VK_ERROR_DEVICE_LOST;
    if (r != VK_SUCCESS) {
        die(b, r, "running the recorded work");
        return 0; /* the fence and command buffer stay as they are: they may still be in use */
    }
    reset_slot(b, s);
    return 1;
}

static int begin(kvq_bctx *b) {
    if (b->recording) return 1;
    if (b->dead) {
        vk_error(b, b->dead, "%s", b->dead_msg);
        return 0;
    }
    vk_slot *s = &b->slots[b->cur];
    if (s->pending) b->count.waits++; /* every slot in flight: the host waits for the oldest */
    if (!wait_slot(b, s)) return 0;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VkResult r = vkBeginCommandBuffer(s->cmd, &bi);
    if (r != VK_SUCCESS) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: cannot begin a command buffer (%s)", vk_result_str(r));
        return 0;
    }
    b->cmd = s->cmd;
    b->recording = 1;
    if (b->qpool && !b->timing) {
        vkCmdResetQueryPool(b->cmd, b->qpool, 0, 2);
        vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, b->qpool, 0);
        vk_prof_begin(b);
        b->timing = 1;
    }
    b->piece = b->piece_tiles = 0;
    return 1;
}

/* Ends and submits the command buffer being recorded, without waiting. */
static void submit_piece(kvq_bctx *b) {
    if (!b->recording) return;
    b->recording = 0;
    vk_slot *s = &b->slots[b->cur];
    VkResult r = vkEndCommandBuffer(s->cmd);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &s->cmd};
    if (r == VK_SUCCESS) r = vkQueueSubmit(b->queue, 1, &si, s->fence);
    if (r != VK_SUCCESS) {
        if (r == VK_ERROR_DEVICE_LOST) die(b, r, "submitting work");
        else vk_error(b, KVQ_ERR_BACKEND, "vulkan: %s while submitting the recorded work", vk_result_str(r));
        if (r != VK_ERROR_DEVICE_LOST) vkResetCommandBuffer(s->cmd, 0); /* never submitted: free to reuse */
        return;
    }
    s->pending = 1;
    b->count.submits++;
    b->batch_pieces++;
    b->cur = (b->cur + 1) % VK_SLOTS;
}

void vk_finish(kvq_bctx *b) {
    if (b->n_defer && !b->dead) vk_flush_deferred(b);
    if (b->dead || !vk_busy(b)) {
        b->n_defer = 0;
        if (b->dead && b->recording) { /* recorded after the loss: never submitted */
            b->recording = 0;
            vkResetCommandBuffer(b->cmd, 0);
        }
        return;
    }
    /* the last piece makes the transfers' and shaders' writes visible to the host, and times the batch */
    if (begin(b)) {
        emit_barrier(b, VK_ACCESS_HOST_READ_BIT, VK_PIPELINE_STAGE_HOST_BIT);
        if (b->qpool && b->timing) vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, b->qpool, 1);
        submit_piece(b);
    }
    b->count.waits++;
    for (int k = 0; k < VK_SLOTS; k++) /* oldest first */
        if (!wait_slot(b, &b->slots[(b->cur + k) % VK_SLOTS])) break;
    if (b->dead) return;
    b->last_ms = -1;
    uint64_t ts[2];
    if (b->qpool && b->timing &&
        vkGetQueryPoolResults(b->dev, b->qpool, 0, 2, sizeof ts, ts, sizeof ts[0], VK_QUERY_RESULT_64_BIT) == VK_SUCCESS) {
        uint64_t mask = b->ts_bits >= 64 ? ~0ull : ((1ull << b->ts_bits) - 1);
        b->last_ms = (double)((ts[1] - ts[0]) & mask) * b->props.limits.timestampPeriod * 1e-6;
    }
    vk_prof_collect(b);
    b->timing = 0;
    b->stage_used = 0;
    b->rope.inv_freq = NULL; /* its table lived in the staging ring */
    b->n_pend_r = b->n_pend_w = b->pend_full = 0;
    /* everything finished: the split matvecs' partial sums are consumed and their counters back to
     * zero (each last workgroup clears its own), so the rings start over and the next forward binds
     * the same offsets as this one, reusing its descriptor sets instead of writing new ones */
    b->part_off = b->cnt_off = 0;
    b->batch_pieces = 0;
    if (b->n_dsets >= DSET_MAX) vk_dsets_clear(b);
}

kvq_status vk_submit(kvq_bctx *b) {
    vk_finish(b);
    if (b->dead && !b->err) vk_error(b, b->dead, "%s", b->dead_msg);
    kvq_status s = b->err;
    if (s) {
        kvq_fail(s, "%s", b->err_msg);
        b->err = KVQ_OK;
        b->err_msg[0] = 0;
    }
    return s;
}

/* ---- descriptor sets ---- */

void vk_dsets_clear(kvq_bctx *b) {
    if (!b->n_dsets) return;
    vkResetDescriptorPool(b->dev, b->dpool, 0);
    memset(b->dsets, 0, sizeof *b->dsets * DSET_SLOTS);
    b->n_dsets = 0;
}

static VkDescriptorSet dset_for(kvq_bctx *b, const VkDescriptorBufferInfo *bi) {
    uint64_t h = 1469598103934665603ull;
    const uint8_t *p = (const uint8_t *)bi;
    for (size_t i = 0; i < sizeof(VkDescriptorBufferInfo) * VK_MAX_BINDINGS; i++) h = (h ^ p[i]) * 1099511628211ull;
    size_t at = (size_t)h & (DSET_SLOTS - 1);
    for (; b->dsets[at].ds; at = (at + 1) & (DSET_SLOTS - 1))
        if (b->dsets[at].h == h && !memcmp(b->dsets[at].bi, bi, sizeof b->dsets[at].bi)) return b->dsets[at].ds;
    if (b->n_dsets >= DSET_MAX) { /* full: the sets may be in use until everything finishes */
        size_t used = b->stage_used; /* this dispatch's staged data stays where it is */
        vk_finish(b);
        b->stage_used = used;
        if (b->dead || !begin(b)) return VK_NULL_HANDLE;
        vk_dsets_clear(b);
        at = (size_t)h & (DSET_SLOTS - 1);
    }
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = b->dpool,
                                      .descriptorSetCount = 1, .pSetLayouts = &b->dsl};
    VkDescriptorSet ds;
    VkResult r = vkAllocateDescriptorSets(b->dev, &ai, &ds);
    if (r != VK_SUCCESS) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: cannot allocate a descriptor set (%s)", vk_result_str(r));
        return VK_NULL_HANDLE;
    }
    VkWriteDescriptorSet w[VK_MAX_BINDINGS];
    for (int i = 0; i < VK_MAX_BINDINGS; i++)
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = ds, .dstBinding = (uint32_t)i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[i]};
    vkUpdateDescriptorSets(b->dev, VK_MAX_BINDINGS, w, 0, NULL);
    vk_dset *e = &b->dsets[at];
    e->h = h, e->ds = ds;
    memcpy(e->bi, bi, sizeof e->bi);
    b->n_dsets++;
    b->count.dset_allocs++;
    return ds;
}

/* ---- staging and copies ---- */

/* Room for n bytes (aligned) in the staging ring; waits for pending work or grows the ring. */
static size_t stage_alloc(kvq_bctx *b, size_t n) {
    size_t off = (b->stage_used + b->min_align - 1) & ~(size_t)(b->min_align - 1);
    if (off + n <= b->stage->bytes) {
        b->stage_used = off + n;
        return off;
    }
    vk_finish(b);
    if (b->dead) {
        vk_error(b, b->dead, "%s", b->dead_msg);
        return SIZE_MAX;
    }
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
    return (vk_bind){b->stage->buf, off, n ? n : 4, n ? n : 4};
}

static void copy_cmd(kvq_bctx *b, VkBuffer src, VkBuffer dst, const VkBufferCopy *reg, uint32_t n) {
    if (b->n_defer) { /* commands keep their order past a copy */
        vk_flush_deferred(b);
        if (!b->recording && !begin(b)) return;
    }
    vk_range rd[16] = {{0}}, wr[16] = {{0}};
    uint32_t k = n < 16 ? n : 16;
    for (uint32_t i = 0; i < k; i++) {
        rd[i] = range_of(src, reg[i].srcOffset, reg[i].size);
        wr[i] = range_of(dst, reg[i].dstOffset, reg[i].size);
    }
    if (n > 16) { /* many regions: the span they cover */
        rd[0] = range_of(src, 0, VK_WHOLE_SIZE), wr[0] = range_of(dst, 0, VK_WHOLE_SIZE), k = 1;
    }
    order(b, rd, (int)k, wr, (int)k);
    vkCmdCopyBuffer(b->cmd, src, dst, n, reg);
    if (b->prof) {
        double bytes = 0;
        for (uint32_t i = 0; i < n; i++) bytes += 2.0 * (double)reg[i].size;
        vk_prof_mark(b, "copy", bytes);
    }
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
    VkBufferCopy c = {.srcOffset = so, .dstOffset = off, .size = n};
    copy_cmd(b, b->stage->buf, dst->buf, &c, 1);
}

void vk_record_fill(kvq_bctx *b, kvq_buf *dst, size_t off, size_t n, uint32_t v) {
    if (!n) return;
    if (off > dst->bytes || n > dst->bytes - off || (n & 3) || (off & 3)) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: fill of %zu bytes at %zu in a %zu-byte buffer", n, off, dst->bytes);
        return;
    }
    vk_flush_deferred(b);
    if (!begin(b)) return;
    vk_range wr = range_of(dst->buf, off, n);
    order(b, NULL, 0, &wr, 1);
    vkCmdFillBuffer(b->cmd, dst->buf, off, n, v);
}

void vk_record_copy(kvq_bctx *b, const kvq_buf *src, size_t so, kvq_buf *dst, size_t dof, size_t n) {
    if (!n) return;
    if (so > src->bytes || n > src->bytes - so || dof > dst->bytes || n > dst->bytes - dof) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: copy of %zu bytes past a buffer's end", n);
        return;
    }
    if (!begin(b)) return;
    VkBufferCopy c = {.srcOffset = so, .dstOffset = dof, .size = n};
    copy_cmd(b, src->buf, dst->buf, &c, 1);
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
    copy_cmd(b, src->buf, dst->buf, reg, m);
}

kvq_status vk_upload_now(kvq_bctx *b, kvq_buf *dst, size_t off, const void *src, size_t n) {
    /* in ring-sized pieces, each waited for: big weights need no big staging buffer */
    for (size_t done = 0; done < n;) {
        size_t part = n - done < STAGE_BYTES ? n - done : STAGE_BYTES;
        vk_record_write(b, dst, off + done, (const char *)src + done, part);
        vk_finish(b);
        if (b->err) return vk_submit(b);
        done += part;
    }
    return KVQ_OK;
}

/* ---- dispatch ---- */

static void record_dispatch(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc,
                            uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (!p || gx == 0 || gy == 0 || gz == 0) return;
    if (gx > b->max_groups[0] || gy > b->max_groups[1] || gz > b->max_groups[2] || n_bind > VK_MAX_BINDINGS ||
        pc_bytes > VK_PC_BYTES) {
        vk_error(b, KVQ_ERR_BACKEND, "vulkan: dispatch %s of %ux%ux%u groups is over the device's limits", p->key, gx, gy, gz);
        return;
    }
    if (!begin(b)) return;
    VkDescriptorBufferInfo bi[VK_MAX_BINDINGS];
    vk_range rd[VK_MAX_BINDINGS], wr[VK_MAX_BINDINGS];
    int nr = 0, nw = 0;
    for (int i = 0; i < VK_MAX_BINDINGS; i++) {
        if (i < n_bind && bind[i].buf)
            bi[i] = (VkDescriptorBufferInfo){bind[i].buf, bind[i].off, bind[i].range ? bind[i].range : VK_WHOLE_SIZE};
        else
            bi[i] = (VkDescriptorBufferInfo){b->dummy->buf, 0, VK_WHOLE_SIZE};
        vk_range r = range_of(bi[i].buffer, bi[i].offset, bi[i].range);
        if (bi[i].buffer == b->dummy->buf) continue; /* what is bound for nothing orders nothing */
        if (p->writes & (1u << i)) wr[nw++] = r;
        else if (p->reads & (1u << i)) rd[nr++] = r;
    }
    VkDescriptorSet ds = dset_for(b, bi);
    if (!ds || !b->recording) return;
    order(b, rd, nr, wr, nw);
    vkCmdBindPipeline(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    vkCmdBindDescriptorSets(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, b->layout, 0, 1, &ds, 0, NULL);
    if (pc_bytes) vkCmdPushConstants(b->cmd, b->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pc_bytes, pc);
    vkCmdDispatch(b->cmd, gx, gy, gz);
    b->count.dispatches++;
    if (b->prof) { /* the bytes its bindings hold: what it reads and writes at most */
        double bytes = 0;
        for (int i = 0; i < n_bind; i++)
            if ((p->reads | p->writes) & (1u << i))
                bytes += (double)(bind[i].range != VK_WHOLE_SIZE && bind[i].range ? bind[i].range : bind[i].bytes);
        vk_prof_mark(b, p->key, bytes);
    }
    if (!strncmp(p->key, "mm_tile", 7)) b->piece_tiles += (uint64_t)gx * gy * gz;
    int bp = b->batch_pieces < 5 ? b->batch_pieces : 5;
    if (++b->piece >= (VK_PIECE_FIRST << bp < VK_PIECE_MAX ? VK_PIECE_FIRST << bp : VK_PIECE_MAX) ||
        b->piece_tiles >= VK_PIECE_TILES)
        submit_piece(b);
}

/* Deferred dispatches (a matvec's reduce) run before any other command, except the
 * dispatches recorded with vk_dispatch_beside that touch nothing they touch. */
struct vk_deferred {
    const vk_pipe *p;
    vk_bind bind[VK_MAX_BINDINGS];
    int n_bind;
    uint8_t pc[VK_PC_BYTES];
    uint32_t pc_bytes, g[3];
};

void vk_flush_deferred(kvq_bctx *b) {
    int n = b->n_defer;
    b->n_defer = 0; /* a dispatch below may wait (descriptor pool full), which flushes again */
    for (int i = 0; i < n; i++) {
        const vk_deferred *d = &b->defer[i];
        record_dispatch(b, d->p, d->bind, d->n_bind, d->pc, d->pc_bytes, d->g[0], d->g[1], d->g[2]);
    }
}

void vk_dispatch(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc, uint32_t pc_bytes,
                 uint32_t gx, uint32_t gy, uint32_t gz) {
    vk_flush_deferred(b);
    record_dispatch(b, p, bind, n_bind, pc, pc_bytes, gx, gy, gz);
}

void vk_dispatch_later(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc,
                       uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (!p || n_bind > VK_MAX_BINDINGS || pc_bytes > VK_PC_BYTES) {
        vk_dispatch(b, p, bind, n_bind, pc, pc_bytes, gx, gy, gz); /* reports what is wrong */
        return;
    }
    if (b->n_defer == VK_DEFER) vk_flush_deferred(b);
    vk_deferred *d = &b->defer[b->n_defer++];
    d->p = p, d->n_bind = n_bind, d->pc_bytes = pc_bytes, d->g[0] = gx, d->g[1] = gy, d->g[2] = gz;
    memcpy(d->bind, bind, sizeof *bind * (size_t)n_bind);
    if (pc_bytes) memcpy(d->pc, pc, pc_bytes);
}

/* 1 when a dispatch of p over bind reads what q over qb writes or writes what it touches. */
static int conflicts(VkBuffer dummy, const vk_pipe *p, const vk_bind *bind, int n_bind, const vk_pipe *q,
                     const vk_bind *qb, int qn) {
    for (int i = 0; i < n_bind; i++) {
        int pw = p->writes >> i & 1, pr = p->reads >> i & 1;
        if ((!pw && !pr) || !bind[i].buf || bind[i].buf == dummy) continue;
        vk_range a = range_of(bind[i].buf, bind[i].off, bind[i].range ? bind[i].range : VK_WHOLE_SIZE);
        for (int j = 0; j < qn; j++) {
            int qw = q->writes >> j & 1, qr = q->reads >> j & 1;
            if (!((pw && (qw || qr)) || (pr && qw))) continue;
            vk_range c = range_of(qb[j].buf, qb[j].off, qb[j].range ? qb[j].range : VK_WHOLE_SIZE);
            if (a.buf == c.buf && a.lo < c.hi && c.lo < a.hi) return 1;
        }
    }
    return 0;
}

void vk_dispatch_beside(kvq_bctx *b, const vk_pipe *p, const vk_bind *bind, int n_bind, const void *pc,
                        uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
    for (int i = 0; p && i < b->n_defer; i++)
        if (conflicts(b->dummy->buf, p, bind, n_bind, b->defer[i].p, b->defer[i].bind, b->defer[i].n_bind)) {
            vk_flush_deferred(b);
            break;
        }
    record_dispatch(b, p, bind, n_bind, pc, pc_bytes, gx, gy, gz);
}

/* ---- set up ---- */

/* ---- freeing buffers that recorded work may use ---- */

int vk_in_flight(kvq_bctx *b) {
    if (!b->dead || !b->dev) return 0;
    for (int i = 0; i < VK_SLOTS; i++) /* a lost device runs nothing: only a fence not ready counts */
        if (b->slots[i].pending && vkGetFenceStatus(b->dev, b->slots[i].fence) == VK_NOT_READY) return 1;
    return 0;
}

void vk_buf_free(kvq_bctx *b, kvq_buf *x) {
    if (!x) return;
    if (vk_in_flight(b)) { /* a hung GPU may still use it: leave its memory be, forget the handle */
        free(x);
        return;
    }
    if (vk_busy(b)) vk_finish(b); /* recorded work may still use it; its error stays for the next submit */
    if (!b->dead) vk_dsets_clear(b); /* sets naming it must not be used again (a dead device records nothing) */
    vk_buf_destroy(b, x);
}

kvq_buf *vk_scratch(kvq_bctx *b, int slot, size_t bytes) {
    if (slot < 0 || slot >= (int)(sizeof b->scratch / sizeof b->scratch[0])) {
        vk_error(b, KVQ_ERR_ARG, "vulkan: scratch slot %d", slot);
        return NULL;
    }
    if (b->scratch[slot] && b->scratch[slot]->bytes >= bytes) return b->scratch[slot];
    vk_buf_free(b, b->scratch[slot]); /* waits for recorded work that may use it */
    size_t sz = bytes + bytes / 4 + 4096;
    b->scratch[slot] = vk_buf_new(b, sz, 0);
    if (!b->scratch[slot]) vk_error(b, KVQ_ERR_NOMEM, "%s (scratch)", kvq_last_error());
    return b->scratch[slot];
}

kvq_status vk_record_init(kvq_bctx *b) {
    VkResult r;
    VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, .queueFamilyIndex = b->qfam};
    if ((r = vkCreateCommandPool(b->dev, &cpi, NULL, &b->cmd_pool))) goto fail;
    for (int i = 0; i < VK_SLOTS; i++) {
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = b->cmd_pool,
                                           .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
        if ((r = vkAllocateCommandBuffers(b->dev, &cai, &b->slots[i].cmd))) goto fail;
        VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        if ((r = vkCreateFence(b->dev, &fci, NULL, &b->slots[i].fence))) goto fail;
    }
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
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, DSET_MAX * VK_MAX_BINDINGS};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = DSET_MAX,
                                      .poolSizeCount = 1, .pPoolSizes = &ps};
    if ((r = vkCreateDescriptorPool(b->dev, &dpi, NULL, &b->dpool))) goto fail;
    b->dsets = calloc(DSET_SLOTS, sizeof *b->dsets);
    b->defer = calloc(VK_DEFER, sizeof *b->defer);
    if (!b->dsets || !b->defer) return kvq_fail(KVQ_ERR_NOMEM, "vulkan: out of memory");
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
    const char *env = getenv("KVQ_VK_BARRIERS");
    b->barrier_all = env && !strcmp(env, "all");
    vk_prof_init(b);
    env = getenv("KVQ_VK_HANG_MS");
    b->hang_ms = env && *env && atol(env) > 0 ? atol(env) : b->software ? HANG_MS_SOFTWARE : HANG_MS_GPU;
    env = getenv("KVQ_VK_FAIL_AFTER");
    b->fail_after = env && *env ? strtol(env, NULL, 10) : -1;
    b->dummy = vk_buf_new(b, 256, 0);
    b->stage = vk_buf_new(b, STAGE_BYTES, 1);
    if (!b->dummy || !b->stage) return KVQ_ERR_NOMEM;
    return KVQ_OK;
fail:
    return kvq_fail(KVQ_ERR_BACKEND, "vulkan: cannot set up %s (%s)", b->props.deviceName, vk_result_str(r));
}

void vk_record_close(kvq_bctx *b) {
    if (!b->dev) return;
    if (!b->dead) vk_finish(b);
    if (vk_in_flight(b)) { /* the fences, command buffers and sets of a hung GPU's work stay */
        free(b->dsets), free(b->defer);
        b->dsets = NULL, b->defer = NULL;
        vk_prof_close(b);
        return;
    }
    free(b->dsets);
    b->dsets = NULL;
    free(b->defer);
    b->defer = NULL;
    b->n_defer = 0;
    vk_prof_close(b);
    if (b->qpool) vkDestroyQueryPool(b->dev, b->qpool, NULL);
    if (b->dpool) vkDestroyDescriptorPool(b->dev, b->dpool, NULL);
    if (b->layout) vkDestroyPipelineLayout(b->dev, b->layout, NULL);
    if (b->dsl) vkDestroyDescriptorSetLayout(b->dev, b->dsl, NULL);
    for (int i = 0; i < VK_SLOTS; i++)
        if (b->slots[i].fence) vkDestroyFence(b->dev, b->slots[i].fence, NULL);
    if (b->cmd_pool) vkDestroyCommandPool(b->dev, b->cmd_pool, NULL);
}
