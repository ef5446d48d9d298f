/* Library-internal sampler queries (speculative.c). */
#ifndef KVQ_SAMPLER_H
#define KVQ_SAMPLER_H

#include "kvq.h"

/* 1 when s picks the argmax (temperature <= 0 or top-k 1): no random draw, no distribution. */
int kvq_sampler_is_greedy(const kvq_sampler *s);

#endif
