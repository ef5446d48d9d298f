/* Fuzz target: chat-template recognition and rendering. The input is read two
 * ways: as template text for kvq_chat_template_detect, and as a conversation:
 * byte 0 picks the family and the generation prompt, the rest is messages split
 * at NUL bytes, each message's first byte picking its role (system, user,
 * assistant or an unknown one). Rendering must either fail with one error line
 * or give the same text whatever the output buffer's size. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

static const char *const FAMILIES[] = {"none", "llama2", "llama3", "mistral", "chatml", "phi3", "gemma", "command-r"};
#define N_FAM (sizeof FAMILIES / sizeof FAMILIES[0])
static const char *const ROLES[] = {"system", "user", "assistant", "tool"};

/* One template per family, with the BOS/EOS texts of a real tokenizer_config.json. */
static kvq_chat_template **templates(void) {
    static kvq_chat_template *t[N_FAM];
    static int done;
    if (!done) {
        const char *dir = fz_tmpdir();
        static const char cfg[] = "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";
        fz_write(dir, "tokenizer_config.json", cfg, sizeof cfg - 1);
        for (size_t i = 0; i < N_FAM; i++)
            if (kvq_chat_template_load(dir, FAMILIES[i], &t[i]) != KVQ_OK) abort();
        done = 1;
    }
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = 0;
    kvq_chat_template_detect(text); /* any text: a family name or NULL, never a crash */
    if (size < 1) {
        free(text);
        return 0;
    }
    kvq_chat_template *t = templates()[(data[0] >> 1) % N_FAM];
    int gen = data[0] & 1;
    kvq_chat_msg msgs[64];
    int n = 0;
    for (size_t i = 1; i < size && n < 64;) {
        size_t end = i;
        while (end < size && text[end]) end++;
        msgs[n].role = ROLES[(unsigned char)text[i] % 4];
        msgs[n].content = text + i + 1 <= text + end ? text + i + 1 : text + end;
        msgs[n].tool_calls = msgs[n].tool_call_id = NULL;
        n++;
        i = end + 1;
    }
    int len = kvq_chat_render(t, msgs, n, gen, NULL, 0);
    if (len < 0) {
        fz_check_error(NULL);
    } else {
        char *full = malloc((size_t)len + 1), cut[8];
        if (!full) abort();
        if (kvq_chat_render(t, msgs, n, gen, full, (size_t)len + 1) != len || strlen(full) > (size_t)len) abort();
        if (kvq_chat_render(t, msgs, n, gen, cut, sizeof cut) != len || strncmp(full, cut, strlen(cut))) abort();
        free(full);
    }
    free(text);
    return 0;
}
