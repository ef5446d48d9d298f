/* Chat templates: the families whose HF Jinja templates we render, recognized
 * from the template text in tokenizer_config.json and reproduced in C (no Jinja
 * interpreter). Each renderer follows its HF template character for character,
 * including where BOS goes (as text: tokenizing the result matches it as the
 * special token, so the caller must not add another BOS) and where the template
 * raises (the render fails with the template's message). Within a family the
 * published revisions differ in small steps; set_variant() reads which from the
 * template text. tests/data/chat_templates/ keeps the published templates and
 * their Jinja renderings, which test_chat_template compares byte for byte. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_buf.h"
#include "chat_tools.h"
#include "util.h"

typedef enum { F_NONE, F_LLAMA2, F_LLAMA3, F_MISTRAL, F_CHATML, F_PHI3, F_GEMMA, F_COMMAND_R } family;

static const char *const FAMILY_NAMES[] = {"none", "llama2", "llama3", "mistral", "chatml", "phi3", "gemma", "command-r"};

/* The [INST] revisions of Mistral's templates. */
typedef enum {
    MISTRAL_V1,      /* v0.1/v0.2/Mixtral since 2024: ' [INST] ' ... ' [/INST]', system joins the first user turn */
    MISTRAL_V1_ORIG, /* the first v0.1/v0.2/Mixtral ones: '[INST] ' ... ' [/INST]', no system role */
    MISTRAL_V3,      /* v0.3: '[INST] ' ... '[/INST]', ' ' + trimmed reply, system joins the last message */
} mistral_style;

struct kvq_chat_template {
    family fam;
    char *bos, *eos;        /* token texts from tokenizer_config.json ("" when absent) */
    int use_bos;            /* "none": add_bos_token is not false */
    int gen_always;         /* the template appends the generation prompt unconditionally */
    int llama31;            /* Llama-3.1/3.2 system header with dates */
    int date_today;         /* 3.2: strftime_now(): today's date, else "26 Jul 2024" */
    mistral_style mistral;
    int eos_space;          /* Mistral v0.1's first template: eos_token + ' ' after a reply */
    int bos_prefix;         /* chatml / phi3 / gemma variants that start with {{ bos_token }} */
    int phi3_eos;           /* phi3: eos_token at the end when no generation prompt */
    int phi3_any_role;      /* Phi-3-small: '<|' + role + '|>' for every message */
    int phi3_no_system;     /* Phi-3 (first revisions): system messages are skipped */
    int phi3_skip_empty_system; /* Phi-3.5: a system message with empty content is skipped */
    int phi3_user_opens;    /* Phi-3 (first revisions): each user turn ends with '<|assistant|>\n' */
    int needs_first;        /* the template reads messages[0]: Jinja raises on an empty conversation */
    int gemma_sys_prefix;   /* Gemma 3: the system text opens the first user turn (else: raise) */
    const char *default_sys; /* chatml (Qwen): system message used when none is given */
    chat_tool_fmt tools;     /* the template's tool-call branches (chat_tools_render.c) */
};

/* ---- loading ---- */

const char *kvq_chat_template_detect(const char *text) {
    if (!text) return "none";
    if (strstr(text, "<|start_header_id|>")) return "llama3";
    if (strstr(text, "<|im_start|>")) return "chatml";
    /* Phi-3-small writes the tags from the role: '<|' + message['role'] + '|>' */
    if (strstr(text, "<|end|>") && (strstr(text, "<|user|>") || strstr(text, "'|>'"))) return "phi3";
    if (strstr(text, "<start_of_turn>")) return "gemma";
    if (strstr(text, "<|START_OF_TURN_TOKEN|>")) return "command-r";
    if (strstr(text, "[INST]")) return strstr(text, "<<SYS>>") ? "llama2" : "mistral";
    return NULL;
}

static int family_of(const char *name) {
    for (int i = 0; i < (int)(sizeof FAMILY_NAMES / sizeof *FAMILY_NAMES); i++)
        if (!strcmp(name, FAMILY_NAMES[i])) return i;
    return -1;
}

static const char *token_text(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(c) ? c->valuestring : "";
}

/* The template text: a string, or the "default" entry of a list of {name, template}. */
static const char *template_text(const cJSON *ct) {
    if (cJSON_IsString(ct)) return ct->valuestring;
    const cJSON *e;
    cJSON_ArrayForEach(e, ct) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name"), *t = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, "default") && cJSON_IsString(t)) return t->valuestring;
    }
    return NULL;
}

/* A list of templates with Command-R's "tool_use" entry (its Action: list of tool calls). */
static int has_tool_use(const cJSON *ct) {
    const cJSON *e;
    cJSON_ArrayForEach(e, ct) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name"), *t = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, "tool_use") && cJSON_IsString(t) && strstr(t->valuestring, "Action:") &&
            strstr(t->valuestring, "tool_calls"))
            return 1;
    }
    return 0;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    sbuf b = {0};
    char chunk[8192];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) put(&b, chunk, r);
    fclose(f);
    if (b.oom || !b.p) {
        free(b.p);
        return b.oom ? NULL : calloc(1, 1);
    }
    return b.p;
}

/* A Jinja string literal in either quote style: lit("[/INST]") matches '[/INST]' and "[/INST]". */
static int has_lit(const char *text, const char *s) {
    char q[128];
    snprintf(q, sizeof q, "'%s'", s);
    if (strstr(text, q)) return 1;
    snprintf(q, sizeof q, "\"%s\"", s);
    return strstr(text, q) != NULL;
}

static void set_variant(kvq_chat_template *t, const char *text) {
    if (!text) return;
    t->gen_always = t->fam == F_LLAMA3 && !strstr(text, "add_generation_prompt");
    t->llama31 = strstr(text, "Cutting Knowledge Date") != NULL;
    t->date_today = strstr(text, "strftime_now") != NULL;
    if (t->fam == F_MISTRAL) {
        if (has_lit(text, "[/INST]")) t->mistral = MISTRAL_V3; /* no space before [/INST] */
        else if (has_lit(text, " [INST] ")) t->mistral = MISTRAL_V1;
        else t->mistral = MISTRAL_V1_ORIG;
        t->eos_space = strstr(text, "eos_token + ' '") != NULL;
    }
    t->bos_prefix = strstr(text, "{{ bos_token }}") || strstr(text, "{{bos_token}}") || strstr(text, "{{- bos_token }}");
    if (t->fam == F_PHI3) {
        t->phi3_eos = strstr(text, "eos_token") != NULL;
        t->phi3_any_role = !strstr(text, "<|user|>");
        t->phi3_user_opens = !strstr(text, "add_generation_prompt");
        t->phi3_no_system = !strstr(text, "'system'");
        t->phi3_skip_empty_system = strstr(text, "'system' and message['content']") != NULL;
    }
    t->gemma_sys_prefix = t->fam == F_GEMMA && strstr(text, "first_user_prefix");
    if (strstr(text, "tool_calls")) {
        if (t->fam == F_LLAMA3 && t->llama31) t->tools = TOOLS_LLAMA3;
        else if (t->fam == F_MISTRAL && strstr(text, "[TOOL_CALLS]")) t->tools = TOOLS_MISTRAL;
        else if (t->fam == F_CHATML && strstr(text, "<tool_call>")) t->tools = TOOLS_QWEN;
    }
    /* (Qwen2's chatml reads messages[0] only inside the loop over the messages; Qwen2.5's before it) */
    t->needs_first = (t->fam != F_CHATML || t->tools) && strstr(text, "messages[0]") != NULL;
    if (strstr(text, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."))
        t->default_sys = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    else if (strstr(text, "You are a helpful assistant.") && t->fam == F_CHATML)
        t->default_sys = "You are a helpful assistant.";
}

kvq_status kvq_chat_template_load(const char *dir, const char *name, kvq_chat_template **out) {
    if (!dir || !out) return kvq_fail(KVQ_ERR_ARG, "kvq_chat_template_load: no directory given");
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *cfg = NULL;
    char *text = read_all(path);
    if (text) {
        cfg = cJSON_Parse(text);
        free(text);
        if (!cfg) return kvq_fail(KVQ_ERR_FORMAT, "%s: not valid JSON", path);
    }
    kvq_chat_template *t = calloc(1, sizeof *t);
    char *jinja = NULL;
    kvq_status st = KVQ_OK;
    if (!t) {
        st = kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        goto out;
    }
    const char *bos = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
    const char *eos = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
    t->bos = strdup(bos);
    t->eos = strdup(eos);
    t->use_bos = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token")) && *bos;
    const char *tt = template_text(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"));
    if (!tt) {
        /* newer transformers keep the template in its own file */
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        tt = jinja = read_all(path);
    }
    if (!t->bos || !t->eos) {
        st = kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        goto out;
    }
    const char *fam = name;
    if (!fam) {
        fam = kvq_chat_template_detect(tt);
        if (!fam) {
            st = kvq_fail(KVQ_ERR_UNSUPPORTED, "%s/tokenizer_config.json: chat_template not recognized (give --chat-template NAME)", dir);
            goto out;
        }
    }
    int f = family_of(fam);
    if (f < 0) {
        st = kvq_fail(KVQ_ERR_ARG, "unknown chat template '%s' (none, llama2, llama3, mistral, chatml, phi3, gemma, command-r)", fam);
        goto out;
    }
    t->fam = (family)f;
    /* when only the name is given: as the family's published template */
    t->phi3_eos = 1;                    /* Phi-3-mini */
    t->bos_prefix = t->fam == F_GEMMA;  /* gemma-2b-it / gemma-7b-it */
    t->needs_first = t->fam == F_LLAMA2 || t->fam == F_MISTRAL || t->fam == F_GEMMA || t->fam == F_COMMAND_R;
    /* variant flags only from a template of the same family */
    if (tt && name && kvq_chat_template_detect(tt) && !strcmp(kvq_chat_template_detect(tt), name)) set_variant(t, tt);
    else if (tt && !name) set_variant(t, tt);
    /* Command-R keeps its tool branch in a second template of the list ("tool_use") */
    if (t->fam == F_COMMAND_R && has_tool_use(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"))) t->tools = TOOLS_COMMAND_R;
out:
    free(jinja);
    cJSON_Delete(cfg);
    if (st) {
        kvq_chat_template_free(t);
        return st;
    }
    *out = t;
    return KVQ_OK;
}

void kvq_chat_template_free(kvq_chat_template *t) {
    if (!t) return;
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *kvq_chat_template_name(const kvq_chat_template *t) { return t ? FAMILY_NAMES[t->fam] : "none"; }

/* ---- renderers ---- */

static int is(const kvq_chat_msg *m, const char *role) { return m->role && !strcmp(m->role, role); }

static int refuse(const char *msg) {
    kvq_fail(KVQ_ERR_ARG, "chat template: %s", msg);
    return -1;
}

#define ALTERNATE "Conversation roles must alternate user/assistant/user/assistant/..."
#define ALTERNATE_AFTER_SYS "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."

/* The templates' check: {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %} raise.
 * (A role other than user or assistant passes it at an odd index.) */
static int alternates(const kvq_chat_msg *m, int n) {
    for (int i = 0; i < n; i++)
        if (is(&m[i], "user") != (i % 2 == 0)) return 0;
    return 1;
}

static int render_llama2(const kvq_chat_template *t, const kvq_chat_msg *m, int n, sbuf *b) {
    const char *sys = NULL;
    if (n && is(&m[0], "system")) sys = m[0].content, m++, n--;
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "user") != (i % 2 == 0)) return refuse(ALTERNATE);
        sbuf c = {0};
        if (i == 0 && sys) {
            puts_(&c, "<<SYS>>\n");
            puts_(&c, sys);
            puts_(&c, "\n<</SYS>>\n\n");
        }
        puts_(&c, m[i].content);
        if (c.oom) return -1;
        if (is(&m[i], "user")) {
            puts_(b, t->bos);
            puts_(b, "[INST] ");
            put_strip(b, c.p ? c.p : "");
            puts_(b, " [/INST]");
        } else if (is(&m[i], "assistant")) {
            puts_(b, " ");
            put_strip(b, c.p ? c.p : "");
            puts_(b, " ");
            puts_(b, t->eos);
        } /* other roles: nothing */
        free(c.p);
    }
    return 0;
}

static int render_mistral(const kvq_chat_template *t, const kvq_chat_msg *m, int n, sbuf *b) {
    const char *sys = NULL;
    if (t->mistral != MISTRAL_V1_ORIG && n && is(&m[0], "system")) sys = m[0].content, m++, n--;
    if (!alternates(m, n)) return refuse(t->mistral == MISTRAL_V1_ORIG ? ALTERNATE : ALTERNATE_AFTER_SYS);
    puts_(b, t->bos);
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "user")) {
            /* v1: the system text opens the first user turn; v0.3: it joins the last message
             * of the conversation when that is a user turn, and is left out otherwise */
            int with_sys = sys && (t->mistral == MISTRAL_V3 ? i == n - 1 : i == 0);
            puts_(b, t->mistral == MISTRAL_V1 ? " [INST] " : "[INST] ");
            if (with_sys) {
                puts_(b, sys);
                puts_(b, "\n\n");
            }
            puts_(b, m[i].content);
            puts_(b, t->mistral == MISTRAL_V3 ? "[/INST]" : " [/INST]");
        } else if (is(&m[i], "assistant")) {
            if (t->mistral == MISTRAL_V3) {
                puts_(b, " ");
                put_strip(b, m[i].content);
            } else {
                if (t->mistral == MISTRAL_V1) puts_(b, " ");
                puts_(b, m[i].content);
            }
            puts_(b, t->eos);
            if (t->eos_space) puts_(b, " ");
        } else {
            return refuse(t->mistral == MISTRAL_V1_ORIG
                             ? "Only user and assistant roles are supported!"
                             : "Only user and assistant roles are supported, with the exception of an initial optional system message!");
        }
    }
    return 0;
}

static void put_header(sbuf *b, const char *role) {
    puts_(b, "<|start_header_id|>");
    puts_(b, role);
    puts_(b, "<|end_header_id|>\n\n");
}

/* Llama 3.1 / 3.2's "Today Date". */
static void llama_date(const kvq_chat_template *t, char date[32]) {
    strcpy(date, "26 Jul 2024");
    if (t->date_today) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm); /* Python's datetime.now() */
        strftime(date, 32, "%d %b %Y", &tm);
    }
}

static int render_llama3(const kvq_chat_template *t, const kvq_chat_msg *m, int n, int gen, sbuf *b) {
    if (t->llama31) {
        /* 3.1 / 3.2: a system turn always, with the knowledge and today's dates */
        char date[32];
        llama_date(t, date);
        puts_(b, t->bos);
        put_header(b, "system");
        puts_(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
        puts_(b, date);
        puts_(b, "\n\n");
        if (n && is(&m[0], "system")) put_strip(b, m[0].content), m++, n--;
        puts_(b, "<|eot_id|>");
    }
    for (int i = 0; i < n; i++) {
        if (i == 0 && !t->llama31) puts_(b, t->bos);
        put_header(b, m[i].role);
        put_strip(b, m[i].content);
        puts_(b, "<|eot_id|>");
    }
    if (gen || t->gen_always) put_header(b, "assistant");
    return 0;
}

static int render_chatml(const kvq_chat_template *t, const kvq_chat_msg *m, int n, int gen, sbuf *b) {
    if (t->bos_prefix) puts_(b, t->bos);
    /* Qwen: {% if loop.first and messages[0]['role'] != 'system' %} (inside the loop) */
    if (t->default_sys && n && !is(&m[0], "system")) {
        puts_(b, "<|im_start|>system\n");
        puts_(b, t->default_sys);
        puts_(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, m[i].role);
        puts_(b, "\n");
        puts_(b, m[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (gen) puts_(b, "<|im_start|>assistant\n");
    return 0;
}

static int render_phi3(const kvq_chat_template *t, const kvq_chat_msg *m, int n, int gen, sbuf *b) {
    if (t->bos_prefix) puts_(b, t->bos);
    for (int i = 0; i < n; i++) {
        if (t->phi3_any_role) { /* Phi-3-small: '<|' + message['role'] + '|>' */
            puts_(b, "<|");
            puts_(b, m[i].role);
            puts_(b, "|>\n");
        } else if (is(&m[i], "system")) {
            if (t->phi3_no_system || (t->phi3_skip_empty_system && !*m[i].content)) continue;
            puts_(b, "<|system|>\n");
        } else if (is(&m[i], "user")) {
            puts_(b, "<|user|>\n");
        } else if (is(&m[i], "assistant")) {
            if (!t->phi3_user_opens) puts_(b, "<|assistant|>\n"); /* else the user turn opened it */
        } else {
            continue; /* the templates skip other roles */
        }
        puts_(b, m[i].content);
        puts_(b, "<|end|>\n");
        if (t->phi3_user_opens && !t->phi3_any_role && is(&m[i], "user")) puts_(b, "<|assistant|>\n");
    }
    if (t->phi3_user_opens) return 0; /* no add_generation_prompt in those templates */
    if (gen) puts_(b, "<|assistant|>\n");
    else if (t->phi3_eos) puts_(b, t->eos);
    return 0;
}

static int render_gemma(const kvq_chat_template *t, const kvq_chat_msg *m, int n, int gen, sbuf *b) {
    const char *sys = NULL;
    if (n && is(&m[0], "system")) {
        if (!t->gemma_sys_prefix) return refuse("System role not supported");
        sys = m[0].content, m++, n--;
    }
    if (t->bos_prefix) puts_(b, t->bos);
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "user") != (i % 2 == 0)) return refuse(ALTERNATE);
        puts_(b, "<start_of_turn>");
        puts_(b, is(&m[i], "assistant") ? "model" : m[i].role);
        puts_(b, "\n");
        if (i == 0 && sys) { /* Gemma 3: the system text opens the first turn */
            puts_(b, sys);
            puts_(b, "\n\n");
        }
        put_strip(b, m[i].content);
        puts_(b, "<end_of_turn>\n");
    }
    if (gen) puts_(b, "<start_of_turn>model\n");
    return 0;
}

static int render_command_r(const kvq_chat_template *t, const kvq_chat_msg *m, int n, int gen, sbuf *b) {
    puts_(b, t->bos);
    if (n && is(&m[0], "system")) {
        puts_(b, "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>");
        puts_(b, m[0].content);
        puts_(b, "<|END_OF_TURN_TOKEN|>");
        m++, n--;
    }
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "user") != (i % 2 == 0)) return refuse(ALTERNATE);
        if (!is(&m[i], "user") && !is(&m[i], "assistant")) continue; /* other roles: nothing */
        puts_(b, is(&m[i], "user") ? "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>" : "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        put_strip(b, m[i].content);
        puts_(b, "<|END_OF_TURN_TOKEN|>");
    }
    if (gen) puts_(b, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
    return 0;
}

/* No template: the running text. Each user or system message starts on a new line;
 * replies continue the text as generated. */
static int render_none(const kvq_chat_template *t, const kvq_chat_msg *m, int n, sbuf *b) {
    if (t->use_bos) puts_(b, t->bos);
    size_t start = b->n;
    for (int i = 0; i < n; i++) {
        if (!is(&m[i], "assistant") && b->n > start && b->p[b->n - 1] != '\n') puts_(b, "\n");
        puts_(b, m[i].content);
    }
    return 0;
}

const char *kvq_chat_template_tools(const kvq_chat_template *t) {
    static const char *const NAMES[] = {NULL, "llama3-json", "mistral", "qwen", "command-r"};
    return t ? NAMES[t->tools] : NULL;
}

int kvq_chat_render(const kvq_chat_template *t, const kvq_chat_msg *msgs, int n, int add_generation_prompt, char *out,
                    size_t size) {
    return kvq_chat_render_tools(t, msgs, n, NULL, add_generation_prompt, out, size);
}

int kvq_chat_render_tools(const kvq_chat_template *t, const kvq_chat_msg *msgs, int n, const char *tools_json,
                          int add_generation_prompt, char *out, size_t size) {
    if (!t || n < 0 || (n && !msgs)) return kvq_fail(KVQ_ERR_ARG, "kvq_chat_render: bad arguments"), -1;
    for (int i = 0; i < n; i++) /* a reply that is only tool calls may have no content */
        if ((!msgs[i].content && !msgs[i].tool_calls) || !msgs[i].role)
            return kvq_fail(KVQ_ERR_ARG, "kvq_chat_render: message %d has no role or content", i), -1;
    sbuf b = {0};
    puts_(&b, "");
    int r = 0, gen = add_generation_prompt;
    if (!n && t->needs_first) {
        free(b.p);
        kvq_fail(KVQ_ERR_ARG, "chat template: list object has no element 0 (the template reads the first message)");
        return -1;
    }
    if (tools_json || chat_has_tool_msgs(msgs, n)) {
        char date[32];
        llama_date(t, date);
        chat_tool_tmpl tt = {t->tools, t->bos, t->eos, date, t->default_sys};
        r = chat_render_tools(&tt, msgs, n, tools_json, gen, &b);
    } else switch (t->fam) {
    case F_NONE: r = render_none(t, msgs, n, &b); break;
    case F_LLAMA2: r = render_llama2(t, msgs, n, &b); break;
    case F_LLAMA3: r = render_llama3(t, msgs, n, gen, &b); break;
    case F_MISTRAL: r = render_mistral(t, msgs, n, &b); break;
    case F_CHATML: r = render_chatml(t, msgs, n, gen, &b); break;
    case F_PHI3: r = render_phi3(t, msgs, n, gen, &b); break;
    case F_GEMMA: r = render_gemma(t, msgs, n, gen, &b); break;
    case F_COMMAND_R: r = render_command_r(t, msgs, n, gen, &b); break;
    }
    if (b.oom) {
        kvq_fail(KVQ_ERR_NOMEM, "out of memory");
        r = -1;
    }
    if (r) {
        free(b.p);
        return -1;
    }
    if (out && size) {
        size_t k = b.n < size - 1 ? b.n : size - 1;
        memcpy(out, b.p, k);
        out[k] = 0;
    }
    int len = b.n > 0x7fffffff ? -1 : (int)b.n;
    free(b.p);
    if (len < 0) kvq_fail(KVQ_ERR_ARG, "kvq_chat_render: rendered text too long");
    return len;
}
