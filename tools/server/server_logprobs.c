/* kvq-server: token log-probabilities. They are of the model's own distribution (the raw
 * logits, before penalties, temperature and truncation), as OpenAI and llama-server report
 * them, so they do not change with the sampling settings. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "server.h"

void srv_logprobs(const float *lg, int n_vocab, int32_t id, int n_top, srv_lp *out) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n_vocab; i++)
        if (lg[i] > mx) mx = lg[i];
    for (int i = 0; i < n_vocab; i++) sum += exp((double)lg[i] - mx);
    const double lse = mx + log(sum);
    out->id = id;
    out->logprob = (float)((double)lg[id] - lse);
    if (n_top > SRV_MAX_TOP) n_top = SRV_MAX_TOP;
    if (n_top > n_vocab) n_top = n_vocab;
    /* partial selection: a sorted list of the best n_top seen so far; most logits fall below its
     * last entry and cost one comparison */
    int k = 0;
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        float v = lg[i];
        if (k == n_top && v <= lg[out->top_id[k - 1]]) continue;
        int j = k < n_top ? k++ : k - 1;
        while (j > 0 && lg[out->top_id[j - 1]] < v) {
            out->top_id[j] = out->top_id[j - 1];
            j--;
        }
        out->top_id[j] = i;
    }
    out->n_top = k;
    for (int j = 0; j < k; j++) out->top_lp[j] = (float)((double)lg[out->top_id[j]] - lse);
}

/* A token's text as it reads after another token, into buf (NUL-terminated); its length.
 * Decoding a SentencePiece token alone drops its word-start space (" said" reads "said"), so
 * the token is decoded twice in a row and the second copy's text taken: the pieces of a reply
 * then add up to its text, for every tokenizer family. */
static int token_piece(const kvq_tokenizer *tok, int32_t id, char *buf, size_t size) {
    const int32_t two[2] = {id, id};
    char pair[1024];
    int one = kvq_detokenize(tok, &id, 1, 0, NULL, 0), k2 = kvq_detokenize(tok, two, 2, 0, pair, sizeof pair);
    int k = 0;
    if (one >= 0 && k2 >= one && (size_t)k2 < sizeof pair) {
        k = k2 - one;
        if ((size_t)k >= size) k = (int)size - 1;
        memcpy(buf, pair + one, (size_t)k);
    }
    buf[k] = 0;
    return k;
}

/* Chat: {"token", "logprob", "bytes"}. */
static cJSON *chat_lp_item(const kvq_tokenizer *tok, int32_t id, float lp) {
    char piece[512];
    int k = token_piece(tok, id, piece, sizeof piece);
    cJSON *o = cJSON_CreateObject(), *b;
    cJSON_AddStringToObject(o, "token", piece);
    cJSON_AddNumberToObject(o, "logprob", lp);
    b = cJSON_AddArrayToObject(o, "bytes");
    for (int i = 0; i < k; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)piece[i]));
    return o;
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}. */
cJSON *srv_chat_logprobs_json(const kvq_tokenizer *tok, const srv_lp *lp, int n) {
    cJSON *o = cJSON_CreateObject(), *c = cJSON_AddArrayToObject(o, "content");
    for (int i = 0; i < n; i++) {
        cJSON *it = chat_lp_item(tok, lp[i].id, lp[i].logprob), *top = cJSON_AddArrayToObject(it, "top_logprobs");
        for (int j = 0; j < lp[i].n_top; j++) cJSON_AddItemToArray(top, chat_lp_item(tok, lp[i].top_id[j], lp[i].top_lp[j]));
        cJSON_AddItemToArray(c, it);
    }
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* Completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
 * lp[i] is the request's entry first+i; the first n_prompt entries are an echoed prompt's, whose
 * offsets are in the prompt's text; the reply's are shifted by the echoed text's length. */
cJSON *srv_cmpl_logprobs_json(const kvq_tokenizer *tok, const srv_lp *lp, int n, int first, int n_prompt, size_t echo_len) {
    cJSON *o = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(o, "tokens"),
          *lps = cJSON_AddArrayToObject(o, "token_logprobs"), *tops = cJSON_AddArrayToObject(o, "top_logprobs"),
          *offs = cJSON_AddArrayToObject(o, "text_offset");
    char piece[512];
    for (int i = 0; i < n; i++) {
        token_piece(tok, lp[i].id, piece, sizeof piece);
        cJSON_AddItemToArray(toks, cJSON_CreateString(piece));
        if (isnan(lp[i].logprob)) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
        } else {
            cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp[i].logprob));
            cJSON *t = cJSON_CreateObject();
            for (int j = 0; j < lp[i].n_top; j++) {
                token_piece(tok, lp[i].top_id[j], piece, sizeof piece);
                if (!cJSON_GetObjectItemCaseSensitive(t, piece)) cJSON_AddNumberToObject(t, piece, lp[i].top_lp[j]);
            }
            cJSON_AddItemToArray(tops, t);
        }
        double off = lp[i].offset + (first + i >= n_prompt ? (double)echo_len : 0);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(off));
    }
    return o;
}
