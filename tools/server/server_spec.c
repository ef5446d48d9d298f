/* kvq-server: speculative decoding inside the batched step (--draft DIR, --lookup N).
 * A slot that speculates puts its pending token and K drafts into the step's one
 * kvq_eval_batch as K+1 rows (its context set to keep every row's logits); afterwards it
 * samples row after row through the scheduler's own sampling (penalties, JSON constraint,
 * stop strings, logprobs), keeps the drafts its choice agrees with and truncates its cache
 * past them. Greedy output is therefore the plain server's, token for token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "server_spec.h"

/* Most drafts per slot and step: past this a rejection wastes more than it saves. The decoding
 * slots' rows and drafts together also stay within kvq_model_exact_rows, the rows a forward
 * computes each as a one-token decode, so greedy replies stay the plain server's. */
#define SPEC_MAX 16

struct srv_spec {
    kvq_model *dm;      /* --draft's model, or NULL (prompt lookup) */
    kvq_context **dc;   /* per slot: the draft model's context */
    int32_t **dids;     /* per slot: the tokens in dc's cache */
    int *n_dids;
    int32_t *rows;      /* per slot: [pending, drafts...] of this step, SPEC_MAX + 1 each */
    int *n_rows;
    float *dist;        /* the target's distribution of a row (sampling) */
    int lookup_n, k, n_vocab, n_ctx, exact; /* exact: kvq_model_exact_rows */
    float min_p;
    unsigned long drafted, accepted; /* since the last srv_spec_commit */
};

int srv_spec_start(srv_server *s, const srv_opts *o) {
    if (!o->draft_dir && !o->lookup_n) return 0;
    srv_spec *p = calloc(1, sizeof *p);
    if (!p) return kvq_tool_die(SRV_PROG, "out of memory");
    s->spec = p;
    p->exact = kvq_model_exact_rows(s->m);
    p->lookup_n = o->lookup_n > 0 ? (int)o->lookup_n : 3;
    p->k = o->draft_max > 0 ? (int)o->draft_max : (o->draft_dir ? 8 : 6);
    if (p->k > SPEC_MAX) p->k = SPEC_MAX;
    p->min_p = (float)o->draft_min_p;
    p->n_vocab = s->n_vocab;
    p->n_ctx = s->n_ctx;
    p->rows = malloc(sizeof *p->rows * (size_t)s->n_slots * (SPEC_MAX + 1));
    p->n_rows = calloc((size_t)s->n_slots, sizeof *p->n_rows);
    p->dist = malloc(sizeof *p->dist * (size_t)s->n_vocab);
    if (!p->rows || !p->n_rows || !p->dist) return kvq_tool_die(SRV_PROG, "out of memory");
    if (!o->draft_dir) return 0;
    kvq_model_params mp = kvq_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = (int)o->threads;
    mp.aqlm_cb8 = o->aqlm_cb8, mp.aqlm_i8 = o->aqlm_i8, mp.aqlm_lut8 = o->aqlm_lut8, mp.exact = o->exact;
    if (kvq_model_load(o->draft_dir, &mp, &p->dm) != KVQ_OK) return kvq_tool_die(SRV_PROG, "--draft %s: %s", o->draft_dir, kvq_last_error());
    if (kvq_vocab_check(s->m, p->dm) != KVQ_OK) return kvq_tool_die(SRV_PROG, "--draft %s: %s", o->draft_dir, kvq_last_error());
    p->dc = calloc((size_t)s->n_slots, sizeof *p->dc);
    p->dids = calloc((size_t)s->n_slots, sizeof *p->dids);
    p->n_dids = calloc((size_t)s->n_slots, sizeof *p->n_dids);
    if (!p->dc || !p->dids || !p->n_dids) return kvq_tool_die(SRV_PROG, "out of memory");
    kvq_context_params cp = s->cp;
    for (int i = 0; i < s->n_slots; i++) {
        if (kvq_context_new(p->dm, &cp, &p->dc[i]) != KVQ_OK)
            return kvq_tool_die(SRV_PROG, "--draft: slot %d's context: %s", i + 1, kvq_last_error());
        if (!(p->dids[i] = malloc(sizeof **p->dids * (size_t)(s->n_ctx + 1)))) return kvq_tool_die(SRV_PROG, "out of memory");
    }
    fprintf(stderr, "%s: drafting with %s (%s), up to %d tokens a step\n", SRV_PROG, o->draft_dir, kvq_model_desc(p->dm), p->k);
    return 0;
}

void srv_spec_free(srv_server *s) {
    srv_spec *p = s->spec;
    if (!p) return;
    for (int i = 0; p->dc && i < s->n_slots; i++) kvq_context_free(p->dc[i]), free(p->dids[i]);
    free(p->dc), free(p->dids), free(p->n_dids);
    kvq_model_free(p->dm);
    free(p->rows), free(p->n_rows), free(p->dist);
    free(p);
    s->spec = NULL;
}

/* Up to k tokens that followed the most recent earlier occurrence of h's last g tokens. */
static int draft_lookup(const int32_t *h, int n, int g, int32_t *out, int k) {
    if (n <= g) return 0;
    const int32_t *tail = h + n - g;
    for (int i = n - g - 1; i >= 0; i--) {
        if (memcmp(h + i, tail, sizeof *tail * (size_t)g)) continue;
        int m = 0;
        for (int j = i + g; j < n && m < k; j++) out[m++] = h[j];
        return m;
    }
    return 0;
}

static int argmax(const float *x, int n, float *p_top) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    if (p_top) { /* the softmax's top probability */
        double z = 0;
        for (int i = 0; i < n; i++) z += exp((double)x[i] - x[best]);
        *p_top = (float)(1.0 / z);
    }
    return best;
}

/* Slot i's draft context catches up with its history h[0..n) (keeping the prefix it shares)
 * as one entry of a batch: returns the tokens to evaluate (*ids), 0 when none are needed. */
static int catch_up(srv_spec *p, int i, const int32_t *h, int n, const int32_t **ids) {
    int c = 0;
    while (c < p->n_dids[i] && c < n && p->dids[i][c] == h[c]) c++;
    if (c == n) c--; /* its logits are needed: evaluate the last token again */
    kvq_kv_truncate(p->dc[i], c);
    memcpy(p->dids[i] + c, h + c, sizeof *h * (size_t)(n - c));
    p->n_dids[i] = c;
    *ids = p->dids[i] + c;
    return n - c;
}

/* The draft model's greedy drafts for the slots in who[0..na) (want[j] each at most), its steps
 * batched over the slots: first each catches up with its history, then one token a round.
 * Drafts are point masses for the accept rule. On a failure the drafts so far stand and the
 * draft caches are made again next time. */
static void draft_model(srv_server *s, const int *who, const int *want, int na) {
    srv_spec *p = s->spec;
    kvq_context *ctx[na];
    const int32_t *ids[na];
    int n[na], idx[na], cnt = 0;
    for (int j = 0; j < na; j++) {
        slot *sl = &s->slots[who[j]];
        ctx[cnt] = p->dc[who[j]];
        n[cnt] = catch_up(p, who[j], sl->ids, sl->n_ids + 1, &ids[cnt]);
        idx[cnt++] = j;
    }
    for (int round = 0; cnt; round++) {
        if (kvq_eval_batch(ctx, ids, n, cnt) != KVQ_OK) {
            for (int j = 0; j < cnt; j++) kvq_kv_truncate(ctx[j], 0), p->n_dids[who[idx[j]]] = 0;
            return;
        }
        int next = 0;
        for (int e = 0; e < cnt; e++) {
            int j = idx[e], i = who[j];
            p->n_dids[i] += n[e];
            float top;
            int32_t t = argmax(kvq_logits(ctx[e]), p->n_vocab, p->min_p > 0 ? &top : NULL);
            if (p->min_p > 0 && top < p->min_p) continue;
            int32_t *row = p->rows + (size_t)i * (SPEC_MAX + 1);
            row[p->n_rows[i]++] = t;
            if (round + 1 >= want[j]) continue;
            p->dids[i][p->n_dids[i]] = t; /* evaluated next round */
            ctx[next] = ctx[e], ids[next] = &p->dids[i][p->n_dids[i]], n[next] = 1, idx[next++] = j;
        }
        cnt = next;
    }
}

void srv_spec_draft_all(srv_server *s, int budget) {
    srv_spec *p = s->spec;
    int who[s->n_slots], want[s->n_slots], na = 0;
    int nd = 0; /* every decoding slot's rows within the exact rows: none drafts past exact slots */
    for (int i = 0; i < s->n_slots; i++) nd += s->slots[i].r && s->slots[i].has_pending;
    if (nd && p->exact / nd - 1 < budget) budget = p->exact / nd - 1;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->r || !sl->has_pending) continue;
        int32_t *row = p->rows + (size_t)i * (SPEC_MAX + 1);
        row[0] = sl->pending;
        p->n_rows[i] = 1;
        /* each accepted draft and the row after them is a generated token: none past max_tokens */
        int k = p->k < budget ? p->k : budget;
        long left = sl->r->max_tokens - sl->r->n_gen - 1;
        if (k > left) k = (int)left;
        if (k > p->n_ctx - sl->n_ids - 2) k = p->n_ctx - sl->n_ids - 2;
        if (k <= 0) continue;
        sl->ids[sl->n_ids] = sl->pending; /* past n_ids: scratch room, so the history is one array */
        if (p->dm) who[na] = i, want[na++] = k;
        else p->n_rows[i] += draft_lookup(sl->ids, sl->n_ids + 1, p->lookup_n, row + 1, k);
    }
    if (na) draft_model(s, who, want, na);
}

int srv_spec_rows(srv_server *s, int i, const int32_t **rows) {
    srv_spec *p = s->spec;
    *rows = p->rows + (size_t)i * (SPEC_MAX + 1);
    if (p->n_rows[i] > 1 && kvq_logits_all_set(s->slots[i].c, 1) != KVQ_OK) p->n_rows[i] = 1;
    return p->n_rows[i];
}

int32_t srv_spec_pick(srv_server *s, slot *sl, const float *lg) {
    srv_spec *p = s->spec;
    if (sl->r->sp.temp <= 0) return kvq_sample(sl->smp, lg, s->n_vocab); /* exactly the plain path's choice */
    /* the library's accept/resample rule with a point-mass draft: keeps it with the target's
     * probability, else draws from the rest; each token is still a draw from the target */
    int acc;
    if (kvq_sampler_dist(sl->smp, lg, s->n_vocab, p->dist) != KVQ_OK) return kvq_sample(sl->smp, lg, s->n_vocab);
    return kvq_sampler_verify(sl->smp, p->dist, NULL, s->n_vocab, sl->draft, &acc);
}

void srv_spec_verify(srv_server *s, int i, srv_sample_fn sample) {
    srv_spec *p = s->spec;
    slot *sl = &s->slots[i];
    const int32_t *row = p->rows + (size_t)i * (SPEC_MAX + 1);
    int nd = p->n_rows[i] - 1, a = 0;
    kvq_logits_all_set(sl->c, 0);
    for (int j = 0; j <= nd; j++) {
        sl->draft = j < nd ? row[1 + j] : -1;
        sample(s, sl, kvq_logits_row(sl->c, j));
        if (!sl->has_pending || j == nd || sl->pending != row[1 + j]) break;
        /* the draft is the token chosen, and already in the cache at its position */
        sl->ids[sl->n_ids++] = row[1 + j];
        sl->has_pending = 0;
        a++;
    }
    sl->draft = -1;
    kvq_kv_truncate(sl->c, sl->n_ids); /* the rejected drafts' positions */
    sl->r->draft_n += nd;
    sl->r->draft_accepted += a;
    p->drafted += (unsigned long)nd;
    p->accepted += (unsigned long)a;
    p->n_rows[i] = 1;
}

int srv_spec_commit(srv_server *s) {
    srv_spec *p = s->spec;
    if (!p) return 0;
    int kept = (int)p->accepted;
    s->met.draft_tokens += p->drafted;
    s->met.draft_accepted += p->accepted;
    p->drafted = p->accepted = 0;
    return kept;
}
