/* kvq-server: the hand-over of a job (a slot action, an embeddings request) from an HTTP
 * thread to the scheduler thread, which runs it between steps because it alone uses the
 * contexts. */
#include "server_sched.h"

int srv_job_wait(srv_server *s, srv_job **queue, srv_job *j, srv_error *e) {
    pthread_cond_init(&j->cv, NULL);
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        pthread_cond_destroy(&j->cv);
        return srv_fail(e, 503, "shutting_down", "the server is shutting down");
    }
    srv_job **pp = queue;
    while (*pp) pp = &(*pp)->next;
    j->next = NULL;
    *pp = j;
    pthread_cond_signal(&s->cv);
    while (!j->done) pthread_cond_wait(&j->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&j->cv);
    if (j->err.status) return *e = j->err, -1;
    return 0;
}

void srv_job_done(srv_job *j) {
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
}

void srv_jobs_fail(srv_job **queue) {
    for (srv_job *j = *queue; j; j = *queue) {
        *queue = j->next;
        srv_fail(&j->err, 503, "shutting_down", "the server is shutting down");
        srv_job_done(j);
    }
}
