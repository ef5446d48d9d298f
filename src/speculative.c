/* Speculative decoding: a drafter (a second model's context, or prompt lookup) proposes up to K
 * tokens; the target evaluates the pending token and the drafts in ONE forward with logits for
 * every row, keeps the drafts its own choice agrees with, and both caches roll back past them.
 * Each row of that forward comes out as a one-token decode's, bit for bit, while the rows stay
 * within kvq_model_exact_rows (the CPU's per-token kernels, the Vulkan backend's vector pieces
 * and row-by-row attention), so greedy output is plain decode's.
 *
 * Invariant between steps: the target's cache holds hist[0 .. n_hist-1) (everything but the
 * pending token hist[n_hist-1], which the last step produced and did not evaluate); the draft's
 * cache holds a prefix of hist and catches up at the start of the next step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "sampler.h"
#include "tokenizer/tokenizer.h"
#include "util.h"

/* Most drafts per step: past this a rejection wastes more than the step could save. */
#define KVQ_SPEC_MAX 64

struct kvq_spec {
    kvq_context *tgt, *drf;
    kvq_spec_params p;
    int n_vocab;
    int32_t *hist;  /* prompt and generated tokens, the pending one last */
    int n_hist, cap_hist, pending; /* pending: hist's last token is not in the target's cache */
    int32_t *drafts;
    float *q;       /* the draft model's distribution of each draft (sampling) [K][n_vocab] */
    float *pt;      /* the target's distribution of the row being checked */
    uint64_t drafted, accepted;
};

kvq_spec_params kvq_spec_default_params(void) {
    kvq_spec_params p = {.draft = NULL, .lookup_n = 3, .draft_max = 0, .draft_min_p = 0};
    return p;
}

kvq_status kvq_vocab_check(const kvq_model *t, const kvq_model *d) {
    const kvq_tokenizer *a = kvq_model_tokenizer(t), *b = kvq_model_tokenizer(d);
    if (kvq_model_n_vocab(t) != kvq_model_n_vocab(d) || a->n_vocab != b->n_vocab)
        return kvq_fail(KVQ_ERR_ARG, "draft model's vocabulary has %d tokens, the target's %d: not the same tokenizer",
                        kvq_model_n_vocab(d), kvq_model_n_vocab(t));
    if (a->bos != b->bos) return kvq_fail(KVQ_ERR_ARG, "draft model's BOS id %d differs from the target's %d", b->bos, a->bos);
    for (int32_t i = 0; i < a->n_vocab; i++) {
        size_t la = 0, lb = 0;
        const char *ta = tk_id_text(a, i, &la), *tb = tk_id_text(b, i, &lb);
        int same = (!ta && !tb) || (ta && tb && la == lb && !memcmp(ta, tb, la));
        if (!same || kvq_token_is_eog(a, i) != kvq_token_is_eog(b, i) || a->attr[i] != b->attr[i])
            return kvq_fail(KVQ_ERR_ARG, "draft model's token %d differs from the target's: not the same tokenizer", (int)i);
    }
    return KVQ_OK;
}

static kvq_status hist_push(kvq_spec *s, const int32_t *ids, int n) {
    if (s->n_hist + n > s->cap_hist) {
        int cap = (s->n_hist + n) * 2 + 64;
        int32_t *h = realloc(s->hist, sizeof *h * (size_t)cap);
        if (!h) return kvq_fail(KVQ_ERR_NOMEM, "out of memory for the token history");
        s->hist = h, s->cap_hist = cap;
    }
    memcpy(s->hist + s->n_hist, ids, sizeof *ids * (size_t)n);
    s->n_hist += n;
    return KVQ_OK;
}

kvq_status kvq_spec_new(kvq_context *tgt, const kvq_spec_params *pp, kvq_spec **out) {
    kvq_spec_params p = pp ? *pp : kvq_spec_default_params();
    *out = NULL;
    if (!tgt || tgt->n_past || (p.draft && p.draft->n_past)) return kvq_fail(KVQ_ERR_ARG, "kvq_spec_new: contexts must be empty");
    if (p.draft) {
        kvq_status st = kvq_vocab_check(tgt->m, p.draft->m);
        if (st) return st;
    } else if (p.lookup_n <= 0) {
        return kvq_fail(KVQ_ERR_ARG, "kvq_spec_new: neither a draft context nor a lookup n-gram length");
    }
    if (p.draft_max <= 0) p.draft_max = p.draft ? 8 : 6;
    if (p.draft_max > KVQ_SPEC_MAX) p.draft_max = KVQ_SPEC_MAX;
    /* the pending token and K drafts go through in one piece, one the backends compute row by
     * row as decode (past exact_rows the batched kernels round differently: greedy output drifts) */
    if (p.draft_max + 1 > tgt->p.n_batch) p.draft_max = tgt->p.n_batch - 1;
    const int exact = kvq_model_exact_rows(tgt->m);
    if (p.draft_max + 1 > exact) p.draft_max = exact - 1;
    if (p.draft_max < 1)
        return kvq_fail(KVQ_ERR_ARG, "kvq_spec_new: the target's n_batch (%d) or exact rows (%d) leave no room for drafts",
                        tgt->p.n_batch, exact);
    kvq_spec *s = calloc(1, sizeof *s);
    if (!s) return kvq_fail(KVQ_ERR_NOMEM, "out of memory");
    s->tgt = tgt, s->drf = p.draft, s->p = p;
    s->n_vocab = kvq_model_n_vocab(tgt->m);
    size_t nv = (size_t)s->n_vocab;
    s->drafts = malloc(sizeof *s->drafts * (size_t)p.draft_max);
    s->pt = malloc(sizeof *s->pt * nv);
    s->q = p.draft ? malloc(sizeof *s->q * nv * (size_t)p.draft_max) : NULL;
    /* the target's device logits for K+1 rows (kvq_eval_batch grows them the same way) */
    const kvq_dev *last = &tgt->m->dev[tgt->m->n_dev - 1];
    kvq_status st = KVQ_OK;
    if (!s->drafts || !s->pt || (p.draft && !s->q)) st = kvq_fail(KVQ_ERR_NOMEM, "out of memory for drafts");
    if (!st && tgt->logits_buf_rows < p.draft_max + 1) {
        kvq_buf *nb = last->be->buf_new(last->b, sizeof(float) * (size_t)(p.draft_max + 1) * nv);
        if (!nb) st = kvq_fail(KVQ_ERR_NOMEM, "out of memory for %d rows of logits", p.draft_max + 1);
        else {
            last->be->buf_free(last->b, tgt->logits);
            tgt->logits = nb;
            tgt->logits_buf_rows = p.draft_max + 1;
        }
    }
    if (st) {
        kvq_spec_free(s);
        return st;
    }
    *out = s;
    return KVQ_OK;
}

void kvq_spec_free(kvq_spec *s) {
    if (!s) return;
    free(s->hist), free(s->drafts), free(s->q), free(s->pt);
    free(s);
}

void kvq_spec_stats(const kvq_spec *s, uint64_t *drafted, uint64_t *accepted) {
    if (drafted) *drafted = s ? s->drafted : 0;
    if (accepted) *accepted = s ? s->accepted : 0;
}

kvq_status kvq_spec_prompt(kvq_spec *s, const int32_t *ids, int n) {
    if (s->pending || n <= 0) return kvq_fail(KVQ_ERR_ARG, "kvq_spec_prompt: only before the first step, with tokens");
    kvq_status st = kvq_eval(s->tgt, ids, n);
    /* the draft reads it now too, so a step's time is drafting and verifying alone */
    if (!st && s->drf) st = kvq_eval(s->drf, ids, n);
    if (!st) st = hist_push(s, ids, n);
    return st;
}

/* Up to k tokens that followed the most recent earlier occurrence of hist's last lookup_n tokens. */
static int draft_lookup(kvq_spec *s, int k) {
    const int g = s->p.lookup_n, n = s->n_hist;
    if (n <= g) return 0;
    const int32_t *tail = s->hist + n - g;
    for (int i = n - g - 1; i >= 0; i--) {
        if (memcmp(s->hist + i, tail, sizeof *tail * (size_t)g)) continue;
        int m = 0;
        for (int j = i + g; j < n && m < k; j++) s->drafts[m++] = s->hist[j];
        return m;
    }
    return 0;
}

static float softmax_top(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)x[i] - x[best]);
    return (float)(1.0 / z);
}

/* Up to k drafts from the draft model: it first catches up with hist, then runs its own decode.
 * Greedy: its argmax; sampling: a draw from its distribution under smp's settings (kept in q). */
static int draft_model(kvq_spec *s, kvq_sampler *smp, int greedy, int k, kvq_status *st) {
    kvq_context *d = s->drf;
    int have = d->n_past;
    if ((*st = kvq_eval(d, s->hist + have, s->n_hist - have))) return 0;
    int m = 0;
    while (m < k) {
        const float *lg = kvq_logits(d);
        if (s->p.draft_min_p > 0 && softmax_top(lg, s->n_vocab) < s->p.draft_min_p) break;
        int32_t t;
        if (greedy) {
            t = 0;
            for (int i = 1; i < s->n_vocab; i++)
                if (lg[i] > lg[t]) t = i;
        } else {
            float *q = s->q + (size_t)m * s->n_vocab;
            if ((*st = kvq_sampler_dist(smp, lg, s->n_vocab, q))) return 0;
            t = kvq_sampler_draw(smp, q, s->n_vocab);
        }
        s->drafts[m++] = t;
        if (m < k && (*st = kvq_eval(d, &t, 1))) return 0;
    }
    return m;
}

/* The target's token for a row: *acc says whether it is the draft (NULL draft: no draft). */
static int32_t target_token(kvq_spec *s, kvq_sampler *smp, int greedy, const float *row, const int32_t *draft,
                            const float *q, int *acc, kvq_status *st) {
    *acc = 0;
    if (greedy) { /* kvq_sample itself, so the repeat penalty and ties go exactly as in plain decode */
        int32_t t = kvq_sample(smp, row, s->n_vocab);
        *acc = draft && t == *draft;
        return t;
    }
    if ((*st = kvq_sampler_dist(smp, row, s->n_vocab, s->pt))) return -1;
    if (!draft) return kvq_sampler_draw(smp, s->pt, s->n_vocab);
    return kvq_sampler_verify(smp, s->pt, q, s->n_vocab, *draft, acc);
}

int kvq_spec_step(kvq_spec *s, kvq_sampler *smp, int32_t *out, int cap) {
    if (!s || !smp || !out || cap <= 0 || !s->n_hist) {
        kvq_fail(KVQ_ERR_ARG, "kvq_spec_step: bad arguments (prompt first)");
        return -1;
    }
    const int greedy = kvq_sampler_is_greedy(smp);
    kvq_status st = KVQ_OK;
    int n_out = 0;
    if (!s->pending) { /* first step: the prompt's logits give the first token */
        int acc;
        int32_t t = target_token(s, smp, greedy, kvq_logits(s->tgt), NULL, NULL, &acc, &st);
        if (st) return -1;
        kvq_sampler_accept(smp, t);
        out[n_out++] = t;
        if ((st = hist_push(s, &t, 1))) return -1;
        s->pending = 1;
        if (n_out == cap) return n_out;
    }
    /* room: the drafts accepted plus the token after them must fit in out */
    int k = s->p.draft_max < cap - n_out - 1 ? s->p.draft_max : cap - n_out - 1;
    int room = kvq_n_ctx(s->tgt) - s->tgt->n_past - 1;
    if (k > room) k = room;
    int nd = 0;
    if (k > 0) nd = s->drf ? draft_model(s, smp, greedy, k, &st) : draft_lookup(s, k);
    if (st) return -1;
    /* one forward: the pending token and the drafts, logits for every row */
    const int base = s->tgt->n_past;
    int32_t batch[1 + KVQ_SPEC_MAX];
    batch[0] = s->hist[s->n_hist - 1];
    memcpy(batch + 1, s->drafts, sizeof *batch * (size_t)nd);
    int all = s->tgt->p.logits_all;
    s->tgt->p.logits_all = 1;
    st = kvq_eval(s->tgt, batch, nd + 1);
    s->tgt->p.logits_all = all;
    if (st) return -1;
    s->drafted += (uint64_t)nd;
    int a = 0;
    int32_t t = -1;
    for (int i = 0; i <= nd; i++) {
        int acc;
        t = target_token(s, smp, greedy, kvq_logits_row(s->tgt, i), i < nd ? &s->drafts[i] : NULL,
                         s->q ? s->q + (size_t)i * s->n_vocab : NULL, &acc, &st);
        if (st) return -1;
        kvq_sampler_accept(smp, t);
        out[n_out++] = t;
        if (!acc) break;
        a++;
    }
    s->accepted += (uint64_t)a;
    /* keep the pending token and the accepted drafts; t is the new pending token */
    if ((st = kvq_kv_truncate(s->tgt, base + 1 + a))) return -1;
    if ((st = hist_push(s, s->drafts, a)) || (st = hist_push(s, &t, 1))) return -1;
    if (s->drf && s->drf->n_past > s->n_hist - 1 && (st = kvq_kv_truncate(s->drf, s->n_hist - 1))) return -1;
    return n_out;
}

/* A conversation keeps its caches between turns (and re-evaluates after a context shift), so
 * the history is the caller's: the draft keeps only the prefix it shares with the new one. */
kvq_status kvq_spec_sync(kvq_spec *s, const int32_t *ids, int n) {
    if (!s || !ids || n <= 0 || n != s->tgt->n_past)
        return kvq_fail(KVQ_ERR_ARG, "kvq_spec_sync: the target's cache must hold exactly the %d tokens given", n);
    if (s->drf) {
        int p = 0, have = s->drf->n_past < s->n_hist ? s->drf->n_past : s->n_hist;
        while (p < have && p < n && s->hist[p] == ids[p]) p++;
        if (p == n) p = n - 1; /* a truncated cache keeps stale logits: evaluate the last again */
        kvq_status st = kvq_kv_truncate(s->drf, p);
        if (st) return st;
    }
    s->n_hist = 0;
    s->pending = 0;
    return hist_push(s, ids, n);
}
