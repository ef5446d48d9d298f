/* kvq-server, n > 1 on the scheduler's side: choice 0 (the lead) reads the prompt; the other
 * choices wait in slots of their own and, once it is read, take a copy of the lead's cache and
 * last logits (kvq_context_copy), so the prompt is evaluated once and each choice samples on
 * from there with its own generator. A choice that got its slot later, while the lead was
 * already generating, takes the same copy cut back to the prompt: the lead's prompt positions
 * and saved logits do not change while it generates, so the choice's reply does not depend on
 * when a slot came free. */
#include <string.h>

#include "server_sched.h"

int srv_lead_slot(const srv_server *s, const srv_req *r) {
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].r && s->slots[i].r == r->lead) return i;
    return -1;
}

/* Slot f takes the lead's prompt: its cache (cut back to the prompt), ids and saved logits. */
static void fork_one(srv_server *s, slot *f, const slot *lead) {
    srv_req *r = f->r;
    int n = lead->r->n_prompt;
    r->wait_lead = 0;
    if (kvq_context_copy(f->c, lead->c) != KVQ_OK || (lead->n_ids > n && kvq_kv_truncate(f->c, n) != KVQ_OK)) {
        kvq_kv_truncate(f->c, 0); /* read the prompt itself instead */
        f->n_ids = f->n_saved = 0;
        r->n_cached = 0;
        return;
    }
    memcpy(f->ids, lead->ids, sizeof *f->ids * (size_t)n);
    f->n_ids = n;
    memcpy(f->saved, lead->saved, sizeof *f->saved * (size_t)s->n_vocab);
    f->n_saved = lead->n_saved; /* the next step samples from them, as for a repeated prompt */
}

void srv_fork_choices(srv_server *s, slot *lead) {
    const srv_req *lr = lead->r;
    if (lr->group < 2) return;
    for (int i = 0; i < s->n_slots; i++) {
        slot *f = &s->slots[i];
        if (f->r && f->r->wait_lead && f->r->lead == lr) fork_one(s, f, lead);
    }
}

void srv_fork_late(srv_server *s) {
    for (int i = 0; i < s->n_slots; i++) {
        slot *f = &s->slots[i];
        if (!f->r || !f->r->wait_lead) continue;
        int l = srv_lead_slot(s, f->r); /* a waiting choice's lead holds its slot: srv_orphan_choices */
        if (l >= 0 && s->slots[l].r->t_prompt_done > 0) fork_one(s, f, &s->slots[l]);
    }
}

void srv_orphan_choices(srv_server *s, const srv_req *lead) {
    for (int i = 0; i < s->n_slots; i++) {
        srv_req *r = s->slots[i].r;
        if (!r || !r->wait_lead || r->lead != lead) continue;
        r->wait_lead = 0;
        s->met.prompt_tokens_cached -= (unsigned long)r->n_cached;
        r->n_cached = 0;
    }
}
