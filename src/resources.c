#include "resources.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kv_format.h"

static int add_ok(size_t a, size_t b, size_t *r) { return !__builtin_add_overflow(a, b, r); }

/* a * b * c * d, 0 on overflow (callers only pass non-zero factors) */
static size_t mul4(size_t a, size_t b, size_t c, size_t d) {
    size_t r;
    if (!kvq_mul_ok(a, b, &r) || !kvq_mul_ok(r, c, &r) || !kvq_mul_ok(r, d, &r)) return 0;
    return r;
}

void kvq_act_widths_of(const kvq_hparams *hp, kvq_act_widths *w) {
    size_t used = hp->n_expert ? (size_t)hp->n_expert_used : 1;
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    memset(w, 0, sizeof *w);
    w->x = w->xb = w->xo = (size_t)hp->n_embd;
    w->q = w->att = qd;
    w->k = w->v = kvd;
    w->hb = w->hb2 = used * hp->n_ff;
    if (hp->fused_qkv) w->fused = qd + 2 * kvd > 2 * (size_t)hp->n_ff ? qd + 2 * kvd : 2 * (size_t)hp->n_ff;
    if (hp->n_expert) w->moe_out = used * hp->n_embd, w->router = (size_t)hp->n_expert;
}

kvq_status kvq_mem_estimate(const kvq_hparams *hp, int n_ctx, int n_batch, int logits_all, kvq_cache_type tk,
                            kvq_cache_type tv, kvq_mem_need *out) {
    memset(out, 0, sizeof *out);
    if (n_ctx <= 0 || n_batch <= 0 || hp->n_layer <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0)
        return kvq_fail(KVQ_ERR_ARG, "context sizes must be positive (n_ctx %d, n_batch %d)", n_ctx, n_batch);
    size_t row = kvq_kv_row_bytes(tk, hp->head_dim) + kvq_kv_row_bytes(tv, hp->head_dim);
    size_t kv = mul4((size_t)hp->n_layer, (size_t)hp->n_head_kv, (size_t)n_ctx, row ? row : 1);
    kvq_act_widths w;
    kvq_act_widths_of(hp, &w);
    /* each width is bounded by the config parser's limits, so the sum cannot wrap */
    size_t per_tok = w.x + w.xb + w.xo + w.q + w.att + w.k + w.v + w.hb + w.hb2 + w.fused + w.moe_out + w.router;
    size_t act = per_tok ? mul4(per_tok, (size_t)n_batch, sizeof(float), 1) : 0;
    size_t logits = mul4((size_t)(logits_all ? n_batch : 1) + 1, (size_t)hp->n_vocab, sizeof(float), 1);
    size_t total;
    if (!kv || !act || !logits || !add_ok(kv, act, &total) || !add_ok(total, logits, &total))
        return kvq_fail(KVQ_ERR_ARG, "a context of %d positions (batch %d) for this model is too large to address", n_ctx,
                        n_batch);
    out->kv = kv;
    out->act = act;
    out->logits = logits;
    out->total = total;
    return KVQ_OK;
}

static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30 : 0;
    if (end == s || (shift && end[1]) || (!shift && *end) || v > (SIZE_MAX >> shift)) return 0;
    return (size_t)v << shift;
}

/* First number after key in a /proc or cgroup file, times mult; SIZE_MAX when absent. */
static size_t read_value(const char *path, const char *key, size_t mult) {
    FILE *f = fopen(path, "r");
    if (!f) return SIZE_MAX;
    char line[256];
    size_t v = SIZE_MAX;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) != 0) continue;
        unsigned long long x;
        if (sscanf(line + kl, " %llu", &x) == 1 && x <= SIZE_MAX / mult) v = (size_t)x * mult;
        break;
    }
    fclose(f);
    return v;
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

size_t kvq_mem_available(void) {
    const char *env = getenv("KVQ_MEM_LIMIT");
    if (env && *env) {
        size_t v = parse_size(env);
        if (v) return v;
    }
    size_t avail = read_value("/proc/meminfo", "MemAvailable:", 1024);
    /* cgroup v2: limit minus current use ("max" reads as absent) */
    size_t lim = read_value("/sys/fs/cgroup/memory.max", "", 1), cur = read_value("/sys/fs/cgroup/memory.current", "", 1);
    if (lim != SIZE_MAX && cur != SIZE_MAX) avail = min_sz(avail, lim > cur ? lim - cur : 0);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) avail = min_sz(avail, (size_t)rl.rlim_cur);
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) avail = min_sz(avail, (size_t)rl.rlim_cur);
    return avail;
}

static double gib(size_t b) { return (double)b / (1 << 30); }

kvq_status kvq_mem_check(const kvq_hparams *hp, int n_ctx, int n_batch, int logits_all, kvq_cache_type tk,
                         kvq_cache_type tv) {
    kvq_mem_need need;
    kvq_status s = kvq_mem_estimate(hp, n_ctx, n_batch, logits_all, tk, tv, &need);
    size_t avail = kvq_mem_available();
    if (s == KVQ_OK && need.total <= avail) return KVQ_OK;
    /* the largest n_ctx that fits with the same batch, if any (need grows with n_ctx) */
    int lo = 0, hi = n_ctx;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        kvq_mem_need m;
        int nb = n_batch < mid ? n_batch : mid;
        if (kvq_mem_estimate(hp, mid, nb, logits_all, tk, tv, &m) == KVQ_OK && m.total <= avail) lo = mid;
        else hi = mid - 1;
    }
    char fit[96];
    if (lo >= 1) snprintf(fit, sizeof fit, "-c %d would fit", lo);
    else snprintf(fit, sizeof fit, "not even -c 1 fits");
    if (s != KVQ_OK)
        return kvq_fail(KVQ_ERR_NOMEM, "context of %d positions (-c %d) is too large to address; %s", n_ctx, n_ctx, fit);
    return kvq_fail(KVQ_ERR_NOMEM,
                    "context of %d positions (-c %d) needs %.2f GiB (KV cache %.2f GiB, K %s, V %s; buffers %.2f GiB) "
                    "but only %.2f GiB of memory is available; %s",
                    n_ctx, n_ctx, gib(need.total), gib(need.kv), kvq_cache_type_name(tk), kvq_cache_type_name(tv),
                    gib(need.act + need.logits), gib(avail), fit);
}
