/* safetensors: [u64 LE header length][JSON header][data]. The header maps each
 * tensor name to {dtype, shape, data_offsets [begin, end)} relative to the data
 * section. Everything is checked before any pointer is handed out. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEADER (100u << 20) /* the format's own limit is 100 MB */

static const struct {
    const char *name;
    kvq_dtype dt;
    size_t size;
} g_dtypes[] = {
    {"F32", KVQ_DT_F32, 4},   {"F16", KVQ_DT_F16, 2},   {"BF16", KVQ_DT_BF16, 2}, {"I8", KVQ_DT_I8, 1},
    {"I16", KVQ_DT_I16, 2},   {"F64", KVQ_DT_OTHER, 8}, {"I32", KVQ_DT_OTHER, 4}, {"I64", KVQ_DT_OTHER, 8},
    {"U8", KVQ_DT_OTHER, 1},  {"U16", KVQ_DT_OTHER, 2}, {"U32", KVQ_DT_OTHER, 4}, {"U64", KVQ_DT_OTHER, 8},
    {"BOOL", KVQ_DT_OTHER, 1}, {"F8_E4M3", KVQ_DT_OTHER, 1}, {"F8_E5M2", KVQ_DT_OTHER, 1},
};

size_t kvq_dtype_size(kvq_dtype dt) {
    for (size_t i = 0; i < sizeof g_dtypes / sizeof g_dtypes[0]; i++)
        if (g_dtypes[i].dt == dt) return g_dtypes[i].size;
    return 0;
}

const char *kvq_shape_str(const kvq_st_tensor *t, char *buf, size_t size) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, size - o, "[");
    for (int i = 0; i < t->n_dims && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < size) snprintf(buf + o, size - o, "]");
    return buf;
}

static int is_uint(const cJSON *j, double max) {
    return cJSON_IsNumber(j) && j->valuedouble >= 0 && j->valuedouble <= max &&
           j->valuedouble == (double)(uint64_t)j->valuedouble;
}

static kvq_status parse_entry(kvq_st_tensor *t, const cJSON *e, size_t data_size, const char *path) {
    const char *name = e->string;
    if (!cJSON_IsObject(e)) return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': needs dtype, shape and two data_offsets", path, name);
    size_t esize = 0;
    for (size_t i = 0; i < sizeof g_dtypes / sizeof g_dtypes[0]; i++)
        if (strcmp(dt->valuestring, g_dtypes[i].name) == 0) {
            t->dtype = g_dtypes[i].dt;
            esize = g_dtypes[i].size;
            snprintf(t->dtype_name, sizeof t->dtype_name, "%s", g_dtypes[i].name);
        }
    if (!esize) return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.16s'", path, name, dt->valuestring);
    int nd = cJSON_GetArraySize(shape);
    if (nd > KVQ_ST_MAX_DIMS) return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': %d dimensions is too many", path, name, nd);
    size_t count = 1;
    t->n_dims = nd;
    for (int i = 0; i < nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(shape, i);
        if (!is_uint(d, 9.0e15)) return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': bad shape entry", path, name);
        t->shape[i] = (int64_t)d->valuedouble;
        if (!kvq_mul_ok(count, (size_t)t->shape[i], &count))
            return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
    }
    const cJSON *b = cJSON_GetArrayItem(offs, 0), *en = cJSON_GetArrayItem(offs, 1);
    if (!is_uint(b, 9.0e15) || !is_uint(en, 9.0e15))
        return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, name);
    uint64_t begin = (uint64_t)b->valuedouble, end = (uint64_t)en->valuedouble;
    size_t nbytes;
    if (begin > end || !kvq_mul_ok(count, esize, &nbytes))
        return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, name);
    if (end > data_size)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': data_offsets end %llu is past the end of the file (data section is %zu bytes; truncated?)",
                        path, name, (unsigned long long)end, data_size);
    if (end - begin != nbytes)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s': %llu bytes of data for %zu %s values", path, name,
                        (unsigned long long)(end - begin), count, t->dtype_name);
    t->nbytes = nbytes;
    t->data = NULL; /* set by the caller, which knows the data section */
    (void)begin;
    return KVQ_OK;
}

static size_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return (size_t)h;
}

/* Makes room in the name index for `want` tensors (load factor <= 1/2). */
static int index_reserve(kvq_st *st, size_t want) {
    size_t cap = st->slots ? st->slot_mask + 1 : 0;
    if (want * 2 <= cap) return 0;
    size_t n = 64;
    while (n < want * 2) n *= 2;
    int *slots = calloc(n, sizeof *slots);
    if (!slots) return -1;
    for (int i = 0; i < st->n_tensors; i++) {
        size_t h = name_hash(st->tensors[i].name) & (n - 1);
        while (slots[h]) h = (h + 1) & (n - 1);
        slots[h] = i + 1;
    }
    free(st->slots);
    st->slots = slots;
    st->slot_mask = n - 1;
    return 0;
}

static void index_add(kvq_st *st, int i) {
    size_t h = name_hash(st->tensors[i].name) & st->slot_mask;
    while (st->slots[h]) h = (h + 1) & st->slot_mask;
    st->slots[h] = i + 1;
}

static int by_offset(const void *a, const void *b) {
    const kvq_st_tensor *x = *(const kvq_st_tensor *const *)a, *y = *(const kvq_st_tensor *const *)b;
    return (x->data > y->data) - (x->data < y->data);
}

/* Tensors of one file must not share bytes: a writer bug or a crafted file that
 * aliases one tensor's data as another's. Empty tensors take no bytes. */
static kvq_status check_overlaps(const kvq_st *st, int first, const uint8_t *data, const char *path) {
    int n = st->n_tensors - first;
    if (n < 2) return KVQ_OK;
    const kvq_st_tensor **v = malloc(sizeof *v * (size_t)n);
    if (!v) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
    int k = 0;
    for (int i = first; i < st->n_tensors; i++)
        if (st->tensors[i].nbytes) v[k++] = &st->tensors[i];
    qsort(v, (size_t)k, sizeof *v, by_offset);
    kvq_status s = KVQ_OK;
    for (int i = 1; i < k && s == KVQ_OK; i++) {
        const kvq_st_tensor *a = v[i - 1], *b = v[i];
        if (a->data + a->nbytes > b->data)
            s = kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' (data bytes %zu..%zu) overlaps tensor '%s' (bytes %zu..%zu)", path,
                         b->name, (size_t)(b->data - data), (size_t)(b->data - data) + b->nbytes, a->name,
                         (size_t)(a->data - data), (size_t)(a->data - data) + a->nbytes);
    }
    free(v);
    return s;
}

kvq_status kvq_st_parse(kvq_st *st, const uint8_t *buf, size_t size, const char *path, int file) {
    if (size < 8) return kvq_fail(KVQ_ERR_FORMAT, "%s: too short for a safetensors file (%zu bytes)", path, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > MAX_HEADER || hlen > size - 8)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: header length %llu does not fit in the file (%zu bytes; truncated?)", path,
                        (unsigned long long)hlen, size);
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvq_fail(KVQ_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    const uint8_t *data = buf + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++;
    kvq_st_tensor *nt = realloc(st->tensors, sizeof *nt * (size_t)(st->n_tensors + n + 1));
    if (nt) st->tensors = nt;
    if (!nt || index_reserve(st, (size_t)st->n_tensors + (size_t)n)) {
        cJSON_Delete(root);
        return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
    }
    int first = st->n_tensors;
    kvq_status s = KVQ_OK;
    for (const cJSON *e = root->child; e && s == KVQ_OK; e = e->next) {
        if (!e->string) { s = kvq_fail(KVQ_ERR_FORMAT, "%s: header entry without a name", path); break; }
        if (strcmp(e->string, "__metadata__") == 0) continue;
        if (kvq_st_find(st, e->string)) {
            s = kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' appears twice", path, e->string);
            break;
        }
        kvq_st_tensor *t = &st->tensors[st->n_tensors];
        memset(t, 0, sizeof *t);
        s = parse_entry(t, e, data_size, path);
        if (s != KVQ_OK) break;
        t->data = data + (size_t)cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), 0)->valuedouble;
        t->file = file;
        t->name = strdup(e->string);
        if (!t->name) { s = kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path); break; }
        index_add(st, st->n_tensors++);
    }
    cJSON_Delete(root);
    if (s == KVQ_OK) s = check_overlaps(st, first, data, path);
    return s;
}

static kvq_status add_file(kvq_st *st, const char *path) {
    char **np = realloc(st->paths, sizeof *np * (size_t)(st->n_files + 1));
    if (!np) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
    st->paths = np;
    kvq_mmap *nm = realloc(st->maps, sizeof *nm * (size_t)(st->n_files + 1));
    if (!nm) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
    st->maps = nm;
    int f = st->n_files;
    st->paths[f] = strdup(path);
    if (!st->paths[f]) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", path);
    kvq_status s = kvq_mmap_open(path, &st->maps[f]);
    if (s != KVQ_OK) { free(st->paths[f]); return s; }
    st->n_files++;
    return kvq_st_parse(st, st->maps[f].data, st->maps[f].size, path, f);
}

/* Shards named by the index must be plain file names inside the model directory. */
static int safe_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static kvq_status open_index(kvq_st *st, const char *dir, const char *index_path) {
    char *text;
    kvq_status s = kvq_read_file(index_path, &text, NULL);
    if (s != KVQ_OK) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return kvq_fail(KVQ_ERR_FORMAT, "%s: not valid JSON with a weight_map object", index_path);
    }
    char path[4096];
    for (const cJSON *e = map->child; e && s == KVQ_OK; e = e->next) {
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            s = kvq_fail(KVQ_ERR_FORMAT, "%s: weight_map entry '%s' is not a plain file name", index_path, e->string ? e->string : "?");
            break;
        }
        kvq_path_join(path, sizeof path, dir, e->valuestring);
        int seen = 0;
        for (int f = 0; f < st->n_files; f++) seen |= strcmp(st->paths[f], path) == 0;
        if (!seen && !kvq_file_exists(path))
            s = kvq_fail(KVQ_ERR_IO, "%s: shard named in model.safetensors.index.json is missing", path);
        else if (!seen)
            s = add_file(st, path);
    }
    /* every tensor the index names must be in the shard it names */
    for (const cJSON *e = map->child; e && s == KVQ_OK; e = e->next) {
        const kvq_st_tensor *t = kvq_st_find(st, e->string);
        kvq_path_join(path, sizeof path, dir, e->valuestring);
        if (!t || strcmp(st->paths[t->file], path) != 0)
            s = kvq_fail(KVQ_ERR_FORMAT, "%s: tensor '%s' is not in %s", index_path, e->string, e->valuestring);
    }
    cJSON_Delete(root);
    return s;
}

kvq_status kvq_st_open_dir(kvq_st *st, const char *dir) {
    memset(st, 0, sizeof *st);
    char single[4096], index[4096];
    kvq_path_join(single, sizeof single, dir, "model.safetensors");
    kvq_path_join(index, sizeof index, dir, "model.safetensors.index.json");
    kvq_status s;
    if (kvq_file_exists(single)) s = add_file(st, single);
    else if (kvq_file_exists(index)) s = open_index(st, dir, index);
    else s = kvq_fail(KVQ_ERR_IO, "%s: missing (and no model.safetensors.index.json in %s)", single, dir);
    if (s != KVQ_OK) kvq_st_close(st);
    return s;
}

void kvq_st_close(kvq_st *st) {
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    for (int f = 0; f < st->n_files; f++) {
        kvq_mmap_close(&st->maps[f]);
        free(st->paths[f]);
    }
    free(st->tensors);
    free(st->slots);
    free(st->maps);
    free(st->paths);
    memset(st, 0, sizeof *st);
}

const kvq_st_tensor *kvq_st_find(const kvq_st *st, const char *name) {
    if (!st->slots) return NULL;
    for (size_t h = name_hash(name) & st->slot_mask; st->slots[h]; h = (h + 1) & st->slot_mask)
        if (strcmp(st->tensors[st->slots[h] - 1].name, name) == 0) return &st->tensors[st->slots[h] - 1];
    return NULL;
}

const char *kvq_st_path(const kvq_st *st, const kvq_st_tensor *t) { return st->paths[t->file]; }
