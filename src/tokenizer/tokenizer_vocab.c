/* Vocabulary side of tokenizer.json: the BPE model (vocab, merges, options) and
 * the added tokens, with the hash tables the encoder looks pieces up in. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define TK_MAX_VOCAB (1 << 24) /* ids above this are surely corrupt: refuse, don't allocate */
#define TK_NONE UINT32_MAX

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix for the low bits */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static uint64_t hash_pair(uint64_t k) {
    k *= 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 31);
}

/* Power of two with load factor at most 0.6 (linear probing stays short). */
static uint32_t table_size(size_t n) {
    uint32_t sz = 16;
    while ((size_t)sz * 3 < n * 5) sz *= 2;
    return sz;
}

/* Stores s in the arena; returns its offset or TK_NONE when out of memory. */
static uint32_t arena_add(kvq_tokenizer *t, const char *s, size_t n) {
    if (t->arena.len + n >= TK_NONE) return TK_NONE;
    uint32_t off = (uint32_t)t->arena.len;
    if (tk_buf_put(&t->arena, s, n)) return TK_NONE;
    return off;
}

int32_t tk_vocab_find(const kvq_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_slot) return -1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        uint32_t v = t->vocab_slot[i];
        if (!v) return -1;
        int32_t id = (int32_t)(v - 1);
        if (t->model_len[id] == n && !memcmp(t->arena.p + t->model_off[id], s, n)) return id;
    }
}

int tk_merge_find(const kvq_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    if (!t->merge_key) return 0;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = (uint32_t)hash_pair(k) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        if (t->merge_key[i] == UINT64_MAX) return 0;
        if (t->merge_key[i] == k) {
            *rank = t->merge_rank[i];
            *new_id = t->merge_new[i];
            return 1;
        }
    }
}

const char *tk_id_text(const kvq_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || t->text_len[id] == TK_NONE) return NULL;
    *len = t->text_len[id];
    return t->arena.p + t->text_off[id];
}

static kvq_status nomem(const kvq_tokenizer *t) { return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", t->file); }

static int json_int(const cJSON *j, long lo, long hi, long *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    /* range first: converting an out-of-range double to long is undefined */
    if (!(v >= (double)lo && v <= (double)hi) || v != (double)(long)v) return 0;
    *out = (long)v;
    return 1;
}

static int json_bool(const cJSON *parent, const char *key, int dflt) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(parent, key);
    if (cJSON_IsBool(j)) return cJSON_IsTrue(j);
    return dflt;
}

static kvq_status load_vocab(kvq_tokenizer *t, const cJSON *vocab, const cJSON *added) {
    long max_id = -1, id = 0;
    size_t count = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, count++) {
        if (!e->string || !json_int(e, 0, TK_MAX_VOCAB - 1, &id))
            return kvq_fail(KVQ_ERR_FORMAT, "%s: model.vocab entry \"%.60s\" has no valid id", t->file,
                            e->string ? e->string : "");
        if (id > max_id) max_id = id;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        if (!json_int(cJSON_GetObjectItemCaseSensitive(a, "id"), 0, TK_MAX_VOCAB - 1, &id))
            return kvq_fail(KVQ_ERR_FORMAT, "%s: added_tokens entry without a valid id", t->file);
        if (id > max_id) max_id = id;
    }
    t->n_vocab = (int32_t)(max_id + 1);
    size_t nv = (size_t)t->n_vocab ? (size_t)t->n_vocab : 1;
    t->model_off = malloc(nv * sizeof *t->model_off);
    t->model_len = malloc(nv * sizeof *t->model_len);
    t->text_off = malloc(nv * sizeof *t->text_off);
    t->text_len = malloc(nv * sizeof *t->text_len);
    t->attr = calloc(nv, 1);
    if (!t->model_off || !t->model_len || !t->text_off || !t->text_len || !t->attr) return nomem(t);
    for (size_t i = 0; i < nv; i++) t->model_len[i] = t->text_len[i] = TK_NONE;

    for (const cJSON *e = vocab->child; e; e = e->next) {
        json_int(e, 0, TK_MAX_VOCAB - 1, &id);
        size_t n = strlen(e->string);
        uint32_t off = arena_add(t, e->string, n);
        if (off == TK_NONE) return nomem(t);
        t->model_off[id] = t->text_off[id] = off;
        t->model_len[id] = t->text_len[id] = (uint32_t)n;
    }
    /* Hash after all ids are placed, so a slot always names its id's final piece. */
    uint32_t sz = table_size(count);
    t->vocab_slot = calloc(sz, sizeof *t->vocab_slot);
    if (!t->vocab_slot) return nomem(t);
    t->vocab_mask = sz - 1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->model_len[i] == TK_NONE) continue;
        const char *s = t->arena.p + t->model_off[i];
        if (tk_vocab_find(t, s, t->model_len[i]) >= 0) continue;
        uint32_t h = (uint32_t)hash_bytes(s, t->model_len[i]) & t->vocab_mask;
        while (t->vocab_slot[h]) h = (h + 1) & t->vocab_mask;
        t->vocab_slot[h] = (uint32_t)i + 1;
    }
    return KVQ_OK;
}

/* One merge rule: "a b" (older files) or ["a", "b"] (newer). */
static int merge_parts(const cJSON *m, const char **a, size_t *al, const char **b, size_t *bl) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return 0;
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return 1;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *al = strlen(*a);
        *b = m->child->next->valuestring;
        *bl = strlen(*b);
        return 1;
    }
    return 0;
}

static kvq_status load_merges(kvq_tokenizer *t, const cJSON *merges) {
    size_t n = 0;
    for (const cJSON *m = merges->child; m; m = m->next) n++;
    uint32_t sz = table_size(n);
    t->merge_key = malloc(sz * sizeof *t->merge_key);
    t->merge_rank = malloc(sz * sizeof *t->merge_rank);
    t->merge_new = malloc(sz * sizeof *t->merge_new);
    if (!t->merge_key || !t->merge_rank || !t->merge_new) return nomem(t);
    memset(t->merge_key, 0xFF, sz * sizeof *t->merge_key);
    t->merge_mask = sz - 1;
    t->n_merges = n;

    tk_buf cat = {0};
    size_t pre = t->cont_prefix ? strlen(t->cont_prefix) : 0;
    uint32_t rank = 0;
    kvq_status st = KVQ_OK;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a, *b;
        size_t al, bl;
        if (!merge_parts(m, &a, &al, &b, &bl)) {
            st = kvq_fail(KVQ_ERR_FORMAT, "%s: model.merges[%u] is neither \"a b\" nor [\"a\", \"b\"]", t->file,
                          rank);
            break;
        }
        int32_t ia = tk_vocab_find(t, a, al), ib = tk_vocab_find(t, b, bl);
        /* With a continuing-subword prefix the merged piece drops b's prefix (as HF). */
        size_t skip = (pre && bl >= pre && !memcmp(b, t->cont_prefix, pre)) ? pre : 0;
        cat.len = 0;
        if (tk_buf_put(&cat, a, al) || tk_buf_put(&cat, b + skip, bl - skip)) {
            st = nomem(t);
            break;
        }
        int32_t inew = tk_vocab_find(t, cat.p, cat.len);
        if (ia < 0 || ib < 0 || inew < 0) {
            st = kvq_fail(KVQ_ERR_FORMAT, "%s: model.merges[%u] (\"%.*s\" + \"%.*s\") uses a piece not in the vocab",
                          t->file, rank, (int)(al > 40 ? 40 : al), a, (int)(bl > 40 ? 40 : bl), b);
            break;
        }
        uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint32_t h = (uint32_t)hash_pair(k) & t->merge_mask;
        while (t->merge_key[h] != UINT64_MAX && t->merge_key[h] != k) h = (h + 1) & t->merge_mask;
        /* A repeated pair keeps the later rank, as HF's map insert does. */
        t->merge_key[h] = k;
        t->merge_rank[h] = rank;
        t->merge_new[h] = inew;
    }
    tk_buf_free(&cat);
    return st;
}

static char *opt_string(const cJSON *model, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(model, key);
    return cJSON_IsString(j) && j->valuestring[0] ? strdup(j->valuestring) : NULL;
}

static int added_cmp(const void *x, const void *y) {
    const tk_added *a = x, *b = y;
    if (a->normalized != b->normalized) return a->normalized - b->normalized;
    if (a->first != b->first) return a->first - b->first;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return a->id - b->id;
}

/* Added tokens: text per id, attributes, and a table sorted for longest-first matching. */
static kvq_status load_added(kvq_tokenizer *t, const cJSON *added) {
    int n = added ? cJSON_GetArraySize(added) : 0;
    t->added = calloc((size_t)(n ? n : 1), sizeof *t->added);
    if (!t->added) return nomem(t);
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        long id = 0;
        json_int(cJSON_GetObjectItemCaseSensitive(a, "id"), 0, TK_MAX_VOCAB - 1, &id);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsString(c))
            return kvq_fail(KVQ_ERR_FORMAT, "%s: added token %ld has no content string", t->file, id);
        size_t len = strlen(c->valuestring);
        uint32_t off = arena_add(t, c->valuestring, len);
        if (off == TK_NONE) return nomem(t);
        tk_added *x = &t->added[t->n_added++];
        x->off = off;
        x->len = (uint32_t)len;
        x->first = len ? (uint8_t)c->valuestring[0] : -1;
        x->id = (int32_t)id;
        x->special = (uint8_t)json_bool(a, "special", 0);
        x->lstrip = (uint8_t)json_bool(a, "lstrip", 0);
        x->rstrip = (uint8_t)json_bool(a, "rstrip", 0);
        x->single_word = (uint8_t)json_bool(a, "single_word", 0);
        x->normalized = (uint8_t)json_bool(a, "normalized", !x->special);
        t->text_off[id] = off;
        t->text_len[id] = (uint32_t)len;
        t->attr[id] |= TK_ATTR_ADDED | (x->special ? TK_ATTR_SPECIAL : 0);
    }
    return KVQ_OK;
}

/* Normalized added tokens are matched against normalized text, so their content is
 * normalized too (as HF does); then the table is sorted and bucketed by first byte. */
kvq_status tk_index_added(kvq_tokenizer *t) {
    tk_pre_scratch sc = {0};
    kvq_status st = KVQ_OK;
    for (int i = 0; i < t->n_added && !st; i++) {
        tk_added *x = &t->added[i];
        if (!x->normalized || !t->norm.n) continue;
        tk_buf *out;
        if (tk_normalize(t, t->arena.p + x->off, x->len, &sc, &out)) {
            st = kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", t->file);
            break;
        }
        size_t len = out->len;
        uint32_t off = arena_add(t, out->p, len);
        if (off == TK_NONE) st = nomem(t);
        x->off = off;
        x->len = (uint32_t)len;
        x->first = len ? (uint8_t)out->p[0] : -1;
    }
    tk_pre_scratch_free(&sc);
    if (st) return st;
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
    /* added_first[k][b] .. added_first[k][b + 1]: tokens of kind k (normalized) starting with byte b */
    for (int k = 0; k < 2; k++)
        for (int b = 0, i = 0; b <= 256; b++) {
            while (i < t->n_added && (t->added[i].normalized < k || (t->added[i].normalized == k && t->added[i].first < b)))
                i++;
            t->added_first[k][b] = i;
        }
    return KVQ_OK;
}

/* Marks the code points that occur in multi-character pieces. Cutting words at the
 * others is exact only when a character's lookup does not depend on its position
 * (no subword prefix / word suffix) and no merge involves a byte-fallback piece. */
static kvq_status build_joinable(kvq_tokenizer *t) {
    if (t->cont_prefix || t->eow_suffix) return KVQ_OK;
    uint8_t *is_byte = calloc((size_t)t->n_vocab + 1, 1);
    if (!is_byte) return nomem(t);
    for (int k = 0; k < 256; k++)
        if (t->byte_id[k] >= 0) is_byte[t->byte_id[k]] = 1;
    int byte_merges = 0;
    for (uint32_t i = 0; i <= t->merge_mask && !byte_merges; i++)
        if (t->merge_key[i] != UINT64_MAX)
            byte_merges = is_byte[t->merge_key[i] >> 32] || is_byte[(uint32_t)t->merge_key[i]];
    free(is_byte);
    if (byte_merges) return KVQ_OK;
    t->joinable = calloc(0x110000 / 8, 1);
    if (!t->joinable) return nomem(t);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->model_len[id] == TK_NONE) continue;
        const char *s = t->arena.p + t->model_off[id];
        size_t n = t->model_len[id], adv;
        if (tk_utf8_len(s, n) == n) continue; /* a single character */
        for (size_t k = 0; k < n; k += adv) {
            int32_t cp = tk_utf8_decode(s + k, n - k, &adv);
            if (cp >= 0) t->joinable[cp >> 3] |= (uint8_t)(1 << (cp & 7));
        }
    }
    return KVQ_OK;
}

kvq_status tk_load_model(kvq_tokenizer *t, const cJSON *model, const cJSON *added) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (cJSON_IsString(type)) {
        const char *ty = type->valuestring;
        if (!strcmp(ty, "WordPiece") || !strcmp(ty, "Unigram") || !strcmp(ty, "WordLevel"))
            return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", t->file, ty);
        if (strcmp(ty, "BPE"))
            return kvq_fail(KVQ_ERR_FORMAT, "%s: unknown model type \"%.60s\"", t->file, ty);
    } else if (type || !merges) {
        /* very old files omit the type; only a BPE model has merges */
        return kvq_fail(KVQ_ERR_FORMAT, "%s: model has no type", t->file);
    }
    if (!cJSON_IsObject(vocab)) return kvq_fail(KVQ_ERR_FORMAT, "%s: model.vocab is not an object", t->file);
    if (!cJSON_IsArray(merges)) return kvq_fail(KVQ_ERR_FORMAT, "%s: model.merges is not an array", t->file);
    if (added && !cJSON_IsArray(added))
        return kvq_fail(KVQ_ERR_FORMAT, "%s: added_tokens is not an array", t->file);

    t->byte_fallback = json_bool(model, "byte_fallback", 0);
    t->fuse_unk = json_bool(model, "fuse_unk", 0);
    t->ignore_merges = json_bool(model, "ignore_merges", 0);
    t->cont_prefix = opt_string(model, "continuing_subword_prefix");
    t->eow_suffix = opt_string(model, "end_of_word_suffix");

    kvq_status st = load_vocab(t, vocab, added);
    if (!st) st = load_merges(t, merges);
    if (!st) st = load_added(t, added);
    if (st) return st;

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    t->unk_id = cJSON_IsString(unk) ? tk_vocab_find(t, unk->valuestring, strlen(unk->valuestring)) : -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tk_vocab_find(t, name, 6);
    }
    return build_joinable(t);
}
