/* Tokenizer loading and the small public accessors. tokenizer.json holds the
 * pipeline; tokenizer_config.json and config.json (both optional) say which
 * tokens are BOS and end-of-generation. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Special tokens that end a turn or a text in common chat models, taken as EOG
 * when they are special added tokens even if no config names them. */
static const char *const EOG_NAMES[] = {
    "</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>",
    "<end_of_turn>", "<|END_OF_TURN_TOKEN|>",
};

void kvq_tokenizer_free(kvq_tokenizer *t) {
    if (!t) return;
    tk_cache *jv = atomic_load(&t->json_vocab);
    if (jv) jv->free(jv);
    tk_buf_free(&t->arena);
    free(t->model_off);
    free(t->model_len);
    free(t->text_off);
    free(t->text_len);
    free(t->attr);
    free(t->vocab_slot);
    free(t->merge_key);
    free(t->merge_rank);
    free(t->merge_new);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->added);
    free(t->joinable);
    tk_steps_free(&t->norm);
    tk_steps_free(&t->pretok);
    tk_steps_free(&t->dec);
    free(t);
}

static kvq_status join_path(char *buf, size_t size, const char *dir, const char *name) {
    if (strlen(dir) + strlen(name) + 2 > size) return kvq_fail(KVQ_ERR_ARG, "%s: path too long", dir);
    kvq_path_join(buf, size, dir, name);
    return KVQ_OK;
}

/* Reads and parses a JSON file; errors name the file. */
static kvq_status read_json(const char *path, cJSON **out) {
    char *buf;
    size_t len;
    *out = NULL;
    kvq_status st = kvq_read_file(path, &buf, &len);
    if (st) return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    size_t at = end ? (size_t)(end - buf) : 0;
    free(buf);
    if (!root) return kvq_fail(KVQ_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvq_fail(KVQ_ERR_FORMAT, "%s: not a JSON object", path);
    }
    *out = root;
    return KVQ_OK;
}

/* Id of a token given by its text: added tokens first, then the model vocab. */
static int32_t token_id(const kvq_tokenizer *t, const char *s) {
    size_t n = strlen(s), len;
    for (int i = 0; i < t->n_added; i++) {
        const char *x = tk_id_text(t, t->added[i].id, &len);
        if (x && len == n && !memcmp(x, s, n)) return t->added[i].id;
    }
    return tk_vocab_find(t, s, n);
}

/* bos_token / eos_token: a string or an AddedToken object {content: ...}. */
static const char *special_name(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static int32_t valid_id(const kvq_tokenizer *t, const cJSON *j) {
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble >= t->n_vocab) return -1;
    return (int32_t)j->valuedouble;
}

static void mark_eog(kvq_tokenizer *t, int32_t id) {
    if (id >= 0 && id < t->n_vocab) t->attr[id] |= TK_ATTR_EOG;
}

/* The first special token of a TemplateProcessing "single" template, if any. */
static int32_t template_bos(const kvq_tokenizer *t, const cJSON *pp) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
    return cJSON_IsString(name) ? token_id(t, name->valuestring) : -1;
}

static kvq_status load_specials(kvq_tokenizer *t, const char *dir, const cJSON *post_processor) {
    char path[1024];
    cJSON *tc = NULL, *cfg = NULL;
    kvq_status st;
    if ((st = join_path(path, sizeof path, dir, "tokenizer_config.json"))) return st;
    if (kvq_file_exists(path) && (st = read_json(path, &tc))) return st;
    if ((st = join_path(path, sizeof path, dir, "config.json"))) goto out;
    if (kvq_file_exists(path) && (st = read_json(path, &cfg))) goto out;

    const cJSON *bos_j = cJSON_GetObjectItemCaseSensitive(tc, "bos_token");
    const char *bos_name = special_name(bos_j);
    t->bos = bos_name ? token_id(t, bos_name) : -1;
    /* bos_token: null in tokenizer_config means the model has no BOS (Qwen-style) */
    int bos_null = cJSON_IsNull(bos_j);
    if (t->bos < 0 && !bos_null) t->bos = valid_id(t, cJSON_GetObjectItemCaseSensitive(cfg, "bos_token_id"));
    if (t->bos < 0 && !bos_null && !tc && !cfg) t->bos = template_bos(t, post_processor);
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token"))) t->bos = -1;

    const char *eos_name = special_name(cJSON_GetObjectItemCaseSensitive(tc, "eos_token"));
    if (eos_name) mark_eog(t, token_id(t, eos_name));
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id");
    if (cJSON_IsArray(eos))
        for (const cJSON *e = eos->child; e; e = e->next) mark_eog(t, valid_id(t, e));
    else
        mark_eog(t, valid_id(t, eos));
    for (int i = 0; i < t->n_added; i++) {
        size_t len;
        const char *x = tk_id_text(t, t->added[i].id, &len);
        if (!t->added[i].special || !x) continue;
        for (size_t k = 0; k < sizeof EOG_NAMES / sizeof *EOG_NAMES; k++)
            if (strlen(EOG_NAMES[k]) == len && !memcmp(EOG_NAMES[k], x, len)) mark_eog(t, t->added[i].id);
    }
out:
    cJSON_Delete(tc);
    cJSON_Delete(cfg);
    return st;
}

kvq_status kvq_tokenizer_load(const char *dir, kvq_tokenizer **out) {
    if (!dir || !out) return kvq_fail(KVQ_ERR_ARG, "kvq_tokenizer_load: no directory given");
    *out = NULL;
    kvq_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory loading the tokenizer", dir);
    t->unk_id = t->bos = -1;
    cJSON *root = NULL;
    kvq_status st = join_path(t->file, sizeof t->file, dir, "tokenizer.json");
    if (!st) st = read_json(t->file, &root);
    if (st) goto fail;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = kvq_fail(KVQ_ERR_FORMAT, "%s: no \"model\" object", t->file);
        goto fail;
    }
    if ((st = tk_load_model(t, model, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) ||
        (st = tk_parse_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), t->file, &t->norm)) ||
        (st = tk_parse_pretokenizer(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), t->file, &t->pretok)) ||
        (st = tk_parse_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), t->file, &t->dec)))
        goto fail;

    for (int b = 0; b < 324; b++) t->cp_byte[b] = -1;
    for (int b = 0; b < 256; b++) {
        t->byte_cp[b] = tk_byte_to_cp((uint8_t)b);
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
    if ((st = tk_index_added(t))) goto fail;
    if ((st = load_specials(t, dir, cJSON_GetObjectItemCaseSensitive(root, "post_processor")))) goto fail;
    cJSON_Delete(root);
    *out = t;
    return KVQ_OK;
fail:
    cJSON_Delete(root);
    kvq_tokenizer_free(t);
    return st;
}

int kvq_vocab_size(const kvq_tokenizer *tok) { return tok ? tok->n_vocab : 0; }

int32_t kvq_token_bos(const kvq_tokenizer *tok) { return tok ? tok->bos : -1; }

int kvq_token_is_eog(const kvq_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->n_vocab && (tok->attr[id] & TK_ATTR_EOG);
}
