/* Structured output (kvq_json_constraint): schemas that nest, enums, arrays and required
 * fields; valid texts are taken byte by byte and end complete, invalid ones are refused at
 * the byte that breaks them; random sampling under the mask (random logits) always gives
 * text that parses (cJSON) and validates (the checker below, written from the schema rules,
 * not from the matcher). Bad schemas fail with a message. Prints the mask's cost per step. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/json_vocab.h"
#include "kvq.h"
#include "testutil.h"

static const char *S_PERSON =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\"},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":8},\"minItems\":1,\"maxItems\":3},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"maxLength\":5}},"
    "\"required\":[\"city\"],\"additionalProperties\":false},"
    "\"score\":{\"type\":\"number\"},\"active\":{\"type\":\"boolean\"},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
    "\"level\":{\"enum\":[1,12,\"x\"]}},"
    "\"required\":[\"name\",\"role\",\"tags\",\"address\"],\"additionalProperties\":false}";

static const char *S_TREE =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";

static const char *S_LIST = "{\"type\":\"array\",\"items\":{\"type\":[\"number\",\"null\"]},\"maxItems\":4}";

/* ---- an independent validator for the subset -------------------------------- */

static const cJSON *deref(const cJSON *s, const cJSON *root) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (!cJSON_IsString(r)) return s;
    if (!strcmp(r->valuestring, "#")) return root;
    const char *name = strrchr(r->valuestring, '/') + 1;
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "$defs"), name);
}

static int utf8_chars(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int has_type(const cJSON *v, const char *t) {
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    return 0;
}

static int valid(const cJSON *v, const cJSON *s, const cJSON *root) {
    if (!s) return cJSON_IsObject(v); /* json_object mode */
    s = deref(s, root);
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        const cJSON *e;
        cJSON_ArrayForEach(e, en) if (cJSON_Compare(v, e, 1)) return 1;
        return 0;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (any) {
        const cJSON *a;
        cJSON_ArrayForEach(a, any) if (valid(v, a, root)) return 1;
        return 0;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(ty) && !has_type(v, ty->valuestring)) return 0;
    if (cJSON_IsArray(ty)) {
        int ok = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, ty) ok |= has_type(v, t->valuestring);
        if (!ok) return 0;
    }
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if (cJSON_IsString(v) && mx && utf8_chars(v->valuestring) > mx->valueint) return 0;
    if (cJSON_IsArray(v)) {
        const cJSON *mi = cJSON_GetObjectItemCaseSensitive(s, "minItems"), *ma = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
        int n = cJSON_GetArraySize(v);
        if ((mi && n < mi->valueint) || (ma && n > ma->valueint)) return 0;
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items"), *e;
        if (it) cJSON_ArrayForEach(e, v) if (!valid(e, it, root)) return 0;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties"), *r, *e;
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(s, "required")) {
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return 0;
        }
        int strict = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"));
        cJSON_ArrayForEach(e, v) {
            const cJSON *ps = cJSON_GetObjectItemCaseSensitive(props, e->string);
            if (!ps && strict) return 0;
            if (ps && !valid(e, ps, root)) return 0;
            for (const cJSON *d = v->child; d != e; d = d->next)
                if (!strcmp(d->string, e->string)) return 0; /* duplicate key */
        }
    }
    return 1;
}

/* ---- bytes ------------------------------------------------------------------- */

/* Feeds text one byte at a time: the offset of the first refused byte, or -1. */
static long feed_bytes(kvq_json_constraint *c, const char *t) {
    for (size_t i = 0; t[i]; i++)
        if (kvq_json_constraint_feed(c, t + i, 1)) return (long)i;
    return -1;
}

static void expect_valid(const char *schema, const char *text) {
    char err[256];
    kvq_json_constraint *c = kvq_json_constraint_new(NULL, schema, 1, err, sizeof err);
    if (!c) fail_msg("schema refused: %s", err);
    kvq_json_constraint_set_layout(c, 1); /* these texts hold blanks */
    long at = feed_bytes(c, text);
    if (at >= 0) fail_msg("valid text refused at byte %ld: %s", at, text);
    if (!kvq_json_constraint_complete(c)) fail_msg("valid text not complete: %s", text);
    kvq_json_constraint_free(c);
}

/* Invalid: refused at the byte `at` points to in text ("" -> never complete). */
static void expect_invalid(const char *schema, const char *text, const char *at) {
    kvq_json_constraint *c = kvq_json_constraint_new(NULL, schema, 1, NULL, 0);
    assert_non_null(c);
    kvq_json_constraint_set_layout(c, 1);
    long got = feed_bytes(c, text);
    if (*at) {
        long want = (long)(strstr(text, at) - text);
        if (got != want) fail_msg("%s: refused at %ld, expected %ld (\"%s\")", text, got, want, at);
    } else if (got >= 0 || kvq_json_constraint_complete(c)) {
        fail_msg("%s: refused at %ld / complete %d; expected an incomplete value", text, got, kvq_json_constraint_complete(c));
    }
    kvq_json_constraint_free(c);
}

static void test_bytes_valid(void **st) {
    (void)st;
    expect_valid(S_PERSON, "{\"name\":\"Ann\",\"role\":\"admin\",\"tags\":[\"a\",\"b\"],\"address\":{\"city\":\"Oslo\"}}");
    expect_valid(S_PERSON, "{\n  \"address\": {\"zip\": \"0150\", \"city\": \"Oslo\\u00e9\\n\"},\n  \"tags\": [\"x\"],\n"
                           "  \"role\": \"guest\", \"name\": \"Zo\xc3\xab\",\n  \"age\": -12, \"score\": -1.5e+3,\n"
                           "  \"active\": false, \"note\": null, \"level\": 12\n}");
    expect_valid(S_PERSON, "{\"note\":\"hi\",\"level\":1,\"name\":\"\",\"role\":\"user\",\"tags\":[\"\",\"\",\"\"],\"address\":{\"city\":\"\"}}");
    expect_valid(S_TREE, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}");
    expect_valid(S_LIST, "[1, null, 2.5, -0]");
    expect_valid(S_LIST, "  []");
    expect_valid(NULL, "{\"a\":[1,{\"b\":null}],\"c\":\"d\",\"e\":true}");
    expect_valid("{\"type\":\"integer\"}", "42"); /* complete, though more digits could follow */
    expect_valid("{\"const\":\"on\"}", "\"on\"");
}

static void test_bytes_invalid(void **st) {
    (void)st;
    const char *base = "\"tags\":[\"a\"],\"address\":{\"city\":\"O\"}";
    char t[512];
    snprintf(t, sizeof t, "{\"name\":\"A\",\"role\":\"root\",%s}", base);
    expect_invalid(S_PERSON, t, "root"); /* not an enum value: no value starts with 'r' */
    snprintf(t, sizeof t, "{\"name\":\"A\",%s}", base);
    { /* role is required: refused at the last '}' */
        kvq_json_constraint *c = kvq_json_constraint_new(NULL, S_PERSON, 1, NULL, 0);
        assert_int_equal(feed_bytes(c, t), (long)strlen(t) - 1);
        kvq_json_constraint_free(c);
    }
    expect_invalid(S_PERSON, "{\"name\":\"A\",\"x\":1}", "x\"");
    expect_invalid(S_PERSON, "{\"name\":\"A\",\"name\":\"B\"}", "ame\":\"B"); /* no key twice ("note" shares the 'n') */
    expect_invalid(S_PERSON, "{\"tags\":[]}", "]}");
    expect_invalid(S_PERSON, "{\"tags\":[\"a\",\"b\",\"c\",\"d\"]}", ",\"d\"");
    expect_invalid(S_PERSON, "{\"age\":1.5}", ".5");
    expect_invalid(S_PERSON, "{\"name\":\"abcdefghijklmnop\"}", "mnop");
    expect_invalid(S_PERSON, "{\"note\":3}", "3}");
    expect_invalid(S_PERSON, "{\"address\":{\"zip\":\"1\"}}", "}}");
    expect_invalid(S_PERSON, "{\"level\":2}", "2}");
    expect_invalid(S_PERSON, "{\"level\":123}", "3}");
    expect_invalid(S_TREE, "{\"v\":1,\"kids\":[{\"v\":1},{\"v\":2},{\"v\":3}]}", ",{\"v\":3}");
    expect_invalid(S_LIST, "[1,2,3,4,5]", ",5");
    expect_invalid(S_LIST, "[01]", "1]");
    expect_invalid(S_LIST, "[1.]", "]");
    /* a number at its length limit (24 characters) takes no '.' that no digit could follow */
    expect_invalid(S_LIST, "[12345678901234567890123.5]", ".5");
    expect_valid(S_LIST, "[123456789012345678901234, 1.5e-12345678901234567]");
    expect_invalid(S_LIST, "[\"a\"]", "\"a");
    expect_invalid(NULL, "[1]", "[1");
    expect_invalid(NULL, "{\"a\":1} ", " ");            /* nothing after the value */
    expect_invalid(NULL, "{\"a\":\"\x01\"}", "\x01");    /* control character in a string */
    expect_invalid(NULL, "{\"a\":\"\\q\"}", "q\"");      /* bad escape */
    expect_invalid(NULL, "{\"a\":\"\xc3(\"}", "(");      /* bad UTF-8 */
    expect_invalid(NULL, "{\"a\":tru}", "}");
    expect_invalid(NULL, "{\"a\":[1,2", "");
    /* whitespace is bounded: the 17th blank in a row is refused */
    snprintf(t, sizeof t, "{%*s\"a\":1}", 17, "");
    expect_invalid(NULL, t, " \"a\"");
    expect_invalid(NULL, "{\"a\":\n\n1}", "\n1}"); /* one newline per gap */
    expect_valid(NULL, "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
}

static void test_bad_schemas(void **st) {
    (void)st;
    static const struct { const char *schema; const char *needle; } bad[] = {
        {"{\"type\":\"object\",", "not valid JSON"},
        {"{\"type\":\"thing\"}", "not a JSON schema type"},
        {"{\"type\":\"string\",\"pattern\":\"(a\"}", "'pattern' does not compile"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "format \"uri\" is not supported"},
        {"{\"allOf\":[{\"type\":\"string\"}]}", "OpenAI's strict mode refuses it too"},
        {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMaximum\":5}", "no integer"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "\"b\" is not in"},
        {"{\"$ref\":\"#/$defs/none\"}", "does not name"},
        {"{\"enum\":[]}", "non-empty"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "below"},
        {"[1]", "must be an object"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "refers to itself"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        kvq_json_constraint *c = kvq_json_constraint_new(NULL, bad[i].schema, 1, err, sizeof err);
        if (c) fail_msg("accepted a bad schema: %s", bad[i].schema);
        if (!strstr(err, bad[i].needle)) fail_msg("%s: message \"%s\" lacks \"%s\"", bad[i].schema, err, bad[i].needle);
        assert_non_null(strstr(kvq_last_error(), bad[i].needle));
    }
    /* not strict: an unsupported keyword is ignored, and listed */
    kvq_json_constraint *c =
        kvq_json_constraint_new(NULL, "{\"type\":\"string\",\"format\":\"uri\",\"not\":{},\"x-a\":1,\"not\":{}}", 0, NULL, 0);
    assert_non_null(c);
    assert_string_equal(kvq_json_constraint_ignored(c), "not,x-a,format:uri");
    kvq_json_constraint_free(c);
}

/* ---- sampling on a real vocabulary ----------------------------------------- */

static uint64_t rng;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Random logits, with tokens that close values (" } ] , and digits) favoured so that
 * values end within a few hundred tokens. */
static void random_logits(const kvq_tokenizer *tok, float *lg, int n, const char *closers) {
    for (int i = 0; i < n; i++) lg[i] = (float)(urand() * 6.0) + (closers[i] ? 7.0f : 0.0f);
}

static char *closer_table(const kvq_tokenizer *tok, int n) {
    char *t = calloc((size_t)n, 1), buf[64];
    for (int32_t i = 0; i < n; i++) {
        int k = kvq_detokenize(tok, &i, 1, 1, buf, sizeof buf);
        if (k > 0 && k < 4 && strpbrk(buf, "\"}],0123456789")) t[i] = 1;
    }
    return t;
}

static void sample_values(const kvq_tokenizer *tok, const char *schema, int runs) {
    int n = kvq_vocab_size(tok);
    float *lg = malloc(sizeof *lg * (size_t)n);
    char *closers = closer_table(tok, n);
    int32_t ids[600];
    char text[16384];
    cJSON *sj = schema ? cJSON_Parse(schema) : NULL;
    int completed = 0;
    for (int run = 0; run < runs; run++) {
        char err[256];
        kvq_json_constraint *c = kvq_json_constraint_new(tok, schema, 1, err, sizeof err);
        if (!c) fail_msg("%s", err);
        kvq_sampler_params sp = kvq_sampler_default_params();
        sp.seed = (uint64_t)run;
        sp.top_k = 0;
        sp.top_p = 1;
        sp.min_p = 0;
        sp.temp = 1;
        kvq_sampler *s = kvq_sampler_new(&sp);
        int nid = 0, ended = 0;
        while (nid < 600 && kvq_json_constraint_complete(c) < 2) {
            random_logits(tok, lg, n, closers);
            int32_t id = kvq_json_constraint_sample(c, s, lg, n);
            if (kvq_token_is_eog(tok, id)) {
                assert_true(kvq_json_constraint_complete(c) >= 1);
                ended = 1;
                break;
            }
            assert_int_equal(kvq_json_constraint_accept(c, id), 0);
            ids[nid++] = id;
        }
        int len = kvq_detokenize(tok, ids, nid, 1, text, sizeof text);
        assert_true(len >= 0 && len < (int)sizeof text);
        if (getenv("KVQ_TEST_SHOW")) fprintf(stderr, "%d %d: %s\n", ended, kvq_json_constraint_complete(c), text);
        if (ended || kvq_json_constraint_complete(c)) {
            completed++;
            cJSON *v = cJSON_Parse(text);
            if (!v) fail_msg("run %d: sampled text does not parse: %s", run, text);
            if (!valid(v, sj, sj)) fail_msg("run %d: sampled value does not validate: %s", run, text);
            cJSON_Delete(v);
        }
        kvq_sampler_free(s);
        kvq_json_constraint_free(c);
    }
    if (completed < runs * 3 / 4) fail_msg("only %d of %d sampled values were complete", completed, runs);
    cJSON_Delete(sj);
    free(closers);
    free(lg);
}

static kvq_tokenizer *load_demo(void) {
    kvq_tokenizer *tok = NULL;
    assert_int_equal(kvq_tokenizer_load(KVQ_SOURCE_DIR "/models/demo", &tok), KVQ_OK);
    return tok;
}

static void test_sample_demo(void **st) {
    (void)st;
    kvq_tokenizer *tok = load_demo();
    sample_values(tok, S_PERSON, 12);
    sample_values(tok, S_TREE, 8);
    sample_values(tok, S_LIST, 8);
    sample_values(tok, NULL, 8);
    kvq_tokenizer_free(tok);
}

static void test_sample_llama3(void **st) {
    (void)st;
    const char *dir = tu_fixture("tokenizers/llama3");
    TU_NEED_FIXTURE(dir);
    kvq_tokenizer *tok = NULL;
    assert_int_equal(kvq_tokenizer_load(dir, &tok), KVQ_OK);
    sample_values(tok, S_PERSON, 4);
    sample_values(tok, NULL, 4);
    kvq_tokenizer_free(tok);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* The mask's cost per step on a vocabulary, at a few points of a value (printed). */
static void mask_cost(const char *name, const kvq_tokenizer *tok) {
    static const char *prefix[] = {"", "{\"name\":\"A", "{\"name\":\"A\",", "{\"name\":\"A\",\"role\":\"user\",\"tags\":[\"a\"],\"address\":{\"city\":\"O\"},\"age\":1"};
    int n = kvq_vocab_size(tok);
    float *lg = malloc(sizeof *lg * (size_t)n);
    /* per request: building the token tables (what each request paid before they were
     * shared), the first constraint (builds the shared tables), then later ones (reuse them) */
    double total = 0, check = 0, t_build = now_s();
    js_vocab *own = js_vocab_build(tok);
    t_build = now_s() - t_build;
    double t_first = now_s();
    kvq_json_constraint *first = kvq_json_constraint_new(tok, S_PERSON, 1, NULL, 0);
    t_first = now_s() - t_first;
    double t_new = now_s();
    for (int i = 0; i < 20; i++) kvq_json_constraint_free(kvq_json_constraint_new(tok, S_PERSON, 1, NULL, 0));
    t_new = (now_s() - t_new) / 20;
    /* the shared tables equal a fresh build */
    const js_vocab *shared = js_vocab_get(tok);
    assert_true(shared && own && shared->n_order == own->n_order && shared->max_len == own->max_len);
    assert_memory_equal(shared->order, own->order, sizeof *own->order * (size_t)own->n_order);
    assert_memory_equal(shared->lcp, own->lcp, sizeof *own->lcp * (size_t)own->n_order);
    js_vocab_free(&own->base);
    kvq_json_constraint_free(first);
    int reps = 0;
    for (size_t p = 0; p < sizeof prefix / sizeof *prefix; p++) {
        kvq_json_constraint *c = kvq_json_constraint_new(tok, S_PERSON, 1, NULL, 0);
        assert_int_equal(kvq_json_constraint_feed(c, prefix[p], strlen(prefix[p])), 0);
        int allowed = 0;
        double t0 = now_s();
        for (int r = 0; r < 5; r++) {
            for (int i = 0; i < n; i++) lg[i] = 0;
            kvq_json_constraint_apply(c, lg, n);
        }
        total += now_s() - t0;
        for (int i = 0; i < n; i++) allowed += lg[i] == 0;
        assert_true(allowed > 0);
        t0 = now_s();
        for (int i = 0; i < 1000; i++) (void)kvq_json_constraint_allows(c, i % n);
        check += now_s() - t0;
        reps += 5;
        kvq_json_constraint_free(c);
    }
    print_message("json mask %s (%d ids): tables %.1f ms (first constraint %.1f ms), later constraint %.3f ms, "
                  "full mask %.2f ms per step, one-token check %.2f us\n", name, n,
                  t_build * 1e3, t_first * 1e3, t_new * 1e3, total / reps * 1e3, check / (1000.0 * (double)(sizeof prefix / sizeof *prefix)) * 1e6);
    free(lg);
}

static void test_mask_cost(void **st) {
    (void)st;
    kvq_tokenizer *tok = load_demo();
    mask_cost("demo (llama2, 32k)", tok);
    kvq_tokenizer_free(tok);
    const char *dir = tu_fixture("tokenizers/llama3");
    TU_NEED_FIXTURE(dir);
    assert_int_equal(kvq_tokenizer_load(dir, &tok), KVQ_OK);
    mask_cost("llama3 (128k)", tok);
    kvq_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_valid),  cmocka_unit_test(test_bytes_invalid), cmocka_unit_test(test_bad_schemas),
        cmocka_unit_test(test_sample_demo),  cmocka_unit_test(test_sample_llama3), cmocka_unit_test(test_mask_cost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
