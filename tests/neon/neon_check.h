/* Shared by the qemu-run NEON test programs (plain C, no cmocka): the error measure. */
#ifndef KVQ_NEON_CHECK_H
#define KVQ_NEON_CHECK_H

#include <math.h>
#include <stddef.h>

/* ||a-b|| / ||b|| (absolute when b is all zero). */
static inline double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
