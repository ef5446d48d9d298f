/* kvq-chat internals: options, the conversation session (chat_session.c),
 * line input (chat_input.c) and the /commands (chat_cmds.c). */
#ifndef KVQ_TOOLS_CHAT_H
#define KVQ_TOOLS_CHAT_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "kvq.h"

extern const char *CHAT_PROG;

typedef struct {
    const char *model, *prompt, *prompt_file, *logits_out, *backend, *device, *chat_template, *system, *prompt_cache;
    const char *json_schema; /* --json-schema FILE */
    int json;                /* --json: any JSON object */
    long n_predict; /* -1: until end of turn or context; -2: not given */
    long n_ctx, n_batch, threads, keep, seed;
    kvq_sampler_params sp;
    int type_k, type_v, kv_rotate, print_ids, verbose_prompt, no_display_prompt, chat, ignore_eos, aqlm_cb8, aqlm_lut8, aqlm_i8, exact, plan;
    int ngl; /* -ngl: layers on the GPU backend, -1 all */
    const char *draft;        /* --draft DIR */
    long lookup, draft_max;   /* --lookup N (0: off), --draft-max K (0: the library's default) */
    double draft_min_p;       /* --draft-min-p P */
} chat_opts;

/* Speculative generation (chat_spec.c), with --draft or --lookup. */
#define CHAT_SPEC_BUF 80
typedef struct {
    kvq_model *dm;
    kvq_context *dc;
    kvq_spec *sp;
    int32_t buf[CHAT_SPEC_BUF]; /* a step's tokens, handed out from at */
    int n_buf, at;
} chat_spec;
/* Loads the draft (its vocabulary checked against target's) and starts kvq_spec on the empty tgt. */
int chat_spec_open(chat_spec *cs, const chat_opts *o, const kvq_model_params *mp, kvq_model *target, kvq_context *tgt);
void chat_spec_close(chat_spec *cs);
/* The target's cache holds ids[0..n) with ids[n-1]'s logits: generation continues from them. */
int chat_spec_start(chat_spec *cs, const int32_t *ids, int n);
int chat_spec_empty(const chat_spec *cs);
/* The next token (at most `left` more are wanted, <= 0: no limit), or -1 on error (printed). */
int32_t chat_spec_next(chat_spec *cs, kvq_sampler *s, long left);
/* Makes c hold exactly ids[0..n): drops what a step kept past them, evaluates the pending one. */
int chat_spec_settle(chat_spec *cs, kvq_context *c, const int32_t *ids, int n);
/* "drafted D, accepted A (accept rate R%)" after prefix, no newline. */
void chat_spec_print(const chat_spec *cs, FILE *f, const char *prefix);

/* Set by SIGINT (Ctrl-C); generation and prompt evaluation poll it. */
extern volatile sig_atomic_t chat_interrupted;
void chat_install_sigint(void);

typedef struct {
    char *role, *content;
} chat_msg;

typedef struct {
    const chat_opts *o;
    kvq_model *m;
    kvq_context *c;
    kvq_sampler *s;
    chat_spec *spec; /* NULL: plain decoding */
    kvq_chat_template *t;
    const kvq_tokenizer *tok;
    int plain; /* no template: running text */
    int n_ctx, n_vocab, color, tty;
    uint64_t seed;

    chat_msg *msgs; /* msgs[0] may be the system message */
    int n_msgs, cap_msgs;
    int32_t *ids; /* tokens in the KV cache, in order: n_ids == kvq_n_past(c) */
    int n_ids, cap_ids;
    int32_t *pin; /* --keep: tokens kept through context shifts, at position pin_at */
    int n_pin, pin_at;

    /* totals for /stats */
    double t_prompt, t_gen;
    long n_prompt_eval, n_gen;
    int n_shifts;
    int cache_saved; /* --prompt-cache written this run (after the first turn's prompt) */
} chat_session;

int chat_session_init(chat_session *S, const chat_opts *o, kvq_model *m, kvq_context *c);
void chat_session_free(chat_session *S);
/* One user turn: evaluates what is new, streams the reply to stdout (ending in
 * exactly one newline). Returns 0, or 1 on a fatal error (message printed). */
int chat_turn(chat_session *S, const char *text);
void chat_reset(chat_session *S);
/* Replaces (or with NULL removes) the system message. */
int chat_set_system(chat_session *S, const char *text);
/* The KV cache to / from a session file (kvq_context_save/restore) with the tokens it holds;
 * a refused file is a notice, and the cache stays as it was. Returns 0 when done. */
int chat_cache_save(chat_session *S, const char *path);
int chat_cache_restore(chat_session *S, const char *path);
/* /save and /load: the conversation as a JSON list of {"role", "content"}, and its KV cache
 * beside it in FILE.kvq (restored by /load when it matches the model and cache types). */
int chat_save(const chat_session *S, const char *path);
int chat_load(chat_session *S, const char *path);
void chat_print_stats(const chat_session *S, FILE *f);
/* A dim one-line notice on stderr. */
void chat_notice(const chat_session *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Line input: libedit with history on a TTY, plain lines otherwise. */
typedef struct chat_input chat_input;
enum { CHAT_IN_LINE, CHAT_IN_EOF, CHAT_IN_INTR_EMPTY, CHAT_IN_INTR_TEXT };
chat_input *chat_input_open(int tty, int color);
/* *line is malloc'd (no trailing newline; continued lines joined with '\n'). */
int chat_input_read(chat_input *in, char **line);
void chat_input_close(chat_input *in);

/* Load progress bar on stderr (TTY only, after a second; chat_progress.c). */
typedef struct {
    pthread_t th;
    volatile int done;
    int running, shown;
    double total;
} chat_progress;
void chat_progress_start(chat_progress *p, const char *dir);
void chat_progress_stop(chat_progress *p);

/* Runs a /command; returns 0 to go on, 1 to quit, 2 on a fatal error. */
int chat_command(chat_session *S, const char *line);

#endif
