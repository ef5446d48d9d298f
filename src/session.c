/* KV sessions on disk: a context's cache in its stored format, with the tokens that made it.
 *
 * File (little-endian):
 *   header, 64 bytes: "KVQS", version u32, model identity u64, n_layer, n_head_kv, head_dim,
 *     n_vocab (u32 each), type_k, type_v, rotate_k, rotate_v, long_rope (u8 each), 3 zero
 *     bytes, n_past u32, 4 zero bytes, payload bytes u64, 8 zero bytes;
 *   tokens: n_past int32;
 *   per layer: K rows, then V rows, each [kv head][position] rows of kvq_kv_row_bytes;
 *   checksum u64: kvq_fnv1a over the sections above, one call per section in this order.
 * A restore maps the file and checks all of it (size, checksum, model, shape, types) before
 * it writes a row, so a bad file leaves the context as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "kv_format.h"
#include "util.h"

#define MAGIC "KVQS"
#define VERSION 1u
#define HEADER_BYTES 64

typedef struct {
    uint64_t identity;
    uint32_t n_layer, n_head_kv, head_dim, n_vocab;
    uint8_t type_k, type_v, rotate_k, rotate_v, long_rope;
    uint32_t n_past;
    uint64_t payload;
} sess_header;

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void header_pack(const sess_header *h, uint8_t *p) {
    memset(p, 0, HEADER_BYTES);
    memcpy(p, MAGIC, 4);
    put32(p + 4, VERSION);
    put64(p + 8, h->identity);
    put32(p + 16, h->n_layer);
    put32(p + 20, h->n_head_kv);
    put32(p + 24, h->head_dim);
    put32(p + 28, h->n_vocab);
    p[32] = h->type_k, p[33] = h->type_v, p[34] = h->rotate_k, p[35] = h->rotate_v, p[36] = h->long_rope;
    put32(p + 40, h->n_past);
    put64(p + 48, h->payload);
}

static void header_unpack(const uint8_t *p, sess_header *h) {
    h->identity = get64(p + 8);
    h->n_layer = get32(p + 16);
    h->n_head_kv = get32(p + 20);
    h->head_dim = get32(p + 24);
    h->n_vocab = get32(p + 28);
    h->type_k = p[32], h->type_v = p[33], h->rotate_k = p[34], h->rotate_v = p[35], h->long_rope = p[36];
    h->n_past = get32(p + 40);
    h->payload = get64(p + 48);
}

/* What this context would write: its header for n_past positions. */
static sess_header header_of(const kvq_context *c, int n_past) {
    const kvq_hparams *hp = &c->m->hp;
    const kvq_kv_desc *kd = &c->act[0].kd;
    return (sess_header){
        .identity = c->m->identity, .n_layer = (uint32_t)hp->n_layer, .n_head_kv = (uint32_t)hp->n_head_kv,
        .head_dim = (uint32_t)hp->head_dim, .n_vocab = (uint32_t)hp->n_vocab, .type_k = (uint8_t)kd->type_k,
        .type_v = (uint8_t)kd->type_v, .rotate_k = (uint8_t)kd->rotate_k, .rotate_v = (uint8_t)kd->rotate_v,
        .long_rope = (uint8_t)(c->m->rope_freqs_long && c->rope_freqs == c->m->rope_freqs_long), .n_past = (uint32_t)n_past,
    };
}

/* Bytes of one layer's K (v = 0) or V rows for n positions; SIZE_MAX on overflow (a crafted
 * header: the types and head_dim are checked before this is called). */
static size_t section_bytes(const sess_header *h, int v, size_t n) {
    size_t rows, bytes;
    size_t rb = kvq_kv_row_bytes((kvq_cache_type)(v ? h->type_v : h->type_k), (int)h->head_dim);
    if (!kvq_mul_ok((size_t)h->n_head_kv, n, &rows) || !kvq_mul_ok(rows, rb, &bytes)) return SIZE_MAX;
    return bytes;
}

/* Payload bytes (tokens and rows) of a header; SIZE_MAX on overflow. */
static size_t payload_bytes(const sess_header *h) {
    size_t k = section_bytes(h, 0, h->n_past), v = section_bytes(h, 1, h->n_past), all;
    if (k == SIZE_MAX || v == SIZE_MAX || k > SIZE_MAX / 2 - v) return SIZE_MAX;
    if (!kvq_mul_ok(k + v, h->n_layer, &all) || all > SIZE_MAX - (size_t)h->n_past * 4) return SIZE_MAX;
    return all + (size_t)h->n_past * 4;
}

/* Section i of the rows (layer i / 2, K when i is even, V when odd): the device that holds
 * that layer, its cache, and the layer's index there. */
typedef struct {
    const kvq_dev *dev;
    kvq_kvbuf *kv;
    int layer, v;
} sess_section;

static sess_section section_at(const kvq_context *c, int i) {
    int l = i / 2, d = c->m->n_dev > 1 && l >= c->act[1].layer0 ? 1 : 0;
    return (sess_section){&c->m->dev[d], c->act[d].kv, l - c->act[d].layer0, i % 2};
}

kvq_status kvq_context_save(const kvq_context *c, const char *path, const int32_t *tokens, int n_tokens) {
    if (!c || !path) return kvq_fail(KVQ_ERR_ARG, "kvq_context_save: no context or path");
    if (n_tokens != c->n_past || (n_tokens > 0 && !tokens))
        return kvq_fail(KVQ_ERR_ARG, "%s: %d tokens given for a cache of %d positions", path, n_tokens, c->n_past);
    for (int d = 0; d < c->m->n_dev; d++)
        if (!c->m->dev[d].be->kv_read)
            return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: the %s backend cannot read its KV cache back", path, c->m->dev[d].be->name);
    sess_header h = header_of(c, c->n_past);
    size_t payload = payload_bytes(&h), most = 0;
    if (payload == SIZE_MAX) return kvq_fail(KVQ_ERR_ARG, "%s: the cache is too large to save", path);
    h.payload = payload;
    for (int v = 0; v < 2; v++)
        if (section_bytes(&h, v, h.n_past) > most) most = section_bytes(&h, v, h.n_past);
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) return kvq_fail(KVQ_ERR_ARG, "%s: path too long", path);
    uint8_t *rows = malloc(most ? most : 1);
    if (!rows) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory for %zu bytes of KV rows", path, most);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(rows);
        return kvq_fail(KVQ_ERR_IO, "%s: cannot create it", tmp);
    }
    uint8_t head[HEADER_BYTES];
    header_pack(&h, head);
    uint64_t sum = kvq_fnv1a(KVQ_FNV_SEED, head, sizeof head);
    int ok = fwrite(head, 1, sizeof head, f) == sizeof head;
    uint8_t *tok = malloc((size_t)h.n_past * 4 + 1);
    ok = ok && tok;
    for (uint32_t i = 0; ok && i < h.n_past; i++) put32(tok + 4 * (size_t)i, (uint32_t)tokens[i]);
    if (ok) {
        sum = kvq_fnv1a(sum, tok, (size_t)h.n_past * 4);
        ok = fwrite(tok, 1, (size_t)h.n_past * 4, f) == (size_t)h.n_past * 4;
    }
    free(tok);
    kvq_status s = ok ? KVQ_OK : kvq_fail(KVQ_ERR_IO, "%s: write failed", tmp);
    for (int i = 0; !s && i < 2 * (int)h.n_layer; i++) {
        sess_section x = section_at(c, i);
        size_t n = section_bytes(&h, x.v, h.n_past);
        if (n && (s = x.dev->be->kv_read(x.dev->b, x.kv, x.layer, x.v, 0, (int)h.n_past, rows))) break;
        sum = kvq_fnv1a(sum, rows, n);
        if (fwrite(rows, 1, n, f) != n) s = kvq_fail(KVQ_ERR_IO, "%s: write failed", tmp);
    }
    uint8_t tail[8];
    put64(tail, sum);
    if (!s && fwrite(tail, 1, 8, f) != 8) s = kvq_fail(KVQ_ERR_IO, "%s: write failed", tmp);
    if (fclose(f) != 0 && !s) s = kvq_fail(KVQ_ERR_IO, "%s: write failed", tmp);
    free(rows);
    if (!s && rename(tmp, path) != 0) s = kvq_fail(KVQ_ERR_IO, "%s: cannot rename %s to it", path, tmp);
    if (s) remove(tmp);
    return s;
}

static const char *type_name(uint8_t t) { return t <= KVQ_CACHE_Q4 ? kvq_cache_type_name((kvq_cache_type)t) : "?"; }

/* The file's header against this context: 0, or fails with the first difference. */
static kvq_status header_check(const kvq_context *c, const char *path, const sess_header *f) {
    sess_header h = header_of(c, 0);
    if (f->identity != h.identity) return kvq_fail(KVQ_ERR_ARG, "%s: saved from a different model", path);
    if (f->n_layer != h.n_layer || f->n_head_kv != h.n_head_kv || f->head_dim != h.head_dim || f->n_vocab != h.n_vocab)
        return kvq_fail(KVQ_ERR_ARG, "%s: cache shape %u layers x %u KV heads x %u differs from the model's %u x %u x %u", path,
                        f->n_layer, f->n_head_kv, f->head_dim, h.n_layer, h.n_head_kv, h.head_dim);
    if (f->type_k != h.type_k || f->type_v != h.type_v)
        return kvq_fail(KVQ_ERR_ARG, "%s: saved with a %s/%s cache, this context has %s/%s (-ctk/-ctv)", path,
                        type_name(f->type_k), type_name(f->type_v), type_name(h.type_k), type_name(h.type_v));
    if (f->rotate_k != h.rotate_k || f->rotate_v != h.rotate_v)
        return kvq_fail(KVQ_ERR_ARG, "%s: saved with the K/V rotation %s/%s, this context has %s/%s (--kv-rotate)", path,
                        f->rotate_k ? "on" : "off", f->rotate_v ? "on" : "off", h.rotate_k ? "on" : "off", h.rotate_v ? "on" : "off");
    /* longrope: rows made with the long table restore into a context that switches tables (one
     * with a token history, n_ctx past rope_orig_ctx); the restore sets its table to the file's */
    if (f->long_rope && !(c->m->rope_freqs_long && c->hist))
        return kvq_fail(KVQ_ERR_ARG, "%s: made with the long RoPE factors, past this context's reach (-c %d)", path, c->p.n_ctx);
    if (f->n_past > (uint32_t)c->p.n_ctx)
        return kvq_fail(KVQ_ERR_ARG, "%s: holds %u positions, more than this context's %d (-c)", path, f->n_past, c->p.n_ctx);
    return KVQ_OK;
}

kvq_status kvq_context_restore(kvq_context *c, const char *path, int32_t *tokens, int cap, int *n_tokens) {
    if (!c || !path || !n_tokens) return kvq_fail(KVQ_ERR_ARG, "kvq_context_restore: no context, path or count");
    *n_tokens = 0;
    for (int d = 0; d < c->m->n_dev; d++)
        if (!c->m->dev[d].be->kv_write)
            return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: the %s backend cannot load a KV cache", path, c->m->dev[d].be->name);
    kvq_mmap map;
    kvq_status s = kvq_mmap_open(path, &map);
    if (s) return s;
    const uint8_t *p = map.data;
    sess_header h;
    if (map.size < HEADER_BYTES + 8 || memcmp(p, MAGIC, 4) != 0) {
        s = kvq_fail(KVQ_ERR_FORMAT, "%s: not a kvq session file", path);
        goto out;
    }
    if (get32(p + 4) != VERSION) {
        s = kvq_fail(KVQ_ERR_FORMAT, "%s: session format version %u, this build reads %u", path, get32(p + 4), VERSION);
        goto out;
    }
    header_unpack(p, &h);
    if (h.type_k > KVQ_CACHE_Q4 || h.type_v > KVQ_CACHE_Q4 || h.head_dim == 0 || h.head_dim > 65536 ||
        h.n_layer > 65536 ||
        h.n_head_kv > 65536 || payload_bytes(&h) != h.payload || h.payload > map.size - HEADER_BYTES - 8 ||
        map.size != HEADER_BYTES + h.payload + 8) {
        s = kvq_fail(KVQ_ERR_FORMAT, "%s: damaged: its header does not match its size (%zu bytes)", path, map.size);
        goto out;
    }
    /* the checksum, section by section as written */
    uint64_t sum = kvq_fnv1a(KVQ_FNV_SEED, p, HEADER_BYTES);
    size_t off = HEADER_BYTES;
    sum = kvq_fnv1a(sum, p + off, (size_t)h.n_past * 4);
    off += (size_t)h.n_past * 4;
    for (uint32_t l = 0; l < h.n_layer; l++)
        for (int v = 0; v < 2; v++) {
            size_t n = section_bytes(&h, v, h.n_past);
            sum = kvq_fnv1a(sum, p + off, n);
            off += n;
        }
    if (sum != get64(p + off)) {
        s = kvq_fail(KVQ_ERR_FORMAT, "%s: damaged (checksum mismatch)", path);
        goto out;
    }
    if ((s = header_check(c, path, &h))) goto out;
    if ((int)h.n_past > cap) {
        s = kvq_fail(KVQ_ERR_ARG, "%s: holds %u tokens, room for %d given", path, h.n_past, cap);
        goto out;
    }
    for (uint32_t i = 0; i < h.n_past; i++) {
        int32_t t = (int32_t)get32(p + HEADER_BYTES + 4 * (size_t)i);
        if (t < 0 || t >= (int32_t)h.n_vocab) {
            s = kvq_fail(KVQ_ERR_FORMAT, "%s: token %u is %d, outside the vocabulary", path, i, t);
            goto out;
        }
        tokens[i] = t;
    }
    /* checked: now the cache changes */
    off = HEADER_BYTES + (size_t)h.n_past * 4;
    for (int i = 0; !s && i < 2 * (int)h.n_layer; i++) {
        sess_section x = section_at(c, i);
        size_t n = section_bytes(&h, x.v, h.n_past);
        if (n) s = x.dev->be->kv_write(x.dev->b, x.kv, x.layer, x.v, 0, (int)h.n_past, p + off);
        off += n;
    }
    for (int d = 0; !s && d < c->m->n_dev; d++)
        if (c->m->dev[d].be->flush) s = c->m->dev[d].be->flush(c->m->dev[d].b);
    c->n_past = s ? 0 : (int)h.n_past; /* a failed write leaves no usable positions */
    if (!s) {
        c->rope_freqs = h.long_rope ? c->m->rope_freqs_long : c->m->rope_freqs;
        if (c->hist) memcpy(c->hist, tokens, sizeof(int32_t) * h.n_past); /* the next crossing redoes them */
        c->n_hist = c->hist ? (int)h.n_past : 0;
    }
    c->logits_rows = 0;
    if (!s) *n_tokens = (int)h.n_past;
out:
    kvq_mmap_close(&map);
    return s;
}
