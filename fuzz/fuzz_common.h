/* Shared by the fuzz targets: temporary directories, files, and the fixture
 * tokenizers the encode/decode targets run on. */
#ifndef KVQ_FUZZ_COMMON_H
#define KVQ_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "kvq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A fresh directory under $TMPDIR (or /tmp), removed at exit. Aborts on failure. */
const char *fz_tmpdir(void);
/* Writes n bytes to dir/name (n == 0 with data NULL removes the file). Aborts on failure. */
void fz_write(const char *dir, const char *name, const void *data, size_t n);
/* Aborts unless kvq_last_error() is one non-empty line containing needle. */
void fz_check_error(const char *needle);

/* Tokenizers named by $KVQ_FUZZ_TOKENIZERS (colon-separated directories), else the
 * shared fixtures and the demo model. Loaded once; aborts when none loads. */
int fz_tokenizers(const kvq_tokenizer ***out);

#endif
