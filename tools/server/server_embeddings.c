/* kvq-server: POST /v1/embeddings. Each input's embedding is the mean over its positions of
 * the model's last hidden state after the final norm (kvq_embedding), L2-normalised; computed
 * on a context of its own (made at the first request, on the scheduler thread between steps),
 * so the slots' conversations keep their caches. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "server_sched.h"

typedef struct embd_job {
    srv_job job;
    int32_t *const *ids;
    const int *n;
    int count;
    float *out; /* count x n_embd */
} embd_job;

/* Outside the lock, on the scheduler thread. */
static void run_job(srv_server *s, embd_job *j) {
    const int d = kvq_model_n_embd(s->m);
    if (!s->embd) {
        kvq_context_params cp = s->cp;
        cp.embeddings = 1;
        cp.logits_all = 0;
        if (kvq_context_new(s->m, &cp, &s->embd) != KVQ_OK) {
            s->embd = NULL;
            srv_fail(&j->job.err, 500, NULL, "cannot make the embeddings context: %s", kvq_last_error());
            return;
        }
    }
    for (int i = 0; i < j->count; i++) {
        float *v = j->out + (size_t)i * d;
        if (kvq_kv_truncate(s->embd, 0) != KVQ_OK || kvq_eval(s->embd, j->ids[i], j->n[i]) != KVQ_OK ||
            kvq_embedding(s->embd, v) != KVQ_OK) {
            srv_fail(&j->job.err, 500, NULL, "input %d: %s", i, kvq_last_error());
            return;
        }
        double ss = 0;
        for (int k = 0; k < d; k++) ss += (double)v[k] * v[k];
        float inv = ss > 0 ? (float)(1 / sqrt(ss)) : 0;
        for (int k = 0; k < d; k++) v[k] *= inv;
    }
}

void srv_run_embd_jobs(srv_server *s) {
    while (s->embd_jobs) {
        embd_job *j = (embd_job *)s->embd_jobs;
        s->embd_jobs = j->job.next;
        pthread_mutex_unlock(&s->mu);
        run_job(s, j);
        pthread_mutex_lock(&s->mu);
        srv_job_done(&j->job);
    }
}

/* Waits for the scheduler to compute the embeddings: 0, or -1 with e filled. */
static int embed(srv_server *s, int32_t *const *ids, const int *n, int count, float *out, srv_error *e) {
    embd_job j = {.ids = ids, .n = n, .count = count, .out = out};
    return srv_job_wait(s, &s->embd_jobs, &j.job, e);
}

/* One input (a string, or an array of token ids) as tokens; NULL with e filled. */
static int32_t *input_ids(const cJSON *v, int i, const kvq_tokenizer *tok, int n_vocab, int n_ctx, int *n, srv_error *e) {
    int32_t *ids = NULL;
    if (cJSON_IsString(v) && !*v->valuestring) {
        return srv_fail(e, 400, "invalid_value", "input[%d] is empty", i), NULL;
    } else if (cJSON_IsString(v)) {
        size_t len = strlen(v->valuestring);
        int k = kvq_tokenize(tok, v->valuestring, len, 1, NULL, 0);
        if (k < 0) return srv_fail(e, 400, "invalid_value", "input[%d]: cannot tokenize: %s", i, kvq_last_error()), NULL;
        if (!(ids = malloc(sizeof *ids * (size_t)(k + 1)))) return srv_fail(e, 500, NULL, "out of memory"), NULL;
        kvq_tokenize(tok, v->valuestring, len, 1, ids, k);
        *n = k;
    } else if (cJSON_IsArray(v)) {
        int k = cJSON_GetArraySize(v), m = 0;
        if (!(ids = malloc(sizeof *ids * (size_t)(k + 1)))) return srv_fail(e, 500, NULL, "out of memory"), NULL;
        const cJSON *t;
        cJSON_ArrayForEach(t, v) {
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= n_vocab) {
                free(ids);
                return srv_fail(e, 400, "invalid_value", "input[%d][%d] is not a token id (0..%d)", i, m, n_vocab - 1), NULL;
            }
            ids[m++] = (int32_t)t->valuedouble;
        }
        *n = m;
    } else {
        return srv_fail(e, 400, "invalid_type", "input[%d] must be a string or an array of token ids", i), NULL;
    }
    if (*n == 0) srv_fail(e, 400, "invalid_value", "input[%d] is empty (no tokens)", i);
    else if (*n > n_ctx) srv_fail(e, 400, "context_length_exceeded", "input[%d] is %d tokens; the context holds %d", i, *n, n_ctx);
    else return ids;
    free(ids);
    return NULL;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The vector's float32 little-endian bytes in base64 (OpenAI's encoding_format "base64"). */
static char *base64_floats(const float *v, int d) {
    size_t n = (size_t)d * 4, k = 0;
    const unsigned char *b = (const unsigned char *)v; /* x86 and ARM: little-endian */
    char *o = malloc((n + 2) / 3 * 4 + 1);
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned x = (unsigned)b[i] << 16 | (i + 1 < n ? (unsigned)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        o[k++] = B64[x >> 18 & 63];
        o[k++] = B64[x >> 12 & 63];
        o[k++] = i + 1 < n ? B64[x >> 6 & 63] : '=';
        o[k++] = i + 2 < n ? B64[x & 63] : '=';
    }
    o[k] = 0;
    return o;
}

cJSON *srv_embeddings(srv_server *s, const char *model_name, const char *body, size_t len, srv_error *e) {
    cJSON *j = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return srv_fail(e, 400, "invalid_json", "the request body must be a JSON object"), NULL;
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(j, "input"), *fmt = cJSON_GetObjectItemCaseSensitive(j, "encoding_format");
    int b64 = 0, count = 0;
    if (fmt && !cJSON_IsNull(fmt) && (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && !(b64 = !strcmp(fmt->valuestring, "base64")))))
        srv_fail(e, 400, "invalid_value", "'encoding_format' must be \"float\" or \"base64\"");
    else if (!in) srv_fail(e, 400, "missing_field", "'input' is required");
    else if (!cJSON_IsString(in) && !cJSON_IsArray(in))
        srv_fail(e, 400, "invalid_type", "'input' must be a string, an array of strings or an array of token-id arrays");
    else if (cJSON_IsArray(in) && (count = cJSON_GetArraySize(in)) == 0) srv_fail(e, 400, "invalid_value", "'input' is an empty array");
    else if (count > 2048) srv_fail(e, 400, "invalid_value", "'input' has %d entries; the limit is 2048", count);
    if (e->status) {
        cJSON_Delete(j);
        return NULL;
    }
    /* one string, one token array, or an array of either */
    const cJSON *first = cJSON_IsArray(in) ? in->child : NULL;
    int single = cJSON_IsString(in) || cJSON_IsNumber(first);
    if (single) count = 1;
    const kvq_tokenizer *tok = kvq_model_tokenizer(s->m);
    int d = kvq_model_n_embd(s->m), total = 0;
    int32_t **ids = calloc((size_t)count, sizeof *ids);
    int *n = calloc((size_t)count, sizeof *n);
    float *out = malloc(sizeof *out * (size_t)count * (size_t)d);
    cJSON *res = NULL;
    if (!ids || !n || !out) srv_fail(e, 500, NULL, "out of memory");
    const cJSON *v = single ? in : in->child;
    for (int i = 0; !e->status && i < count; i++, v = v->next) {
        if (!(ids[i] = input_ids(v, i, tok, s->n_vocab, s->n_ctx, &n[i], e))) break;
        total += n[i];
    }
    if (!e->status && !embed(s, ids, n, count, out, e)) {
        res = cJSON_CreateObject();
        cJSON_AddStringToObject(res, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(res, "data");
        for (int i = 0; i < count; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "object", "embedding");
            cJSON_AddNumberToObject(o, "index", i);
            const float *vec = out + (size_t)i * d;
            char *t = b64 ? base64_floats(vec, d) : NULL;
            if (t) cJSON_AddStringToObject(o, "embedding", t);
            else cJSON_AddItemToObject(o, "embedding", cJSON_CreateFloatArray(vec, d));
            free(t);
            cJSON_AddItemToArray(data, o);
        }
        cJSON_AddStringToObject(res, "model", model_name);
        cJSON *u = cJSON_AddObjectToObject(res, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", total);
        cJSON_AddNumberToObject(u, "total_tokens", total);
    }
    for (int i = 0; ids && i < count; i++) free(ids[i]);
    free(ids);
    free(n);
    free(out);
    cJSON_Delete(j);
    return res;
}
