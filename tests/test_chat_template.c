/* Chat templates: the rendered text equals what the HF Jinja templates render
 * (expected strings below were rendered from each family's HF template with
 * Jinja2 as transformers configures it), and `kvq-tokenize --chat` gives the ids
 * of that text for the llama2, llama3 and mistral tokenizers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq.h"
#include "testutil.h"

typedef struct {
    const char *family, *conv;
    int gen;
    const char *want;
} tcase;

/* The conversations: system text and contents carry stray whitespace on purpose
 * (templates differ in what they trim). */
static const kvq_chat_msg SYS = {"system", "You are a terse assistant.\n"};
static const kvq_chat_msg U1 = {"user", " What is 2+2? "};
static const kvq_chat_msg A1 = {"assistant", " It is 4.\n"};
static const kvq_chat_msg U2 = {"user", "And 3+3?"};

static int conv(const char *name, kvq_chat_msg *m) {
    int n = 0;
    if (!strncmp(name, "sys_", 4)) m[n++] = SYS, name += 4;
    m[n++] = U1;
    m[n++] = A1;
    if (!strcmp(name, "three")) m[n++] = U2;
    return n;
}

static const tcase CASES[] = {
    {"llama2", "two", 1, "<s>[INST] What is 2+2? [/INST] It is 4. </s>"},
    {"llama2", "two", 0, "<s>[INST] What is 2+2? [/INST] It is 4. </s>"},
    {"llama2", "three", 1, "<s>[INST] What is 2+2? [/INST] It is 4. </s><s>[INST] And 3+3? [/INST]"},
    {"llama2", "three", 0, "<s>[INST] What is 2+2? [/INST] It is 4. </s><s>[INST] And 3+3? [/INST]"},
    {"llama2", "sys_two", 1, "<s>[INST] <<SYS>>\nYou are a terse assistant.\n\n<</SYS>>\n\n What is 2+2? [/INST] It is 4. </s>"},
    {"llama2", "sys_two", 0, "<s>[INST] <<SYS>>\nYou are a terse assistant.\n\n<</SYS>>\n\n What is 2+2? [/INST] It is 4. </s>"},
    {"llama2", "sys_three", 1, "<s>[INST] <<SYS>>\nYou are a terse assistant.\n\n<</SYS>>\n\n What is 2+2? [/INST] It is 4. </s><s>[INST] And 3+3? [/INST]"},
    {"llama2", "sys_three", 0, "<s>[INST] <<SYS>>\nYou are a terse assistant.\n\n<</SYS>>\n\n What is 2+2? [/INST] It is 4. </s><s>[INST] And 3+3? [/INST]"},
    {"mistral", "two", 1, "<s> [INST]  What is 2+2?  [/INST]  It is 4.\n</s>"},
    {"mistral", "two", 0, "<s> [INST]  What is 2+2?  [/INST]  It is 4.\n</s>"},
    {"mistral", "three", 1, "<s> [INST]  What is 2+2?  [/INST]  It is 4.\n</s> [INST] And 3+3? [/INST]"},
    {"mistral", "three", 0, "<s> [INST]  What is 2+2?  [/INST]  It is 4.\n</s> [INST] And 3+3? [/INST]"},
    {"mistral", "sys_two", 1, "<s> [INST] You are a terse assistant.\n\n\n What is 2+2?  [/INST]  It is 4.\n</s>"},
    {"mistral", "sys_two", 0, "<s> [INST] You are a terse assistant.\n\n\n What is 2+2?  [/INST]  It is 4.\n</s>"},
    {"mistral", "sys_three", 1, "<s> [INST] You are a terse assistant.\n\n\n What is 2+2?  [/INST]  It is 4.\n</s> [INST] And 3+3? [/INST]"},
    {"mistral", "sys_three", 0, "<s> [INST] You are a terse assistant.\n\n\n What is 2+2?  [/INST]  It is 4.\n</s> [INST] And 3+3? [/INST]"},
    {"llama3", "two", 1, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama3", "two", 0, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama3", "three", 1, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama3", "three", 0, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama3", "sys_two", 1, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a terse assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama3", "sys_two", 0, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a terse assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama3", "sys_three", 1, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a terse assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama3", "sys_three", 0, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a terse assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"chatml", "two", 1, "<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml", "two", 0, "<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n"},
    {"chatml", "three", 1, "<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml", "three", 0, "<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"},
    {"chatml", "sys_two", 1, "<|im_start|>system\nYou are a terse assistant.\n<|im_end|>\n<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml", "sys_two", 0, "<|im_start|>system\nYou are a terse assistant.\n<|im_end|>\n<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n"},
    {"chatml", "sys_three", 1, "<|im_start|>system\nYou are a terse assistant.\n<|im_end|>\n<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml", "sys_three", 0, "<|im_start|>system\nYou are a terse assistant.\n<|im_end|>\n<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n It is 4.\n<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"},
    {"phi3", "two", 1, "<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|assistant|>\n"},
    {"phi3", "two", 0, "<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|endoftext|>"},
    {"phi3", "three", 1, "<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|user|>\nAnd 3+3?<|end|>\n<|assistant|>\n"},
    {"phi3", "three", 0, "<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|user|>\nAnd 3+3?<|end|>\n<|endoftext|>"},
    {"phi3", "sys_two", 1, "<|system|>\nYou are a terse assistant.\n<|end|>\n<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|assistant|>\n"},
    {"phi3", "sys_two", 0, "<|system|>\nYou are a terse assistant.\n<|end|>\n<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|endoftext|>"},
    {"phi3", "sys_three", 1, "<|system|>\nYou are a terse assistant.\n<|end|>\n<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|user|>\nAnd 3+3?<|end|>\n<|assistant|>\n"},
    {"phi3", "sys_three", 0, "<|system|>\nYou are a terse assistant.\n<|end|>\n<|user|>\n What is 2+2? <|end|>\n<|assistant|>\n It is 4.\n<|end|>\n<|user|>\nAnd 3+3?<|end|>\n<|endoftext|>"},
    {"gemma", "two", 1, "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\nIt is 4.<end_of_turn>\n<start_of_turn>model\n"},
    {"gemma", "two", 0, "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\nIt is 4.<end_of_turn>\n"},
    {"gemma", "three", 1, "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\nIt is 4.<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n"},
    {"gemma", "three", 0, "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\nIt is 4.<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n"},
    {"command-r", "two", 1, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"command-r", "two", 0, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|>"},
    {"command-r", "three", 1, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>And 3+3?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"command-r", "three", 0, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>And 3+3?<|END_OF_TURN_TOKEN|>"},
    {"command-r", "sys_two", 1, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a terse assistant.\n<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"command-r", "sys_two", 0, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a terse assistant.\n<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|>"},
    {"command-r", "sys_three", 1, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a terse assistant.\n<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>And 3+3?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"command-r", "sys_three", 0, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a terse assistant.\n<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>It is 4.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>And 3+3?<|END_OF_TURN_TOKEN|>"},
};
static const char *const BOSEOS[][3] = {
    {"llama2", "<s>", "</s>"},
    {"mistral", "<s>", "</s>"},
    {"llama3", "<|begin_of_text|>", "<|end_of_text|>"},
    {"chatml", "", "<|im_end|>"},
    {"phi3", "<s>", "<|endoftext|>"},
    {"gemma", "<bos>", "<eos>"},
    {"command-r", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"},
};

/* Directory whose tokenizer_config.json has only the family's bos/eos (the name selects the template). */
static const char *family_dir(const char *family) {
    if (!strcmp(family, "llama2") || !strcmp(family, "llama3") || !strcmp(family, "mistral")) {
        static char rel[64];
        snprintf(rel, sizeof rel, "tokenizers/%s", family);
        return tu_fixture(rel);
    }
    static char dir[1024];
    for (size_t i = 0; i < sizeof BOSEOS / sizeof *BOSEOS; i++) {
        if (strcmp(BOSEOS[i][0], family)) continue;
        snprintf(dir, sizeof dir, "%s/%s", tu_tmpdir(), family);
        mkdir(dir, 0755);
        char path[1200];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "{\"bos_token\": \"%s\", \"eos_token\": {\"content\": \"%s\"}}\n", BOSEOS[i][1], BOSEOS[i][2]);
        fclose(f);
        return dir;
    }
    return NULL;
}

static void test_render_matches_hf(void **state) {
    TU_NEED_FIXTURE(tu_fixture("tokenizers/llama3"));
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const tcase *c = &CASES[i];
        const char *dir = family_dir(c->family);
        assert_non_null(dir);
        kvq_chat_template *t;
        /* llama3's fixture carries the real template: recognize it from the text */
        const char *name = strcmp(c->family, "llama3") ? c->family : NULL;
        if (kvq_chat_template_load(dir, name, &t) != KVQ_OK) fail_msg("%s: %s", c->family, kvq_last_error());
        assert_string_equal(kvq_chat_template_name(t), c->family);
        kvq_chat_msg m[4];
        int n = conv(c->conv, m);
        char out[2048];
        int len = kvq_chat_render(t, m, n, c->gen, out, sizeof out);
        if (len != (int)strlen(c->want) || strcmp(out, c->want))
            fail_msg("%s %s gen=%d:\n got '%s'\nwant '%s'", c->family, c->conv, c->gen, out, c->want);
        /* a short buffer gets a NUL-terminated prefix and the full length */
        char small[8];
        assert_int_equal(kvq_chat_render(t, m, n, c->gen, small, sizeof small), len);
        assert_int_equal(strlen(small), 7);
        kvq_chat_template_free(t);
    }
}

static void test_detect(void **state) {
    assert_string_equal(kvq_chat_template_detect("{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}"), "llama2");
    assert_string_equal(kvq_chat_template_detect("{{ ' [INST] ' + message['content'] + ' [/INST]' }}"), "mistral");
    assert_string_equal(kvq_chat_template_detect("{{'<|im_start|>' + message['role'] + '\\n'}}"), "chatml");
    assert_string_equal(kvq_chat_template_detect("{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"), "phi3");
    assert_string_equal(kvq_chat_template_detect("{{ '<start_of_turn>' + role + '\\n' }}"), "gemma");
    assert_string_equal(kvq_chat_template_detect("{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' }}"), "command-r");
    assert_string_equal(kvq_chat_template_detect("{{ '<|start_header_id|>' + message['role'] }}"), "llama3");
    assert_string_equal(kvq_chat_template_detect(NULL), "none");
    assert_null(kvq_chat_template_detect("{{ messages[0]['content'] }}"));
}

static void test_roles_and_none(void **state) {
    const char *dir = family_dir("chatml"); /* any dir with bos/eos */
    kvq_chat_template *t;
    assert_int_equal(kvq_chat_template_load(dir, "llama2", &t), KVQ_OK);
    kvq_chat_msg two_users[2] = {U1, U2};
    assert_int_equal(kvq_chat_render(t, two_users, 2, 1, NULL, 0), -1);
    assert_non_null(strstr(kvq_last_error(), "alternate"));
    kvq_chat_template_free(t);
    assert_int_not_equal(kvq_chat_template_load(dir, "no-such-family", &t), KVQ_OK);
    /* no template: the running text, user messages on new lines, BOS as text */
    assert_int_equal(kvq_chat_template_load(family_dir("gemma"), NULL, &t), KVQ_OK);
    assert_string_equal(kvq_chat_template_name(t), "none");
    kvq_chat_msg run[4] = {{"user", "The jury said"}, {"assistant", " that the city"}, {"user", "It added"}, {"assistant", " more."}};
    char out[256];
    kvq_chat_render(t, run, 4, 1, out, sizeof out);
    assert_string_equal(out, "<bos>The jury said that the city\nIt added more.");
    kvq_chat_template_free(t);
}

/* ---- kvq-tokenize --chat ---- */

static char *tool(const char *args, int *st) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/%s", KVQ_TOOLS_DIR, args);
    return tu_run(cmd, st);
}

static const char *write_conv(const char *name) {
    static char path[1024];
    kvq_chat_msg m[4];
    int n = conv(name, m);
    snprintf(path, sizeof path, "%s/%s.json", tu_tmpdir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s{\"role\": \"%s\", \"content\": \"", i ? ", " : "", m[i].role);
        for (const char *p = m[i].content; *p; p++)
            if (*p == '\n') fputs("\\n", f);
            else fputc(*p, f);
        fputs("\"}", f);
    }
    fputs("]\n", f);
    fclose(f);
    return path;
}

static void test_tokenize_chat_ids(void **state) {
    TU_NEED_FIXTURE(tu_fixture("tokenizers/llama3"));
    const char *fams[] = {"llama2", "llama3", "mistral"};
    for (int fi = 0; fi < 3; fi++) {
        for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
            const tcase *c = &CASES[i];
            if (strcmp(c->family, fams[fi])) continue;
            char dir[1024], args[4096], conv_path[1024];
            snprintf(dir, sizeof dir, "%s", family_dir(c->family));
            snprintf(conv_path, sizeof conv_path, "%s", write_conv(c->conv));
            snprintf(args, sizeof args, "kvq-tokenize -m %s --chat %s %s%s", dir, conv_path,
                     fi == 1 ? "" : "--chat-template ", fi == 1 ? "" : c->family);
            if (!c->gen) strcat(args, " --no-generation-prompt");
            int st;
            char *got = tool(args, &st);
            assert_int_equal(st, 0);
            /* the expected text through the plain tokenizer (no BOS added: the text has it) */
            char text_path[1100];
            snprintf(text_path, sizeof text_path, "%s/want.txt", tu_tmpdir());
            FILE *f = fopen(text_path, "w");
            fputs(c->want, f);
            fclose(f);
            snprintf(args, sizeof args, "kvq-tokenize -m %s -f %s", dir, text_path);
            char *want = tool(args, &st);
            assert_int_equal(st, 0);
            if (strcmp(got, want)) fail_msg("%s %s gen=%d: ids '%s', want '%s'", c->family, c->conv, c->gen, got, want);
            /* exactly one BOS, at the start */
            const char *bos = fi == 1 ? "128000 " : "1 ";
            assert_true(!strncmp(got, bos, strlen(bos)));
            if (fi != 0) assert_null(strstr(got + 1, fi == 1 ? " 128000 " : " 1 "));
            free(got);
            free(want);
        }
    }
    /* spelled out: Llama-3 special ids around the three-turn conversation */
    char args[2048];
    int st;
    snprintf(args, sizeof args, "kvq-tokenize -m %s --chat %s", family_dir("llama3"), write_conv("three"));
    char *got = tool(args, &st);
    assert_string_equal(got, "128000 128006 882 128007 271 3923 374 220 17 10 17 30 128009 128006 78191 128007 271 2181 374 220 "
                             "19 13 128009 128006 882 128007 271 3112 220 18 10 18 30 128009 128006 78191 128007 271\n");
    free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_matches_hf), cmocka_unit_test(test_detect),
        cmocka_unit_test(test_roles_and_none),   cmocka_unit_test(test_tokenize_chat_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
