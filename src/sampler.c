/* Token sampling: greedy, or temperature + top-k + top-p with a seeded PRNG. */
#include <math.h>
#include <stdlib.h>

#include "util.h"

struct kvq_sampler {
    kvq_sampler_params p;
    uint64_t state;
    struct cand { float logit; int32_t id; } *cand;
    int cap;
};

kvq_sampler_params kvq_sampler_default_params(void) {
    kvq_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 0};
    return p;
}

kvq_sampler *kvq_sampler_new(const kvq_sampler_params *p) {
    kvq_sampler *s = calloc(1, sizeof *s);
    if (!s) {
        kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->p = p ? *p : kvq_sampler_default_params();
    s->state = s->p.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    return s;
}

void kvq_sampler_free(kvq_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s);
}

/* splitmix64 -> uniform in [0,1) */
static double next_uniform(kvq_sampler *s) {
    uint64_t z = (s->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int by_logit_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int32_t kvq_sample(kvq_sampler *s, const float *logits, int n) {
    if (n <= 0) return -1;
    if (s->p.temp <= 0 || s->p.top_k == 1) return argmax(logits, n);
    if (s->cap < n) {
        struct cand *c = realloc(s->cand, sizeof *c * (size_t)n);
        if (!c) return argmax(logits, n);
        s->cand = c;
        s->cap = n;
    }
    for (int i = 0; i < n; i++) s->cand[i] = (struct cand){logits[i], i};
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_logit_desc);
    int k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    /* softmax over the top k at temperature, then keep the smallest prefix with mass >= top_p */
    double sum = 0, maxl = s->cand[0].logit;
    double *pr = malloc(sizeof(double) * (size_t)k);
    if (!pr) return s->cand[0].id;
    for (int i = 0; i < k; i++) sum += pr[i] = exp((s->cand[i].logit - maxl) / s->p.temp);
    int keep = k;
    if (s->p.top_p < 1.0f) {
        double acc = 0;
        for (int i = 0; i < k; i++) {
            acc += pr[i] / sum;
            if (acc >= s->p.top_p) { keep = i + 1; break; }
        }
    }
    double mass = 0;
    for (int i = 0; i < keep; i++) mass += pr[i];
    double r = next_uniform(s) * mass;
    int32_t id = s->cand[keep - 1].id;
    for (int i = 0; i < keep; i++) {
        r -= pr[i];
        if (r < 0) { id = s->cand[i].id; break; }
    }
    free(pr);
    return id;
}
