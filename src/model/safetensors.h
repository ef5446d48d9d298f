/* safetensors reader: memory-mapped files, headers validated against the file. */
#ifndef KVQ_SAFETENSORS_H
#define KVQ_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum {
    KVQ_DT_F32 = 0,
    KVQ_DT_F16,
    KVQ_DT_BF16,
    KVQ_DT_I8,
    KVQ_DT_I16,
    KVQ_DT_OTHER, /* a valid safetensors dtype kvq does not compute with (F64, I32, U8, …) */
} kvq_dtype;

#define KVQ_ST_MAX_DIMS 8

typedef struct {
    char *name;
    kvq_dtype dtype;
    char dtype_name[8];
    int n_dims;
    int64_t shape[KVQ_ST_MAX_DIMS];
    const uint8_t *data; /* inside the mapping, no alignment promised */
    size_t nbytes;
    int file; /* index into kvq_st.paths */
} kvq_st_tensor;

typedef struct {
    int n_files;
    char **paths;
    kvq_mmap *maps;
    int n_tensors;
    kvq_st_tensor *tensors;
    /* name -> index + 1 (0: empty), open addressing: lookups stay O(1) even
     * for a crafted header with a million tensors */
    int *slots;
    size_t slot_mask;
} kvq_st;

/* Parses one safetensors image (8-byte header length, JSON header, data) and
 * appends its tensors to st (file index `file`). `path` is only for messages. */
kvq_status kvq_st_parse(kvq_st *st, const uint8_t *buf, size_t size, const char *path, int file);

/* Opens dir/model.safetensors, or every shard named by dir/model.safetensors.index.json. */
kvq_status kvq_st_open_dir(kvq_st *st, const char *dir);
void kvq_st_close(kvq_st *st);

const kvq_st_tensor *kvq_st_find(const kvq_st *st, const char *name);
const char *kvq_st_path(const kvq_st *st, const kvq_st_tensor *t);
size_t kvq_dtype_size(kvq_dtype dt);
const char *kvq_shape_str(const kvq_st_tensor *t, char *buf, size_t size);

#endif
