/* kvq-server's speculative decoding (server_spec.c), called by the scheduler (server_sched.c). */
#ifndef KVQ_SERVER_SPEC_H
#define KVQ_SERVER_SPEC_H

#include "server_sched.h"

/* At start, after the slots: --draft's model (its vocabulary checked: a mismatch ends the
 * program with one line) and one draft context per slot, or --lookup. 0, or 1 after the message. */
int srv_spec_start(srv_server *s, const srv_opts *o);
void srv_spec_free(srv_server *s);
/* Before a step: each decoding slot's rows, its pending token and up to min(K, budget) drafts
 * (the draft model's steps batched over the slots). Then for slot i: its rows (*rows; they stay
 * until srv_spec_verify) and their count (1: no drafts). */
void srv_spec_draft_all(srv_server *s, int budget);
int srv_spec_rows(srv_server *s, int i, const int32_t **rows);
/* After the step, for a slot that had drafts (its pending token already in ids): samples row
 * after row with `sample` (the scheduler's), keeps the drafts chosen, drops the rest's cache. */
typedef void (*srv_sample_fn)(srv_server *s, slot *sl, const float *logits);
void srv_spec_verify(srv_server *s, int i, srv_sample_fn sample);
/* The token for logits when sl->draft >= 0 is being verified (greedy: kvq_sample's choice). */
int32_t srv_spec_pick(srv_server *s, slot *sl, const float *lg);
/* Under the lock: the drafted and accepted counts since the last call into s->met; returns
 * the accepted ones (0 without speculation). */
int srv_spec_commit(srv_server *s);

#endif
