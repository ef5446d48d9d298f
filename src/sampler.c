/* Token sampling in llama.cpp's order: repeat penalty, top-k, top-p, min-p,
 * temperature, then a seeded draw. Nothing sorts the whole vocabulary: top-k
 * keeps a k-entry heap in one pass over the logits, and without top-k the
 * candidates are selected (quickselect) and sorted in growing prefixes until
 * top-p's mass or min-p's threshold is reached. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "util.h"

typedef struct {
    float logit;
    int32_t id;
} cand;

struct kvq_sampler {
    kvq_sampler_params p;
    uint64_t state;
    cand *cand;
    float *scratch; /* penalized copy of the logits */
    double *prob;
    int cap;
    int32_t *hist; /* ring buffer of the last repeat_last_n accepted tokens */
    int hist_n, hist_pos;
};

/* Beyond this k a heap (k log(n/k) replacements) loses to quickselect. */
#define HEAP_MAX_K 4096
/* First prefix sorted when top-k is off; grows 8x while top-p needs more. */
#define FIRST_PREFIX 256

kvq_sampler_params kvq_sampler_default_params(void) {
    kvq_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 0,
                            .min_p = 0.05f, .repeat_penalty = 1.0f, .repeat_last_n = 64};
    return p;
}

kvq_sampler *kvq_sampler_new(const kvq_sampler_params *p) {
    kvq_sampler *s = calloc(1, sizeof *s);
    if (!s) {
        kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->p = p ? *p : kvq_sampler_default_params();
    if (s->p.repeat_last_n < 0) s->p.repeat_last_n = 0;
    if (s->p.repeat_last_n > 0 && !(s->hist = malloc(sizeof *s->hist * (size_t)s->p.repeat_last_n))) {
        free(s);
        kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->state = s->p.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    return s;
}

void kvq_sampler_free(kvq_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->scratch);
    free(s->prob);
    free(s->hist);
    free(s);
}

void kvq_sampler_accept(kvq_sampler *s, int32_t id) {
    if (!s || s->p.repeat_last_n <= 0) return;
    s->hist[s->hist_pos] = id;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    if (s->hist_n < s->p.repeat_last_n) s->hist_n++;
}

void kvq_sampler_reset(kvq_sampler *s) {
    if (s) s->hist_n = s->hist_pos = 0;
}

/* splitmix64 -> uniform in [0,1) */
static double next_uniform(kvq_sampler *s) {
    uint64_t z = (s->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* Candidate order: higher logit first, ties to the lower id (deterministic). */
static inline int better(cand a, cand b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

/* Two passes, the first a plain max the compiler vectorizes: faster than one
 * branchy pass over a 128k vocabulary. */
static int32_t argmax(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++)
        if (x[i] == m) return i;
    return 0; /* all NaN */
}

static int grow(kvq_sampler *s, int n) {
    if (s->cap >= n) return 0;
    cand *c = realloc(s->cand, sizeof *c * (size_t)n);
    if (c) s->cand = c;
    float *f = realloc(s->scratch, sizeof *f * (size_t)n);
    if (f) s->scratch = f;
    double *pr = realloc(s->prob, sizeof *pr * (size_t)n);
    if (pr) s->prob = pr;
    if (!c || !f || !pr) return -1;
    s->cap = n;
    return 0;
}

/* Sift-down in a heap whose root is the worst candidate. */
static void heap_down(cand *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && better(h[w], h[l])) w = l;
        if (r < k && better(h[w], h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The best k of x[0..n) into out[0..k), unordered: one pass, a compare per logit. */
static void heap_top_k(const float *x, int n, int k, cand *out) {
    for (int i = 0; i < k; i++) out[i] = (cand){x[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) heap_down(out, k, i);
    for (int i = k; i < n; i++) {
        cand c = {x[i], i};
        if (better(c, out[0])) {
            out[0] = c;
            heap_down(out, k, 0);
        }
    }
}

/* Reorders a[0..n) so that a[0..m) are its best m (quickselect, median of three). */
static void select_best(cand *a, int n, int m) {
    int lo = 0, hi = n - 1;
    while (lo < hi && m > lo && m <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (better(a[mid], a[lo])) { cand t = a[mid]; a[mid] = a[lo]; a[lo] = t; }
        if (better(a[hi], a[lo])) { cand t = a[hi]; a[hi] = a[lo]; a[lo] = t; }
        if (better(a[hi], a[mid])) { cand t = a[hi]; a[hi] = a[mid]; a[mid] = t; }
        cand piv = a[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (better(a[i], piv)) i++;
            while (better(piv, a[j])) j--;
            if (i <= j) {
                cand t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        /* [lo..j] are >= pivot, [i..hi] are <= pivot */
        if (m <= j) hi = j;
        else if (m >= i) lo = i;
        else return;
    }
}

static int by_better(const void *x, const void *y) {
    const cand *a = x, *b = y;
    return better(*a, *b) ? -1 : better(*b, *a) ? 1 : 0;
}

/* The repeat-penalized logits (s->scratch, or logits itself when nothing is penalized); NULL
 * when out of memory. */
static const float *penalized(kvq_sampler *s, const float *logits, int n) {
    int penalize = s->p.repeat_penalty != 1.0f && s->p.repeat_penalty > 0 && s->hist_n > 0;
    if (!penalize) return logits;
    memcpy(s->scratch, logits, sizeof *logits * (size_t)n);
    /* each distinct recent token once, as llama.cpp: a repeat does not compound */
    for (int i = 0; i < s->hist_n; i++) {
        int32_t id = s->hist[i];
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = s->hist[j] == id;
        if (seen || id < 0 || id >= n) continue;
        float v = s->scratch[id];
        s->scratch[id] = v > 0 ? v / s->p.repeat_penalty : v * s->p.repeat_penalty;
    }
    return s->scratch;
}

static int greedy(const kvq_sampler *s) { return s->p.temp <= 0 || s->p.top_k == 1; }

int kvq_sampler_is_greedy(const kvq_sampler *s) { return greedy(s); }

/* Top-k, top-p and min-p over x: the survivors in s->cand[0..keep), their weights after the
 * temperature in s->prob; returns keep and their total weight in *mass. */
static int survivors(kvq_sampler *s, const float *x, int n, double *mass_out) {
    int k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    cand *c = s->cand;
    double *pr = s->prob;
    double top_p = s->p.top_p < 1.0f ? s->p.top_p : 2.0; /* > 1: never reached */
    /* min-p in logit terms: p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p) */
    double min_l = s->p.min_p > 0 ? log((double)s->p.min_p) : -INFINITY;
    int sorted; /* c[0..sorted) are in order */
    double z = 0; /* softmax normalizer over the top-k set, at temperature 1 */
    if (k <= HEAP_MAX_K) {
        heap_top_k(x, n, k, c);
        qsort(c, (size_t)k, sizeof *c, by_better);
        sorted = k;
        for (int i = 0; i < k; i++) z += exp((double)c[i].logit - c[0].logit);
    } else {
        for (int i = 0; i < n; i++) c[i] = (cand){x[i], i};
        if (k < n) select_best(c, n, k);
        sorted = k < FIRST_PREFIX ? k : FIRST_PREFIX;
        select_best(c, k, sorted);
        qsort(c, (size_t)sorted, sizeof *c, by_better);
        for (int i = 0; i < k; i++) z += exp((double)c[i].logit - c[0].logit);
    }
    /* Walk the sorted prefix: stop at top-p's mass or min-p's threshold, sorting more when needed. */
    double maxl = c[0].logit, acc = 0;
    int keep = 0;
    for (;;) {
        int done = 0;
        for (; keep < sorted; keep++) {
            double d = (double)c[keep].logit - maxl;
            if (keep > 0 && d < min_l) { done = 1; break; }
            acc += exp(d) / z;
            if (acc >= top_p) { keep++; done = 1; break; }
        }
        if (done || sorted == k) break;
        int next = sorted * 8 < k ? sorted * 8 : k;
        select_best(c + sorted, k - sorted, next - sorted);
        qsort(c + sorted, (size_t)(next - sorted), sizeof *c, by_better);
        sorted = next;
    }
    /* temperature over the survivors */
    double mass = 0;
    for (int i = 0; i < keep; i++) mass += pr[i] = exp(((double)c[i].logit - maxl) / s->p.temp);
    *mass_out = mass;
    return keep;
}

int32_t kvq_sample(kvq_sampler *s, const float *logits, int n) {
    if (!s || !logits || n <= 0) return -1;
    if (grow(s, n)) return argmax(logits, n); /* out of memory: still answer */
    const float *x = penalized(s, logits, n);
    if (greedy(s)) return argmax(x, n);
    double mass;
    int keep = survivors(s, x, n, &mass);
    double r = next_uniform(s) * mass;
    for (int i = 0; i < keep; i++) {
        r -= s->prob[i];
        if (r < 0) return s->cand[i].id;
    }
    return s->cand[keep - 1].id;
}

kvq_status kvq_sampler_dist(kvq_sampler *s, const float *logits, int n, float *probs) {
    if (!s || !logits || !probs || n <= 0) return kvq_fail(KVQ_ERR_ARG, "kvq_sampler_dist: bad arguments");
    if (grow(s, n)) return kvq_fail(KVQ_ERR_NOMEM, "out of memory");
    const float *x = penalized(s, logits, n);
    memset(probs, 0, sizeof *probs * (size_t)n);
    if (greedy(s)) {
        probs[argmax(x, n)] = 1.0f;
        return KVQ_OK;
    }
    double mass;
    int keep = survivors(s, x, n, &mass);
    for (int i = 0; i < keep; i++) probs[s->cand[i].id] = (float)(s->prob[i] / mass);
    return KVQ_OK;
}

int32_t kvq_sampler_draw(kvq_sampler *s, const float *probs, int n) {
    double total = 0;
    int32_t last = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0) total += probs[i], last = i;
    double r = next_uniform(s) * total;
    for (int i = 0; i < n; i++) {
        if (probs[i] <= 0) continue;
        r -= probs[i];
        if (r < 0) return i;
    }
    return last; /* rounding left r >= 0 */
}

int32_t kvq_sampler_verify(kvq_sampler *s, const float *pt, const float *pd, int n, int32_t draft, int *accepted) {
    double q = pd ? pd[draft] : 1.0, p = pt[draft];
    /* accept with probability min(1, p/q): u*q < p avoids dividing by a tiny q */
    if (q > 0 && next_uniform(s) * q < p) {
        *accepted = 1;
        return draft;
    }
    *accepted = 0;
    /* the residual max(0, p - q): what the draft under-proposes, drawn in proportion */
    double total = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)pt[i] - (pd ? pd[i] : (i == draft));
        if (d > 0) total += d;
    }
    if (total <= 0) return kvq_sampler_draw(s, pt, n); /* p == q to rounding: any draw from p */
    double r = next_uniform(s) * total;
    int32_t last = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)pt[i] - (pd ? pd[i] : (i == draft));
        if (d <= 0) continue;
        last = i;
        r -= d;
        if (r < 0) return i;
    }
    return last;
}
