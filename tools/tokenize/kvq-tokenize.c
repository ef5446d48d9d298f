/* kvq-tokenize: prints the token ids of a text (or, with --decode, each token
 * with the text it contributes); with --chat, of a conversation rendered by the
 * model's chat template. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kvq.h"

static const char *PROG = "kvq-tokenize";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvq-tokenize [-m DIR] (-p TEXT | -f FILE | --chat FILE) [--bos] [--decode]\n"
            "  -m DIR      model or tokenizer directory (default: the demo model), or ORG/NAME[:REV]\n"
            "              (alias -hf): from the Hugging Face cache, else its config and tokenizer downloaded\n"
            "  -p TEXT     text to tokenize\n"
            "  -f FILE     read the text from FILE\n"
            "  --bos       prepend the BOS token when the tokenizer has one\n"
            "  --decode    print one line per token: id, then the text it adds (C-escaped)\n"
            "  --chat FILE       FILE is a JSON list of {\"role\", \"content\"} messages: tokenize them as\n"
            "                    rendered by the chat template (BOS as the template puts it)\n"
            "  --no-generation-prompt   with --chat: leave out the assistant header at the end\n"
            "  --chat-template NAME     with --chat: template family instead of the model's\n"
            "  --show-text       with --chat: print the rendered text instead of ids\n"
            "  --version   print the version\n"
            "Prints the ids on one line, separated by spaces.\n");
}

/* Prints s with control characters, quotes and backslashes escaped. */
static void print_escaped(const char *s, int n) {
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7F) printf("\\x%02x", c);
        else putchar(c);
    }
}

static int read_text(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int err = !buf || ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* Renders the JSON message list in path with dir's chat template into *out (malloc'd). */
static int render_chat(const char *dir, const char *path, const char *tmpl_name, int gen, char **out) {
    char *json;
    size_t len;
    if (read_text(path, &json, &len)) return kvq_tool_die(PROG, "%s: cannot read", path);
    cJSON *root = cJSON_ParseWithLength(json, len);
    free(json);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return kvq_tool_die(PROG, "%s: not a JSON list of messages", path);
    }
    int n = cJSON_GetArraySize(root), rc = 1;
    kvq_chat_msg *msgs = calloc((size_t)n + 1, sizeof *msgs);
    kvq_chat_template *t = NULL;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(root, i);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(r) || !cJSON_IsString(c)) {
            kvq_tool_die(PROG, "%s: message %d needs string \"role\" and \"content\"", path, i);
            goto done;
        }
        msgs[i] = (kvq_chat_msg){.role = r->valuestring, .content = c->valuestring};
    }
    if (kvq_chat_template_load(dir, tmpl_name, &t) != KVQ_OK) {
        kvq_tool_die(PROG, "%s", kvq_last_error());
        goto done;
    }
    int k = kvq_chat_render(t, msgs, n, gen, NULL, 0);
    if (k < 0 || !(*out = malloc((size_t)k + 1)) || kvq_chat_render(t, msgs, n, gen, *out, (size_t)k + 1) != k) {
        kvq_tool_die(PROG, "%s: %s", path, k < 0 ? kvq_last_error() : "out of memory");
        goto done;
    }
    rc = 0;
done:
    kvq_chat_template_free(t);
    free(msgs);
    cJSON_Delete(root);
    return rc;
}

int main(int argc, char **argv) {
    if (kvq_tool_version(PROG, argc, argv)) return 0;
    const char *dir = NULL, *text = NULL, *file = NULL, *chat = NULL, *tmpl = NULL;
    int bos = 0, decode = 0, gen = 1, show_text = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--bos")) {
            bos = 1;
        } else if (!strcmp(a, "--decode")) {
            decode = 1;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen = 0;
        } else if (!strcmp(a, "--show-text")) {
            show_text = 1;
        } else if (!strcmp(a, "--chat") || !strcmp(a, "--chat-template")) {
            if (i + 1 >= argc) return kvq_tool_die(PROG, "%s needs a value (see --help)", a);
            *(strcmp(a, "--chat") ? &tmpl : &chat) = argv[++i];
        } else if (kvq_tool_is_model_flag(a) || !strcmp(a, "-p") || !strcmp(a, "-f")) {
            if (i + 1 >= argc) return kvq_tool_die(PROG, "%s needs a value (see --help)", a);
            const char **dst = kvq_tool_is_model_flag(a) ? &dir : a[1] == 'p' ? &text : &file;
            *dst = argv[++i];
        } else {
            return kvq_tool_die(PROG, "unknown argument '%s' (see --help)", a);
        }
    }
    if (!!text + !!file + !!chat != 1) return kvq_tool_die(PROG, "give exactly one of -p TEXT, -f FILE or --chat FILE (see --help)");
    if (!dir && !(dir = kvq_tool_demo_model()))
        return kvq_tool_die(PROG, "no -m DIR given and no demo model found");
    if (kvq_tool_model_dir(PROG, &dir, 0)) return 1; /* the tokenizer needs no weights */

    char *buf = NULL;
    size_t len;
    if (chat) {
        if (render_chat(dir, chat, tmpl, gen, &buf)) return 1;
        if (show_text) {
            fputs(buf, stdout);
            free(buf);
            return 0;
        }
        text = buf;
        len = strlen(buf);
        bos = 0; /* the template placed it */
    } else if (file) {
        if (read_text(file, &buf, &len)) return kvq_tool_die(PROG, "%s: cannot read: %s", file, strerror(errno));
        text = buf;
    } else {
        len = strlen(text);
    }
    kvq_tokenizer *tok;
    if (kvq_tokenizer_load(dir, &tok) != KVQ_OK) {
        free(buf);
        return kvq_tool_die(PROG, "%s", kvq_last_error());
    }
    int rc = 1;
    int32_t *ids = NULL;
    int n = kvq_tokenize(tok, text, len, bos, NULL, 0);
    if (n >= 0 && !(ids = malloc(((size_t)n + 1) * sizeof *ids))) {
        kvq_tool_die(PROG, "out of memory");
        goto out;
    }
    if (n < 0 || kvq_tokenize(tok, text, len, bos, ids, n) != n) {
        kvq_tool_die(PROG, "%s", kvq_last_error());
        goto out;
    }
    if (decode) {
        /* the streaming decoder shows exactly what each token adds, spaces included */
        kvq_detok *d = kvq_detok_new(tok, 0);
        char piece[4096];
        for (int i = 0; d && i <= n; i++) {
            int k = i < n ? kvq_detok_push(d, ids[i], piece, sizeof piece) : kvq_detok_flush(d, piece, sizeof piece);
            if (k < 0) {
                kvq_detok_free(d);
                kvq_tool_die(PROG, "%s", kvq_last_error());
                goto out;
            }
            if (i == n && !k) break;
            if (i < n) printf("%d\t\"", (int)ids[i]);
            else printf("(flush)\t\"");
            print_escaped(piece, k);
            printf("\"\n");
        }
        if (!d) {
            kvq_tool_die(PROG, "%s", kvq_last_error());
            goto out;
        }
        kvq_detok_free(d);
    } else {
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
    }
    rc = 0;
out:
    free(ids);
    free(buf);
    kvq_tokenizer_free(tok);
    return rc;
}
