/* kvq-server: slot actions (POST /slots/{id}?action=save|restore|erase): a slot's KV cache to
 * and from a session file (kvq_context_save/restore), on the scheduler thread between steps. */
#include <sys/stat.h>

#include "common.h"
#include "server_sched.h"

static long file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Outside the lock, on the scheduler thread (the backends are not shared between threads):
 * one slot action on a slot that has no request. */
static void run_job(srv_server *s, slot_job *j) {
    slot *sl = &s->slots[j->slot];
    double t0 = kvq_tool_now();
    kvq_status st = KVQ_OK;
    if (j->action == SRV_SLOT_SAVE) {
        st = kvq_context_save(sl->c, j->path, sl->ids, sl->n_ids);
        j->res.n_tokens = sl->n_ids;
    } else if (j->action == SRV_SLOT_RESTORE) {
        int n = 0;
        st = kvq_context_restore(sl->c, j->path, sl->ids, s->n_ctx + 1, &n);
        sl->n_ids = st == KVQ_OK ? n : kvq_n_past(sl->c); /* refused: as it was */
        sl->n_saved = 0;                                 /* no logits came with it */
        j->res.n_tokens = n;
    } else {
        j->res.n_tokens = sl->n_ids;
        st = kvq_kv_truncate(sl->c, 0);
        sl->n_ids = sl->n_saved = 0;
    }
    j->res.ms = 1e3 * (kvq_tool_now() - t0);
    if (st == KVQ_OK && j->action != SRV_SLOT_ERASE) j->res.bytes = (size_t)file_bytes(j->path);
    if (st == KVQ_ERR_IO && j->action == SRV_SLOT_RESTORE) srv_fail(&j->job.err, 404, "not_found", "%s", kvq_last_error());
    else if (st == KVQ_ERR_FORMAT || st == KVQ_ERR_ARG) srv_fail(&j->job.err, 400, NULL, "%s", kvq_last_error());
    else if (st != KVQ_OK) srv_fail(&j->job.err, 500, NULL, "%s", kvq_last_error());
}

/* The others wait for their slot's request to end. */
void srv_run_slot_jobs(srv_server *s) {
    for (srv_job **pp = &s->jobs; *pp;) {
        slot_job *j = (slot_job *)*pp;
        if (s->slots[j->slot].r) {
            pp = &j->job.next;
            continue;
        }
        *pp = j->job.next;
        pthread_mutex_unlock(&s->mu);
        run_job(s, j);
        pthread_mutex_lock(&s->mu);
        srv_job_done(&j->job);
        pp = &s->jobs; /* the list may have changed while unlocked */
    }
}

int srv_slot_action(srv_server *s, int slot, int action, const char *path, srv_slot_result *res, srv_error *e) {
    if (slot < 0 || slot >= s->n_slots)
        return srv_fail(e, 400, NULL, "no slot %d: this server has slots 0..%d (-np %d)", slot, s->n_slots - 1, s->n_slots);
    slot_job j = {.slot = slot, .action = action, .path = path};
    int rc = srv_job_wait(s, &s->jobs, &j.job, e);
    *res = j.res;
    return rc;
}
