/* kvq-server internals: request parsing (server_request.c), the slots and the
 * scheduler thread (server_sched.c), HTTP routes (server_http.c), Prometheus
 * metrics (server_metrics.c) and the embedded chat page (server_ui.html). */
#ifndef KVQ_TOOLS_SERVER_H
#define KVQ_TOOLS_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvq.h"

/* A growing NUL-terminated string (request bodies, SSE events, held-back reply text). */
typedef struct {
    char *p;
    size_t n, cap;
} srv_buf;

/* Appends k bytes of s; -1 when out of memory (the buffer is left as it was). */
int srv_buf_add(srv_buf *b, const char *s, size_t k);

extern const char *SRV_PROG;

#define SRV_MAX_STOP 4
#define SRV_MAX_BODY (8u << 20) /* bytes of a request body; more answers 413 */

/* ---- server_request.c: JSON bodies to parameters, no model needed ---------- */

typedef struct {
    int status;       /* HTTP status: 400, 401, 404, 405, 413, 503, 500 */
    const char *type; /* OpenAI error type, e.g. "invalid_request_error" */
    const char *code; /* OpenAI error code or NULL */
    char message[512];
} srv_error;

/* Fills e and returns -1 (for `return srv_fail(...)`). */
int srv_fail(srv_error *e, int status, const char *code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

typedef struct {
    int chat; /* 1: /v1/chat/completions, 0: /v1/completions */
    /* chat: the messages (role and content strings owned here) */
    kvq_chat_msg *msgs;
    int n_msgs;
    /* completion: the prompt as text, or as token ids */
    char *prompt;
    int32_t *prompt_ids;
    int n_prompt_ids;

    int stream, include_usage;
    long max_tokens; /* -1: not given (until end of text or full context) */
    double temperature, top_p, min_p, presence_penalty, frequency_penalty;
    long top_k;
    int has_temperature, has_top_p, has_min_p, has_top_k, has_seed;
    uint64_t seed;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int logprobs;      /* chat: logprobs true; completions: logprobs given (an integer) */
    long top_logprobs; /* alternatives per token: chat top_logprobs, completions logprobs (0..20) */
    int echo;          /* completions: the prompt comes back before the reply */
    char *tools_json;  /* chat: the tools array as JSON text (NULL: none, or tool_choice "none") */
    int tool_choice;   /* SRV_TOOLS_* */
    char *tool_name;   /* tool_choice naming a function: its name */
    const char *tools_fmt; /* the template's tool format (kvq_chat_template_tools), set before submitting */
    long n;            /* choices (1..SRV_MAX_CHOICES; at most the server's slots) */
    int json_mode, json_strict; /* response_format (SRV_JSON_*); strict: json_schema.strict */
    char *json_schema;          /* json_schema's schema as text; NULL: any object */
    int json_pretty;            /* "kvq_layout": "pretty": blanks allowed between JSON tokens (default compact) */
    char *grammar;              /* llama.cpp's "grammar" (GBNF text); json_mode is then SRV_JSON_GRAMMAR */
} srv_params;

/* server_tools_request.c: tools, tool_choice, tool_calls and tool_call_id. */
enum { SRV_TOOLS_AUTO, SRV_TOOLS_NONE, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED };
struct cJSON;
int srv_parse_tools(const struct cJSON *j, srv_params *p, srv_error *e);
int srv_parse_msg_tools(const struct cJSON *m, int i, const char *role, kvq_chat_msg *msg, srv_error *e);
/* server_tools_reply.c: 400 when tools meet a template without tool calling; a reply's
 * calls written into an OpenAI choice (message or delta), finish_reason "tool_calls"
 * (returns how many; 0: the text is plain content, choice untouched). */
int srv_tools_check(const kvq_chat_template *t, const srv_params *p, srv_error *e);
int srv_tools_reply(const kvq_chat_template *t, const char *text, struct cJSON *choice, int delta);
/* tool_choice "required" or named: the opening of a call in the template's format, put
 * after the generation prompt so the reply goes on as a call (malloc'd; NULL: none). */
char *srv_tools_prefill(const kvq_chat_template *t, const srv_params *p);
/* server_tools_grammar.c: a forced call written under the JSON grammar (name, arguments
 * under the function's parameters schema, the format's closing forced). srv_call_new: NULL
 * when the request forces no call (or with e filled). */
typedef struct srv_call srv_call;
int srv_call_check(const srv_params *p, srv_error *e); /* 400 when a forced function's schema does not compile */
const char *srv_call_forced_name(const srv_params *p); /* the function already named (NULL: the name is written) */
char *srv_call_prefill(const char *fmt, const srv_params *p); /* srv_tools_prefill for a format name */
srv_call *srv_call_new(const kvq_tokenizer *tok, const srv_params *p, srv_error *e);
int32_t srv_call_sample(srv_call *c, kvq_sampler *s, const float *logits, int n_vocab);
void srv_call_accept(srv_call *c, int32_t id);
int srv_call_done(const srv_call *c);
void srv_call_free(srv_call *c);

enum { SRV_JSON_NONE, SRV_JSON_OBJECT, SRV_JSON_SCHEMA, SRV_JSON_GRAMMAR };

#define SRV_MAX_CHOICES 16
#define SRV_N_ROUTES_MAX 16 /* room in the per-route counters */

/* Parses and checks a completion request body (chat: 1 for chat completions).
 * Returns 0, or -1 with e filled (4xx); p is then empty. */
int srv_parse_completion(const char *body, size_t len, int chat, srv_params *p, srv_error *e);
void srv_params_free(srv_params *p);

/* server_json.c: "response_format" into p (the schema checked: 400 when outside the subset),
 * and the request's constraint on the model's vocabulary (NULL with e filled). */
struct cJSON;
int srv_parse_response_format(const struct cJSON *j, srv_params *p, srv_error *e);
int srv_parse_response_format_only(const struct cJSON *j, srv_params *p, srv_error *e); /* without llama.cpp's fields */
kvq_json_constraint *srv_json_constraint(const kvq_tokenizer *tok, const srv_params *p, srv_error *e);
/* "system_fingerprint": "kvq", or "kvq schema-ignored=kw1,kw2" naming the keywords of a
 * non-strict response_format schema that were not enforced. */
void srv_add_fingerprint(struct cJSON *j, const kvq_json_constraint *c);

/* POST /tokenize {"content": str, "add_special": bool}; /detokenize {"tokens": [int]}. */
int srv_parse_tokenize(const char *body, size_t len, char **content, int *add_special, srv_error *e);
int srv_parse_detokenize(const char *body, size_t len, int32_t **ids, int *n, srv_error *e);

/* ---- server_logprobs.c: log-probabilities of tokens and their JSON ---------- */

#define SRV_MAX_TOP 20

/* One token's log-probability under the model and its most likely alternatives. */
typedef struct {
    int32_t id;
    int offset;  /* byte offset of its text in the prompt's or the reply's text */
    float logprob; /* NAN: none (an echoed prompt's first token) */
    int n_top;
    int32_t top_id[SRV_MAX_TOP];
    float top_lp[SRV_MAX_TOP];
} srv_lp;

/* Log-softmax (in double) of logits at token id, and the n_top most likely tokens,
 * best first, chosen by a partial selection. */
void srv_logprobs(const float *logits, int n_vocab, int32_t id, int n_top, srv_lp *out);
/* The answers' JSON for entries lp[0..n): chat's {"content": [...], "refusal"}, and the legacy
 * completions' {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (lp[i] is the
 * request's entry first+i; the first n_prompt entries an echoed prompt's, the reply's offsets
 * shifted by the echoed text's length). */
struct cJSON;
struct cJSON *srv_chat_logprobs_json(const kvq_tokenizer *tok, const srv_lp *lp, int n);
struct cJSON *srv_cmpl_logprobs_json(const kvq_tokenizer *tok, const srv_lp *lp, int n, int first, int n_prompt,
                                     size_t echo_len);

/* ---- server_sched.c: slots, queue, scheduler thread ----------------------- */

enum { SRV_FINISH_NONE, SRV_FINISH_STOP, SRV_FINISH_LENGTH };

/* One completion request, shared by its HTTP connection and the scheduler.
 * Fields below `out` change under the server's lock. */
typedef struct srv_req {
    struct srv_req *next; /* queue link */
    long id;
    int chat, plain_chat; /* plain_chat: no template, the reply is the rest of the line */
    int32_t *prompt;
    int n_prompt;
    long max_tokens; /* already clipped to the context */
    kvq_sampler_params sp;
    float presence, frequency;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int logprobs, n_top, echo; /* echo with logprobs: the prompt's tokens are scored too */
    int *prompt_off;           /* echo with logprobs: byte offset of each prompt token's text */
    kvq_json_constraint *json; /* response_format: the reply is a JSON value (NULL: free text) */
    srv_call *call;            /* a forced tool call under the grammar (NULL: none) */
    int n_scored;              /* scheduler only: prompt tokens whose log-probability is known */

    /* out: text produced so far, consumed by the HTTP side from `sent` */
    pthread_cond_t cv;
    char *text;
    size_t n_text, cap_text, sent;
    srv_lp *lp; /* logprobs: the echoed prompt's tokens, then the generated ones */
    int n_lp, cap_lp, lp_sent;
    int n_gen, n_cached; /* tokens generated; prompt tokens reused from a slot's cache */
    int n_disk;          /* of n_cached, restored from the disk prefix cache */
    int draft_n, draft_accepted; /* speculative decoding: tokens drafted, and of them accepted */
    /* n > 1: choice `index` of a request; the others point at choice 0 (lead) and, while
     * wait_lead, hold a slot that takes a copy of the lead's cache once its prompt is read */
    struct srv_req *lead;
    int index, group, wait_lead;
    int done, finish, cancelled, refs, queued, slot;
    srv_error err; /* err.status != 0: failed before producing anything */
    double t_submit, t_first, t_done, t_prompt_done;
} srv_req;

typedef struct srv_metrics {
    unsigned long requests[SRV_N_ROUTES_MAX], errors_4xx, errors_5xx, rejected_busy, queued_total, disconnects;
    unsigned long prompt_tokens, prompt_tokens_cached, gen_tokens, steps;
    double prompt_seconds, gen_seconds, gen_tps_ema;
    double step_seconds; /* whole steps: the forwards, sampling, publishing (the rest is the server's own) */
    /* --prefix-cache: restores, the prompt tokens they gave, files written; files and bytes held */
    unsigned long prefix_hits, prefix_tokens, prefix_saves, prefix_files, prefix_bytes;
    unsigned long draft_tokens, draft_accepted; /* --draft/--lookup: tokens drafted, and accepted */
} srv_metrics;

typedef struct srv_server srv_server;

typedef struct {
    const char *model_dir, *backend, *device, *chat_template, *alias, *api_key, *host;
    long port, n_slots, n_ctx, n_batch, chunk, threads, queue;
    int ngl; /* -ngl: layers on the GPU backend, -1 all */
    int type_k, type_v, kv_rotate, aqlm_cb8, aqlm_lut8, aqlm_i8, exact, plan;
    const char *slot_save_path; /* --slot-save-path: the directory slot save/restore files live in */
    long prefix_mib; /* --prefix-cache MIB: slots' caches kept in slot_save_path for new requests; 0 off */
    const char *draft_dir; /* --draft: the draft model; or --lookup N (prompt lookup); both unset: off */
    long lookup_n, draft_max;
    double draft_min_p;
} srv_opts;

/* Loads nothing: takes the model, makes one context per slot and starts the scheduler thread. */
int srv_sched_start(srv_server **out, const srv_opts *o, kvq_model *m);
/* Stops the scheduler: queued requests fail with 503, running ones end (finish "length"). */
void srv_sched_stop(srv_server *s);
void srv_sched_free(srv_server *s);

/* Takes ownership of prompt. Returns the request (refs 2: the caller releases
 * it with srv_req_release) or NULL with e filled (503 when the queue is full). */
srv_req *srv_submit(srv_server *s, const srv_params *p, int32_t *prompt, int n_prompt, int plain_chat, srv_error *e);
/* p->n choices into out[0..p->n) (each released by the caller), queued together and admitted
 * together when p->n slots are free; choice i draws with seed + i. 0, or -1 with e filled. */
int srv_submit_n(srv_server *s, const srv_params *p, int32_t *prompt, int n_prompt, int plain_chat, srv_req **out, srv_error *e);
/* Waits until the request has text past r->sent or logprobs past r->lp_sent, is done, or
 * `ms` passed. Copies the new text into *chunk (malloc'd, NUL-terminated) and the new logprob
 * entries into *lp (malloc'd; NULL lp: left for later) and advances the cursors.
 * Returns 1 when there is something new or it is done, 0 on timeout. */
int srv_req_wait(srv_server *s, srv_req *r, int ms, char **chunk, size_t *n_chunk, srv_lp **lp, int *n_lp, int *done);
/* Marks the request cancelled (client gone); the scheduler frees its slot at the next step. */
void srv_req_cancel(srv_server *s, srv_req *r);
void srv_req_release(srv_server *s, srv_req *r);

/* POST /slots/{id}?action=save|restore|erase: runs on the scheduler thread once the slot has
 * no request (it waits for the running one to end). path: the session file (save, restore).
 * 0 with res filled, or -1 with e filled. */
enum { SRV_SLOT_SAVE, SRV_SLOT_RESTORE, SRV_SLOT_ERASE };
typedef struct {
    int n_tokens;  /* saved, restored or erased */
    size_t bytes;  /* the file's size (save, restore) */
    double ms;
} srv_slot_result;
int srv_slot_action(srv_server *s, int slot, int action, const char *path, srv_slot_result *res, srv_error *e);

int srv_n_ctx(const srv_server *s);
int srv_n_slots(const srv_server *s);
kvq_model *srv_model(srv_server *s);
/* A snapshot for /metrics and /health, taken under the lock. */
typedef struct {
    srv_metrics m;
    int busy, queued, slots;
    size_t kv_used, kv_total;
} srv_snapshot;
void srv_snapshot_get(srv_server *s, srv_snapshot *out);
void srv_count_request(srv_server *s, int route, int status);

/* ---- server_choices.c: the answer of n > 1 choices ------------------------- */
typedef struct srv_choices srv_choices;
/* Takes the n requests (released at srv_choices_free) and echo (completions: the prompt's text
 * the choices start with, or NULL); NULL when out of memory (the requests are then cancelled). */
srv_choices *srv_choices_new(srv_server *s, const kvq_tokenizer *tok, const char *model, srv_req **r, int n, char *echo,
                             int include_usage);
/* With tools (not streamed): each choice's reply is parsed for calls, after prefill (taken). */
void srv_choices_tools(srv_choices *c, const kvq_chat_template *t, char *prefill);
/* Not streamed: waits for every choice; the answer, or NULL with e filled (e->status 0: gone(arg)
 * said the client left). */
struct cJSON *srv_choices_wait(srv_choices *c, int (*gone)(void *), void *arg, srv_error *e);
/* Streamed: up to max bytes of the next events; 0 at the end, -1 when the client left. */
long srv_choices_stream(srv_choices *c, char *buf, size_t max, int (*gone)(void *), void *arg);
void srv_choices_free(srv_choices *c);

/* ---- server_sse.c: server-sent events --------------------------------------- */
/* {"error": {message, type, code}}, as every error answer and a failed stream's last event. */
struct cJSON *srv_error_json(const srv_error *e);
/* Appends "data: <j>\n\n"; takes j. */
void srv_sse_event(srv_buf *out, struct cJSON *j);
/* A stream's end: err's event when err->status is set (err may be NULL), else with include_usage
 * (head: the chunk's envelope, NULL without it) head + an empty "choices", timings (may be NULL)
 * and usage as one chunk; then data: [DONE]. Takes head, timings and usage. */
void srv_sse_end(srv_buf *out, const srv_error *err, struct cJSON *head, struct cJSON *timings, struct cJSON *usage);

/* ---- server_embeddings.c: POST /v1/embeddings ------------------------------ */
/* The answer, or NULL with e filled. Runs on the scheduler thread between steps. */
struct cJSON *srv_embeddings(srv_server *s, const char *model_name, const char *body, size_t len, srv_error *e);

/* ---- server_metrics.c ------------------------------------------------------ */
enum { SRV_ROUTE_CHAT, SRV_ROUTE_COMPLETION, SRV_ROUTE_MODELS, SRV_ROUTE_HEALTH, SRV_ROUTE_TOKENIZE,
       SRV_ROUTE_DETOKENIZE, SRV_ROUTE_METRICS, SRV_ROUTE_UI, SRV_ROUTE_SLOTS, SRV_ROUTE_EMBEDDINGS, SRV_N_ROUTES };
/* Prometheus text exposition of a snapshot; malloc'd. */
char *srv_metrics_text(const srv_snapshot *sn);
/* GET /stats: the snapshot's counters as JSON. */
struct cJSON *srv_stats_json(const srv_snapshot *sn);

/* ---- server_http.c --------------------------------------------------------- */
typedef struct srv_http srv_http;
/* Binds host:port (0: ephemeral) and serves; *bound_port gets the port. */
int srv_http_start(srv_http **out, srv_server *s, const srv_opts *o, const char *model_name,
                   const kvq_chat_template *tmpl, int *bound_port);
/* Stops accepting connections (the listening socket closes). */
void srv_http_quiesce(srv_http *h);
/* Waits up to `seconds` for the requests begun to be answered to their end. */
void srv_http_drain(srv_http *h, double seconds);
/* Closes the open connections and frees the daemon. */
void srv_http_stop(srv_http *h);

/* ---- the embedded page (generated from server_ui.html at build time) ------- */
extern const unsigned char kvq_server_ui[];
extern const size_t kvq_server_ui_len;

#endif
