/* Per-op device time for `kvq-bench model --profile` (KVQ_VK_PROFILE=1): a timestamp
 * after every recorded command, with a barrier before every command so that each one
 * runs alone and the difference between two timestamps is its own time. Summed by
 * kind (shader name, or "copy") with the bytes its bindings hold, so the first run
 * on a GPU says where a token's time goes and at what share of bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vulkan/vk_internal.h"

#define PROF_QUERIES 4096 /* commands timed per batch; more go untimed (counted) */
#define PROF_KINDS 64

typedef struct {
    char name[32];
    uint64_t calls;
    double ms, bytes;
} prof_kind;

struct vk_prof {
    VkQueryPool pool;
    int n;                    /* timestamps written this batch (query 0 is the batch start) */
    int kind[PROF_QUERIES];   /* kind of the command that ends at query i */
    double bytes[PROF_QUERIES];
    prof_kind kinds[PROF_KINDS];
    int n_kinds;
    uint64_t untimed;
};

void vk_prof_init(kvq_bctx *b) {
    const char *env = getenv("KVQ_VK_PROFILE");
    if (!env || strcmp(env, "1") || !b->qpool) return;
    struct vk_prof *p = calloc(1, sizeof *p);
    if (!p) return;
    VkQueryPoolCreateInfo qpi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                 .queryCount = PROF_QUERIES};
    if (vkCreateQueryPool(b->dev, &qpi, NULL, &p->pool) != VK_SUCCESS) {
        free(p);
        return;
    }
    b->prof = p;
    b->barrier_all = 1;
}

void vk_prof_close(kvq_bctx *b) {
    if (!b->prof) return;
    vkDestroyQueryPool(b->dev, b->prof->pool, NULL);
    free(b->prof);
    b->prof = NULL;
}

void vk_prof_begin(kvq_bctx *b) {
    struct vk_prof *p = b->prof;
    if (!p) return;
    vkCmdResetQueryPool(b->cmd, p->pool, 0, PROF_QUERIES);
    vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, p->pool, 0);
    p->n = 1;
}

static int kind_of(struct vk_prof *p, const char *name) {
    size_t l = strcspn(name, ":"); /* the shader, without its spec constants */
    if (l >= sizeof p->kinds[0].name) l = sizeof p->kinds[0].name - 1;
    for (int i = 0; i < p->n_kinds; i++)
        if (strlen(p->kinds[i].name) == l && !strncmp(p->kinds[i].name, name, l)) return i;
    if (p->n_kinds == PROF_KINDS) return PROF_KINDS - 1;
    prof_kind *k = &p->kinds[p->n_kinds];
    memcpy(k->name, name, l);
    k->name[l] = 0;
    return p->n_kinds++;
}

void vk_prof_mark(kvq_bctx *b, const char *kind, double bytes) {
    struct vk_prof *p = b->prof;
    if (!p || !b->recording) return;
    if (p->n == 0 || p->n >= PROF_QUERIES) {
        p->untimed++;
        return;
    }
    vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->pool, (uint32_t)p->n);
    p->kind[p->n] = kind_of(p, kind);
    p->bytes[p->n] = bytes;
    p->n++;
}

void vk_prof_collect(kvq_bctx *b) {
    struct vk_prof *p = b->prof;
    if (!p || p->n < 2) {
        if (p) p->n = 0;
        return;
    }
    uint64_t *ts = malloc(sizeof *ts * (size_t)p->n);
    if (ts && vkGetQueryPoolResults(b->dev, p->pool, 0, (uint32_t)p->n, sizeof *ts * (size_t)p->n, ts, sizeof *ts,
                                    VK_QUERY_RESULT_64_BIT) == VK_SUCCESS) {
        uint64_t mask = b->ts_bits >= 64 ? ~0ull : ((1ull << b->ts_bits) - 1);
        for (int i = 1; i < p->n; i++) {
            prof_kind *k = &p->kinds[p->kind[i]];
            k->calls++;
            k->ms += (double)((ts[i] - ts[i - 1]) & mask) * b->props.limits.timestampPeriod * 1e-6;
            k->bytes += p->bytes[i];
        }
    }
    free(ts);
    p->n = 0;
}

void vk_prof_report(kvq_bctx *b, char *out, size_t size) {
    struct vk_prof *p = b->prof;
    if (out && size) out[0] = 0;
    if (!p) return;
    size_t len = 0;
    for (int i = 0; out && i < p->n_kinds; i++) {
        const prof_kind *k = &p->kinds[i];
        if (!k->calls) continue;
        int w = snprintf(out + len, size - len, "op=%s calls=%llu ms=%.3f gbs=%.1f\n", k->name, (unsigned long long)k->calls,
                         k->ms, k->ms > 0 ? k->bytes / (k->ms * 1e-3) / 1e9 : 0.0);
        if (w < 0 || (size_t)w >= size - len) break;
        len += (size_t)w;
    }
    if (out && p->untimed && len < size)
        snprintf(out + len, size - len, "op=untimed calls=%llu\n", (unsigned long long)p->untimed);
    memset(p->kinds, 0, sizeof p->kinds);
    p->n_kinds = 0;
    p->untimed = 0;
}
