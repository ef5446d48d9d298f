/* Vulkan routed matmul (mixture of experts): y[r] = x[r / x_div] · w[route[r]]ᵀ.
 *
 * The route is host memory, so the grouping happens on the host at issue time: rows are
 * sorted by expert (stable), one copy gathers them into vk_scratch slot 6 as one segment
 * per expert, each expert that was named runs the ordinary matmul (vk_matmul.c: matvec
 * for a few rows, tiles for more) once over its segment into slot 7, and one copy scatters
 * the results back to their rows of y. An expert no row picked is never touched, so a
 * decode step streams only the experts it chose. Segments start at multiples of
 * b->min_align so each can be bound on its own. */
#include <stdlib.h>

#include "vulkan/vk_weights.h"

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void kvq_vk_matmul_routed(kvq_bctx *b, const kvq_wt *const *w, int n_w, const kvq_buf *x, kvq_buf *y, int n,
                          const int32_t *route, int x_div) {
    if (n <= 0) return;
    if (x_div < 1) {
        vk_error(b, KVQ_ERR_ARG, "matmul_routed: x_div %d", x_div);
        return;
    }
    for (int r = 0; r < n; r++)
        if (route[r] < 0 || route[r] >= n_w || !w[route[r]]) {
            vk_error(b, KVQ_ERR_ARG, "matmul_routed: route %d names expert %d of %d", r, (int)route[r], n_w);
            return;
        }
    const kvq_wt *w0 = w[route[0]];
    const size_t xrow = (size_t)w0->cols * sizeof(float), yrow = (size_t)w0->rows * sizeof(float);
    int *cnt = calloc((size_t)n_w, sizeof *cnt), *first = calloc((size_t)n_w, sizeof *first);
    int *order = malloc(sizeof *order * (size_t)n);
    size_t *xoff = malloc(sizeof *xoff * (size_t)n_w), *yoff = malloc(sizeof *yoff * (size_t)n_w);
    VkBufferCopy *reg = malloc(sizeof *reg * (size_t)n);
    if (!cnt || !first || !order || !xoff || !yoff || !reg) {
        vk_error(b, KVQ_ERR_NOMEM, "matmul_routed: out of host memory for %d rows", n);
        goto done;
    }
    for (int r = 0; r < n; r++) cnt[route[r]]++;
    /* segments: expert e's rows at first[e].. of order, its x rows at xoff[e], y rows at yoff[e] */
    size_t xbytes = 0, ybytes = 0;
    for (int e = 0, at = 0; e < n_w; e++) {
        first[e] = at;
        at += cnt[e];
        if (!cnt[e]) continue;
        if (w[e]->rows != w0->rows || w[e]->cols != w0->cols) {
            vk_error(b, KVQ_ERR_ARG, "matmul_routed: expert %d is %dx%d, expert %d is %dx%d", e, w[e]->rows, w[e]->cols,
                     (int)route[0], w0->rows, w0->cols);
            goto done;
        }
        xoff[e] = xbytes, yoff[e] = ybytes;
        xbytes = align_up(xbytes + (size_t)cnt[e] * xrow, b->min_align);
        ybytes = align_up(ybytes + (size_t)cnt[e] * yrow, b->min_align);
    }
    for (int e = 0; e < n_w; e++) cnt[e] = 0; /* now: rows placed so far */
    for (int r = 0; r < n; r++) order[first[route[r]] + cnt[route[r]]++] = r;

    kvq_buf *xs = vk_scratch(b, 6, xbytes), *ys = xs ? vk_scratch(b, 7, ybytes) : NULL;
    if (!xs || !ys) goto done;
    for (int i = 0; i < n; i++) {
        int r = order[i], e = route[r];
        reg[i] = (VkBufferCopy){.srcOffset = (size_t)(r / x_div) * xrow,
                                .dstOffset = xoff[e] + (size_t)(i - first[e]) * xrow, .size = xrow};
    }
    vk_record_copy_regions(b, x, xs, reg, (uint32_t)n);
    for (int e = 0; e < n_w; e++)
        if (cnt[e])
            kvq_vk_matmul_at(b, w[e], (vk_bind){xs->buf, xoff[e], VK_WHOLE_SIZE, xs->bytes - xoff[e]},
                             (vk_bind){ys->buf, yoff[e], VK_WHOLE_SIZE, ys->bytes - yoff[e]},
                             cnt[e]);
    for (int i = 0; i < n; i++) {
        int r = order[i], e = route[r];
        reg[i] = (VkBufferCopy){.srcOffset = yoff[e] + (size_t)(i - first[e]) * yrow,
                                .dstOffset = (size_t)r * yrow, .size = yrow};
    }
    vk_record_copy_regions(b, ys, y, reg, (uint32_t)n);
done:
    free(cnt), free(first), free(order), free(xoff), free(yoff), free(reg);
}
