/* Fuzz target: kvq-server's request parser (tools/server/server_request.c) on arbitrary
 * bodies. Byte 0 picks the route (mod 4: chat completions, completions, tokenize,
 * detokenize); the rest is the body. Every failure must be a 4xx with a message,
 * every success must hold only what the parser promises. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "server.h"

const char *SRV_PROG = "kvq-fuzz-server_request";

static void check_error(const srv_error *e) {
    if (e->status < 400 || e->status > 500 || !e->message[0] || !e->type) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    srv_error e;
    memset(&e, 0, sizeof e);
    switch (data[0] % 4) {
    case 0:
    case 1: {
        srv_params p;
        int chat = data[0] % 4 == 0;
        if (srv_parse_completion(body, len, chat, &p, &e)) {
            check_error(&e);
            break;
        }
        if (chat) {
            if (p.n_msgs < 1 || !p.msgs) abort();
            for (int i = 0; i < p.n_msgs; i++) {
                const char *r = p.msgs[i].role;
                if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) abort();
                /* no content only on an assistant reply that is tool calls; those only on assistants */
                if (p.msgs[i].tool_calls ? strcmp(r, "assistant") != 0 : !p.msgs[i].content) abort();
            }
            if (!p.tool_name != (p.tool_choice != SRV_TOOLS_NAMED) || (p.tool_name && !p.tools_json)) abort();
        } else if (!p.prompt == !p.prompt_ids || (p.prompt_ids && p.n_prompt_ids < 1)) {
            abort();
        }
        if ((p.max_tokens == 0 && !p.echo) || p.max_tokens < -1 || p.n_stop > SRV_MAX_STOP) abort();
        /* logprobs: 0..SRV_MAX_TOP alternatives, only when asked for; echo only on completions */
        if (p.top_logprobs < 0 || p.top_logprobs > SRV_MAX_TOP || (p.top_logprobs && !p.logprobs) || (chat && p.echo)) abort();
        for (int i = 0; i < p.n_stop; i++)
            if (!p.stop[i] || !p.stop[i][0]) abort();
        if ((p.has_temperature && (p.temperature < 0 || p.temperature > 2)) || (p.has_top_p && (p.top_p < 0 || p.top_p > 1)) ||
            (p.has_min_p && (p.min_p < 0 || p.min_p > 1)) || (p.has_top_k && p.top_k < 0))
            abort();
        srv_params_free(&p);
        break;
    }
    case 2: {
        char *content;
        int add;
        if (srv_parse_tokenize(body, len, &content, &add, &e)) check_error(&e);
        else if (!content) abort();
        free(content);
        break;
    }
    default: {
        int32_t *ids;
        int n;
        if (srv_parse_detokenize(body, len, &ids, &n, &e)) {
            check_error(&e);
            if (ids || n) abort();
        } else {
            for (int i = 0; i < n; i++)
                if (ids[i] < 0) abort();
        }
        free(ids);
        break;
    }
    }
    return 0;
}
