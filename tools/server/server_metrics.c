/* kvq-server: GET /metrics in the Prometheus text exposition format. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server.h"

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} tbuf;

static void put(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(tbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void metric(tbuf *b, const char *name, const char *type, const char *help, double v) {
    put(b, "# HELP kvq_%s %s\n# TYPE kvq_%s %s\nkvq_%s %.17g\n", name, help, name, type, name, v);
}

char *srv_metrics_text(const srv_snapshot *sn) {
    static const char *const routes[SRV_N_ROUTES] = {"chat_completions", "completions", "models", "health", "tokenize",
                                                     "detokenize", "metrics", "ui", "slots", "embeddings"};
    tbuf b = {0};
    const srv_metrics *m = &sn->m;
    put(&b, "# HELP kvq_requests_total HTTP requests answered, by route.\n# TYPE kvq_requests_total counter\n");
    for (int i = 0; i < SRV_N_ROUTES; i++) put(&b, "kvq_requests_total{route=\"%s\"} %lu\n", routes[i], m->requests[i]);
    put(&b, "# HELP kvq_request_errors_total Requests answered with an error status.\n"
            "# TYPE kvq_request_errors_total counter\n"
            "kvq_request_errors_total{class=\"4xx\"} %lu\nkvq_request_errors_total{class=\"5xx\"} %lu\n",
        m->errors_4xx, m->errors_5xx);
    metric(&b, "requests_rejected_busy_total", "counter", "Completions refused with 503 (all slots busy, queue full).",
           (double)m->rejected_busy);
    metric(&b, "requests_queued_total", "counter", "Completions that waited for a slot.", (double)m->queued_total);
    metric(&b, "client_disconnects_total", "counter", "Completions whose client went away before the end.", (double)m->disconnects);
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens of admitted completions.", (double)m->prompt_tokens);
    metric(&b, "prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's KV cache.", (double)m->prompt_tokens_cached);
    metric(&b, "prompt_seconds_total", "counter", "Seconds of the forwards that read prompt chunks.", m->prompt_seconds);
    metric(&b, "generated_tokens_total", "counter", "Tokens generated.", (double)m->gen_tokens);
    metric(&b, "generation_seconds_total", "counter", "Seconds of the decode forwards.", m->gen_seconds);
    metric(&b, "step_seconds_total", "counter", "Seconds of whole scheduler steps (forwards, sampling, publishing).", m->step_seconds);
    metric(&b, "generation_tokens_per_second", "gauge", "Aggregate decode tok/s over the recent steps.", m->gen_tps_ema);
    metric(&b, "steps_total", "counter", "Scheduler steps (a decode forward, a prompt chunk, or both).", (double)m->steps);
    metric(&b, "prefix_cache_hits_total", "counter", "Requests that started from a disk prefix cache file.", (double)m->prefix_hits);
    metric(&b, "prefix_cache_tokens_total", "counter", "Prompt tokens restored from the disk prefix cache.", (double)m->prefix_tokens);
    metric(&b, "prefix_cache_saves_total", "counter", "Slot caches written to the disk prefix cache.", (double)m->prefix_saves);
    metric(&b, "prefix_cache_files", "gauge", "Files in the disk prefix cache.", (double)m->prefix_files);
    metric(&b, "prefix_cache_bytes", "gauge", "Bytes of the disk prefix cache's files.", (double)m->prefix_bytes);
    metric(&b, "draft_tokens_total", "counter", "Tokens drafted for speculative decoding (--draft, --lookup).", (double)m->draft_tokens);
    metric(&b, "draft_tokens_accepted_total", "counter", "Drafted tokens the model's own choice kept.", (double)m->draft_accepted);
    metric(&b, "slots_total", "gauge", "Slots (-np).", sn->slots);
    metric(&b, "slots_busy", "gauge", "Slots running a request.", sn->busy);
    metric(&b, "queue_length", "gauge", "Requests waiting for a slot.", sn->queued);
    metric(&b, "kv_cache_bytes_used", "gauge", "KV cache bytes holding tokens, all slots.", (double)sn->kv_used);
    metric(&b, "kv_cache_bytes_total", "gauge", "KV cache bytes allocated, all slots.", (double)sn->kv_total);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

cJSON *srv_stats_json(const srv_snapshot *sn) {
    const srv_metrics *m = &sn->m;
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)m->prompt_tokens);
    cJSON_AddNumberToObject(j, "prompt_tokens_cached", (double)m->prompt_tokens_cached);
    cJSON_AddNumberToObject(j, "generated_tokens", (double)m->gen_tokens);
    cJSON_AddNumberToObject(j, "steps", (double)m->steps);
    cJSON_AddNumberToObject(j, "draft_n", (double)m->draft_tokens);
    cJSON_AddNumberToObject(j, "draft_n_accepted", (double)m->draft_accepted);
    cJSON_AddNumberToObject(j, "draft_accept_rate", m->draft_tokens ? (double)m->draft_accepted / m->draft_tokens : 0);
    cJSON_AddNumberToObject(j, "slots", sn->slots);
    cJSON_AddNumberToObject(j, "slots_busy", sn->busy);
    cJSON_AddNumberToObject(j, "queued", sn->queued);
    return j;
}
