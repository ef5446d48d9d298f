/* kvq-chat /commands, /stats and the JSON conversation files of /save and /load. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"

static const char HELP[] =
    "  /help           this list\n"
    "  /reset          forget the conversation (the system message stays)\n"
    "  /stats          speeds, tokens in context, KV cache bytes, backend, threads, seed\n"
    "  /system [TEXT]  set (or with no TEXT, remove) the system message\n"
    "  /save FILE      write the conversation as a JSON list of {\"role\", \"content\"},\n"
    "                  and its KV cache to FILE.kvq\n"
    "  /load FILE      read a conversation written by /save (or any such list), and FILE.kvq\n"
    "                  when there: no need to evaluate the conversation again\n"
    "  /quit           exit (as do Ctrl-D, and Ctrl-C at an empty prompt)\n"
    "  A line ending in \\ continues on the next line. Ctrl-C stops a reply.\n";

/* Bytes per 32 cached values of each type, to split the cache bytes into K and V. */
static double group_bytes(int t) {
    switch (t) {
    case KVQ_CACHE_F32: return 128;
    case KVQ_CACHE_F16: return 64;
    case KVQ_CACHE_Q8: return 34;
    default: return 18;
    }
}

void chat_print_stats(const chat_session *S, FILE *f) {
    const chat_opts *o = S->o;
    double used = (double)kvq_kv_bytes_used(S->c), total = (double)kvq_kv_bytes_total(S->c);
    double bk = group_bytes(o->type_k), bv = group_bytes(o->type_v), fk = bk / (bk + bv);
    fprintf(f, "prompt: %ld tokens evaluated in %.2f s (%.1f tok/s)\n", S->n_prompt_eval, S->t_prompt,
            S->t_prompt > 0 ? S->n_prompt_eval / S->t_prompt : 0.0);
    fprintf(f, "generation: %ld tokens in %.2f s (%.1f tok/s)", S->n_gen, S->t_gen, S->t_gen > 0 ? S->n_gen / S->t_gen : 0.0);
    if (S->spec) chat_spec_print(S->spec, f, "; speculative: ");
    fputc('\n', f);
    fprintf(f, "context: %d of %d tokens, %d messages, %d context shift(s)%s\n", S->n_ids, S->n_ctx, S->n_msgs, S->n_shifts,
            S->n_pin ? " (--keep tokens pinned)" : "");
    fprintf(f, "KV cache: K %s %.2f MiB + V %s %.2f MiB in use, %.2f MiB allocated\n",
            kvq_cache_type_name((kvq_cache_type)o->type_k), used * fk / (1 << 20), kvq_cache_type_name((kvq_cache_type)o->type_v),
            used * (1 - fk) / (1 << 20), total / (1 << 20));
    fprintf(f, "backend: %s, threads %ld, template %s\n", kvq_model_backend_name(S->m),
            o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN), kvq_chat_template_name(S->t));
    fprintf(f, "sampling: seed %llu, temp %.2f, top-k %d, top-p %.2f, min-p %.2f, repeat-penalty %.2f (last %d)\n",
            (unsigned long long)S->seed, o->sp.temp, o->sp.top_k, o->sp.top_p, o->sp.min_p, o->sp.repeat_penalty,
            o->sp.repeat_last_n);
}

int chat_save(const chat_session *S, const char *path) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < S->n_msgs; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", S->msgs[i].role);
        cJSON_AddStringToObject(m, "content", S->msgs[i].content);
        cJSON_AddItemToArray(arr, m);
    }
    char *text = arr ? cJSON_Print(arr) : NULL;
    cJSON_Delete(arr);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    if (!ok) chat_notice(S, "%s: cannot write", path);
    return ok ? 0 : -1;
}

int chat_load(chat_session *S, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        chat_notice(S, "%s: cannot read", path);
        return -1;
    }
    char *buf = NULL;
    size_t cap = 0, n = 0, r;
    for (;;) {
        if (n + 4096 > cap) {
            char *b = realloc(buf, cap = cap * 2 + 8192);
            if (!b) break;
            buf = b;
        }
        if ((r = fread(buf + n, 1, cap - n, f)) == 0) break;
        n += r;
    }
    fclose(f);
    cJSON *arr = buf ? cJSON_ParseWithLength(buf, n) : NULL;
    free(buf);
    const cJSON *e;
    int valid = cJSON_IsArray(arr);
    cJSON_ArrayForEach(e, arr) {
        const cJSON *ro = cJSON_GetObjectItemCaseSensitive(e, "role"), *co = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(ro) || !cJSON_IsString(co)) valid = 0;
    }
    if (!valid) {
        cJSON_Delete(arr);
        chat_notice(S, "%s: not a JSON list of {\"role\", \"content\"} messages", path);
        return -1;
    }
    chat_set_system(S, NULL);
    chat_reset(S);
    int count = 0;
    cJSON_ArrayForEach(e, arr) {
        const char *role = cJSON_GetObjectItemCaseSensitive(e, "role")->valuestring;
        const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        if (!strcmp(role, "system") && count == 0) chat_set_system(S, content);
        else {
            /* appended as they are; the next turn evaluates them */
            chat_msg *m = realloc(S->msgs, sizeof *m * (size_t)(S->n_msgs + 1));
            if (!m) break;
            S->msgs = m;
            S->cap_msgs = S->n_msgs + 1;
            S->msgs[S->n_msgs].role = strdup(role);
            S->msgs[S->n_msgs].content = strdup(content);
            if (!S->msgs[S->n_msgs].role || !S->msgs[S->n_msgs].content) break;
            S->n_msgs++;
        }
        count++;
    }
    cJSON_Delete(arr);
    chat_notice(S, "loaded %d messages from %s", count, path);
    return 0;
}

static const char *arg_of(const char *line, const char *cmd) {
    size_t n = strlen(cmd);
    if (strncmp(line, cmd, n) || (line[n] && line[n] != ' ')) return NULL;
    const char *a = line + n;
    while (*a == ' ') a++;
    return a;
}

int chat_command(chat_session *S, const char *line) {
    const char *a;
    if ((a = arg_of(line, "/help"))) fputs(HELP, stderr);
    else if ((a = arg_of(line, "/quit")) || (a = arg_of(line, "/exit"))) return 1;
    else if ((a = arg_of(line, "/reset"))) {
        chat_reset(S);
        chat_notice(S, "conversation cleared%s", S->n_msgs ? " (system message kept)" : "");
    } else if ((a = arg_of(line, "/stats"))) chat_print_stats(S, stderr);
    else if ((a = arg_of(line, "/system"))) {
        if (chat_set_system(S, a)) return 2;
        chat_notice(S, *a ? "system message set" : "system message removed");
    } else if ((a = arg_of(line, "/save"))) {
        if (!*a) chat_notice(S, "/save needs a file name");
        else if (!chat_save(S, a)) {
            char kv[4096];
            snprintf(kv, sizeof kv, "%s.kvq", a);
            if (S->n_ids > 0 && !chat_cache_save(S, kv))
                chat_notice(S, "saved %d messages to %s, %d tokens of KV cache to %s", S->n_msgs, a, S->n_ids, kv);
            else
                chat_notice(S, "saved %d messages to %s", S->n_msgs, a);
        }
    } else if ((a = arg_of(line, "/load"))) {
        if (!*a) chat_notice(S, "/load needs a file name");
        else if (!chat_load(S, a)) {
            char kv[4096];
            snprintf(kv, sizeof kv, "%s.kvq", a);
            if (access(kv, F_OK) == 0) chat_cache_restore(S, kv); /* the next turn keeps what matches */
        }
    } else chat_notice(S, "unknown command '%s' (/help lists them)", line);
    return 0;
}
