/* kvq-server: server-sent events, shared by the single reply's stream (server_http.c) and the
 * n choices' stream (server_choices.c), so both frame events and end the same way. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

cJSON *srv_error_json(const srv_error *e) {
    cJSON *j = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    return j;
}

void srv_sse_event(srv_buf *out, cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!t) return;
    srv_buf_add(out, "data: ", 6);
    srv_buf_add(out, t, strlen(t));
    srv_buf_add(out, "\n\n", 2);
    free(t);
}

void srv_sse_end(srv_buf *out, const srv_error *err, cJSON *head, cJSON *timings, cJSON *usage) {
    if (err && err->status) { /* the error replaces the usage: there is none to count */
        cJSON_Delete(head);
        cJSON_Delete(timings);
        cJSON_Delete(usage);
        srv_sse_event(out, srv_error_json(err));
    } else if (head) {
        cJSON_AddArrayToObject(head, "choices");
        if (timings) cJSON_AddItemToObject(head, "timings", timings);
        cJSON_AddItemToObject(head, "usage", usage);
        srv_sse_event(out, head);
    } else {
        cJSON_Delete(timings);
        cJSON_Delete(usage);
    }
    srv_buf_add(out, "data: [DONE]\n\n", 14);
}
