/* kvq-chat --draft DIR / --lookup N: generation through kvq_spec_step. The session's loops
 * take tokens one at a time from a buffer that each step fills (one verify forward gives up to
 * K+1); the caches then hold what the steps kept, which chat_spec_settle trims to the tokens
 * the loop actually used (it may stop inside a step's tokens, at an end of turn or -n). */
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "common.h"

int chat_spec_open(chat_spec *cs, const chat_opts *o, const kvq_model_params *mp, kvq_model *target, kvq_context *tgt) {
    memset(cs, 0, sizeof *cs);
    kvq_spec_params p = kvq_spec_default_params();
    if (o->draft) {
        if (kvq_model_load(o->draft, mp, &cs->dm) != KVQ_OK)
            return kvq_tool_die(CHAT_PROG, "--draft %s: %s", o->draft, kvq_last_error());
        /* before any context: a wrong pairing costs no memory */
        if (kvq_vocab_check(target, cs->dm) != KVQ_OK)
            return kvq_tool_die(CHAT_PROG, "--draft %s: %s", o->draft, kvq_last_error());
        kvq_context_params cp = kvq_context_default_params();
        cp.n_ctx = kvq_n_ctx(tgt); /* the draft runs at most K positions past the target */
        if (o->n_batch) cp.n_batch = (int)o->n_batch;
        cp.type_k = (kvq_cache_type)o->type_k;
        cp.type_v = (kvq_cache_type)o->type_v;
        cp.kv_rotate = o->kv_rotate;
        if (kvq_context_new(cs->dm, &cp, &cs->dc) != KVQ_OK)
            return kvq_tool_die(CHAT_PROG, "--draft %s: %s", o->draft, kvq_last_error());
        fprintf(stderr, "%s: draft %s: %s\n", CHAT_PROG, o->draft, kvq_model_desc(cs->dm));
        p.draft = cs->dc;
    } else {
        p.lookup_n = (int)o->lookup;
    }
    p.draft_max = (int)o->draft_max;
    p.draft_min_p = (float)o->draft_min_p;
    if (kvq_spec_new(tgt, &p, &cs->sp) != KVQ_OK) return kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
    return 0;
}

void chat_spec_close(chat_spec *cs) {
    kvq_spec_free(cs->sp);
    kvq_context_free(cs->dc);
    kvq_model_free(cs->dm);
    memset(cs, 0, sizeof *cs);
}

int chat_spec_start(chat_spec *cs, const int32_t *ids, int n) {
    cs->n_buf = cs->at = 0;
    if (kvq_spec_sync(cs->sp, ids, n) != KVQ_OK) return kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
    return 0;
}

int chat_spec_empty(const chat_spec *cs) { return cs->at == cs->n_buf; }

int32_t chat_spec_next(chat_spec *cs, kvq_sampler *s, long left) {
    if (cs->at == cs->n_buf) {
        /* left caps the step so -n N stops exactly at N without drafting past it */
        int cap = left > 0 && left < CHAT_SPEC_BUF ? (int)left : CHAT_SPEC_BUF;
        int r = kvq_spec_step(cs->sp, s, cs->buf, cap);
        if (r <= 0) {
            kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
            return -1;
        }
        cs->n_buf = r, cs->at = 0;
    }
    return cs->buf[cs->at++];
}

int chat_spec_settle(chat_spec *cs, kvq_context *c, const int32_t *ids, int n) {
    cs->n_buf = cs->at = 0;
    kvq_status st = KVQ_OK;
    int have = kvq_n_past(c);
    if (have > n) st = kvq_kv_truncate(c, n);
    else if (have < n) st = kvq_eval(c, ids + have, n - have); /* the pending token */
    if (st != KVQ_OK) return kvq_tool_die(CHAT_PROG, "%s", kvq_last_error());
    return 0;
}

void chat_spec_print(const chat_spec *cs, FILE *f, const char *prefix) {
    uint64_t d, a;
    kvq_spec_stats(cs->sp, &d, &a);
    fprintf(f, "%sdrafted %llu, accepted %llu (accept rate %.1f%%)", prefix, (unsigned long long)d, (unsigned long long)a,
            d ? 100.0 * (double)a / (double)d : 0.0);
}
