/* Fuzz target: structured output. The input is a schema, a NUL byte, then bytes fed to the
 * matcher one at a time (without a NUL: the input is the schema and also the text). A schema
 * either compiles or fails with one line; the matcher refuses bytes or takes them, and once it
 * says the value is complete no byte but none may follow. Masks run on a small byte-level BPE
 * vocabulary (the qwen2-tiny fixture, 656 ids): its token tables are built once (shared per
 * tokenizer, json_vocab.c) and a mask costs ~1/50 of the demo's 32k, so inputs run fast.
 * The non-strict pass uses the pretty layout, the strict one the compact; both also sample
 * (forced text and widened picks included) and the token must be one the constraint allows.
 * A "schema" holding "::=" is a GBNF grammar instead (one pass, the same checks). */
#include <string.h>

#include "fuzz_common.h"

static kvq_tokenizer *g_tok;
static kvq_sampler *g_smp;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok && kvq_tokenizer_load(KVQ_SOURCE_DIR "/tests/data/models/qwen2-tiny-aqlm-2x8", &g_tok) != KVQ_OK) return 0;
    if (!g_smp) {
        kvq_sampler_params sp = kvq_sampler_default_params();
        sp.seed = 1;
        if (!(g_smp = kvq_sampler_new(&sp))) return 0;
    }
    if (size > 65536) return 0;
    char schema[65537];
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    memcpy(schema, data, slen);
    schema[slen] = 0;
    const uint8_t *text = nul ? nul + 1 : data;
    size_t tlen = nul ? size - slen - 1 : size;
    char err[256];
    int gbnf = strstr(schema, "::=") != NULL;
    for (int strict = 0; strict < 2 - gbnf; strict++) {
        kvq_json_constraint *c = gbnf ? kvq_grammar_constraint_new(g_tok, schema, err, sizeof err)
                                      : kvq_json_constraint_new(g_tok, slen ? schema : NULL, strict, err, sizeof err);
        if (!c) {
            if (!err[0] || strchr(err, '\n')) __builtin_trap();
            continue;
        }
        kvq_json_constraint_set_layout(c, !strict);
        if (strchr(kvq_json_constraint_ignored(c), '\n') || (strict && *kvq_json_constraint_ignored(c))) __builtin_trap();
        static float lg[4096];
        for (size_t i = 0; i < tlen; i++) {
            int done = kvq_json_constraint_complete(c) == 2;
            int ok = kvq_json_constraint_feed(c, (const char *)text + i, 1) == 0;
            if (done && ok) __builtin_trap(); /* nothing follows a complete value */
            if (i % 64 == 0) {
                int n = kvq_vocab_size(g_tok) < 4096 ? kvq_vocab_size(g_tok) : 4096;
                memset(lg, 0, sizeof lg);
                kvq_json_constraint_apply(c, lg, n);
                for (int id = 0; id < n; id++) /* the mask agrees with the one-token check, every id */
                    if (!kvq_token_is_eog(g_tok, id) && (lg[id] == 0) != kvq_json_constraint_allows(c, id)) __builtin_trap();
                for (int id = 0; id < n; id++) lg[id] = (float)((id * 7919u + i) % 97u); /* a fixed landscape */
                int32_t t = kvq_json_constraint_sample(c, g_smp, lg, n);
                if (t >= 0 && !kvq_token_is_eog(g_tok, t) && !kvq_json_constraint_allows(c, t)) __builtin_trap();
            }
        }
        kvq_json_constraint_free(c);
    }
    return 0;
}
