/* kvq-server, n > 1 on the scheduler's side: choice 0 (the lead) reads the prompt; the other
 * choices wait in slots of their own and, once it is read, take a copy of the lead's cache and
 * last logits (kvq_context_copy), so the prompt is evaluated once and each choice samples on
 * from there with its own generator. */
#include <string.h>

#include "server_sched.h"

int srv_free_slots(const srv_server *s) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) n += s->slots[i].r == NULL;
    return n;
}

void srv_fork_choices(srv_server *s, slot *lead) {
    const srv_req *lr = lead->r;
    if (lr->group < 2) return;
    for (int i = 0; i < s->n_slots; i++) {
        slot *f = &s->slots[i];
        srv_req *r = f->r;
        if (!r || !r->wait_lead || r->lead != lr) continue;
        r->wait_lead = 0;
        if (kvq_context_copy(f->c, lead->c) != KVQ_OK) { /* read the prompt itself instead */
            kvq_kv_truncate(f->c, 0);
            f->n_ids = f->n_saved = 0;
            r->n_cached = 0;
            continue;
        }
        memcpy(f->ids, lead->ids, sizeof *f->ids * (size_t)lead->n_ids);
        f->n_ids = lead->n_ids;
        memcpy(f->saved, lead->saved, sizeof *f->saved * (size_t)s->n_vocab);
        f->n_saved = lead->n_saved; /* the next step samples from them, as for a repeated prompt */
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
