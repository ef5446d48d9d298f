/* Structured output's value keywords: integer and number bounds (refused at the byte after
 * which no value in range can follow, negative ranges included), multipleOf, pattern and the
 * nine formats (PCRE2, JSON escapes decoded first), lengths in code points, anyOf alternatives
 * that begin alike, the compact layout, strict refusals and the ignored list. Random sampling
 * on the demo's vocabulary gives values that a checker written here (from the keywords' rules,
 * not from the matcher) accepts. Prints a pattern-heavy schema's cost per step. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvq.h"
#include "testutil.h"

/* Feeds text one byte at a time: the offset of the first refused byte, or -1. */
static long feed_bytes(kvq_json_constraint *c, const char *t) {
    for (size_t i = 0; t[i]; i++)
        if (kvq_json_constraint_feed(c, t + i, 1)) return (long)i;
    return -1;
}

static kvq_json_constraint *make(const char *schema, int pretty) {
    char err[256];
    kvq_json_constraint *c = kvq_json_constraint_new(NULL, schema, 1, err, sizeof err);
    if (!c) fail_msg("schema refused: %s (%s)", err, schema);
    kvq_json_constraint_set_layout(c, pretty);
    return c;
}

/* text is taken whole and is a complete value */
static void ok(const char *schema, const char *text) {
    kvq_json_constraint *c = make(schema, 0);
    long at = feed_bytes(c, text);
    if (at >= 0) fail_msg("%s: valid text refused at byte %ld: %s", schema, at, text);
    if (!kvq_json_constraint_complete(c)) fail_msg("%s: valid text not complete: %s", schema, text);
    kvq_json_constraint_free(c);
}

/* refused at byte `at` of text; at == strlen(text): taken but not complete */
static void bad(const char *schema, const char *text, long at) {
    kvq_json_constraint *c = make(schema, 0);
    long got = feed_bytes(c, text);
    if (at == (long)strlen(text)) {
        if (got >= 0 || kvq_json_constraint_complete(c)) fail_msg("%s: %s should stay incomplete (refused at %ld)", schema, text, got);
    } else if (got != at) fail_msg("%s: %s refused at %ld, expected %ld", schema, text, got, at);
    kvq_json_constraint_free(c);
}

static void test_integers(void **st) {
    (void)st;
    const char *age = "{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}";
    ok(age, "0"), ok(age, "150"), ok(age, "99");
    bad(age, "151", 2), bad(age, "-1", 0), bad(age, "1500", 3), bad(age, "2000", 2), bad(age, "01", 1);
    bad(age, "1e2", 1), bad(age, "15.0", 2);
    const char *neg = "{\"type\":\"integer\",\"minimum\":-50,\"maximum\":-10}";
    ok(neg, "-50"), ok(neg, "-10"), ok(neg, "-37");
    bad(neg, "-51", 2), bad(neg, "-9", 1), bad(neg, "5", 0), bad(neg, "-0", 1), bad(neg, "-1", 2); /* "-1" could be -10..-19 */
    const char *ex = "{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}";
    ok(ex, "1"), ok(ex, "9");
    bad(ex, "0", 0), bad(ex, "10", 1);
    const char *mul = "{\"type\":\"integer\",\"minimum\":10,\"maximum\":20,\"multipleOf\":7}";
    ok(mul, "14");
    bad(mul, "15", 1), bad(mul, "2", 0), bad(mul, "7", 0);
    const char *mneg = "{\"type\":\"integer\",\"maximum\":-100,\"minimum\":-1000,\"multipleOf\":25}";
    ok(mneg, "-100"), ok(mneg, "-975"), ok(mneg, "-1000");
    bad(mneg, "-110", 2), bad(mneg, "-99", 2);
    /* multipleOf alone: any multiple, however long */
    ok("{\"type\":\"integer\",\"multipleOf\":3}", "-123456789");
    bad("{\"type\":\"integer\",\"multipleOf\":3}", "124", 3);
    /* a whole multipleOf on a number: written as an integer */
    ok("{\"type\":\"number\",\"multipleOf\":5}", "35");
    bad("{\"type\":\"number\",\"multipleOf\":5}", "35.", 2);
    /* bounds within an object: the byte after the number is where it ends */
    ok("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":3}}}", "{\"a\":3}");
    bad("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"maximum\":3}}}", "{\"a\":4}", 5);
}

static void test_numbers(void **st) {
    (void)st;
    const char *r = "{\"type\":\"number\",\"minimum\":0.5,\"maximum\":2.5}";
    ok(r, "0.5"), ok(r, "2.5"), ok(r, "1"), ok(r, "2.4999");
    bad(r, "0.4", 2), bad(r, "3", 0), bad(r, "2.51", 3), bad(r, "1e0", 1), bad(r, "-1", 0), bad(r, "0", 1);
    const char *x = "{\"type\":\"number\",\"exclusiveMinimum\":-1,\"exclusiveMaximum\":1}";
    ok(x, "-0.999"), ok(x, "0"), ok(x, "0.5");
    bad(x, "1", 0), bad(x, "-1", 1), bad(x, "-2", 1), bad(x, "-0", 2);
    const char *neg = "{\"type\":\"number\",\"maximum\":-2.5}";
    ok(neg, "-2.5"), ok(neg, "-1000.75");
    bad(neg, "-2.4", 3), bad(neg, "-1", 2), bad(neg, "3", 0);
    const char *q = "{\"type\":\"number\",\"minimum\":0,\"maximum\":10,\"multipleOf\":0.25}";
    ok(q, "0.75"), ok(q, "10"), ok(q, "3.5");
    bad(q, "0.73", 3), bad(q, "0.7", 3), bad(q, "0.751", 4), bad(q, "11", 1);
    /* unbounded numbers keep the exponent */
    ok("{\"type\":\"number\"}", "-1.5e+3");
}

static void test_strings(void **st) {
    (void)st;
    const char *code = "{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{2,4}$\"}";
    ok(code, "\"ABC-12\""), ok(code, "\"XYZ-1234\"");
    bad(code, "\"AB1\"", 3), bad(code, "\"ABC-12345\"", 9), bad(code, "\"ABC-1\"", 6), bad(code, "\"abc\"", 1);
    /* unanchored: tried from the start, so the value still matches wherever it is searched */
    ok("{\"type\":\"string\",\"pattern\":\"ab\"}", "\"abzz\"");
    bad("{\"type\":\"string\",\"pattern\":\"ab\"}", "\"zab\"", 1);
    /* escapes are decoded before matching; a checked string takes no \u (raw UTF-8 instead) */
    kvq_json_constraint *c = make("{\"type\":\"string\",\"pattern\":\"^\\u00e9+\\\\n\\\"$\"}", 1);
    assert_int_equal(feed_bytes(c, "\"\xc3\xa9\xc3\xa9\\n\\\"\""), -1);
    assert_true(kvq_json_constraint_complete(c));
    kvq_json_constraint_free(c);
    bad("{\"type\":\"string\",\"pattern\":\"^[\\\\s\\\\S]+$\"}", "\"\\u0061", 2);
    bad("{\"type\":\"string\",\"pattern\":\"^a\\\\n\"}", "\"a\\t", 3);
    /* a lead byte no character of which can match is refused at once */
    bad("{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}", "\"a\xc3\xa9", 2);
    ok("{\"type\":\"string\",\"pattern\":\"^[\u4e00-\u9fff]+$\"}", "\"\xe4\xb8\xad\xe6\x96\x87\"");
    bad("{\"type\":\"string\",\"pattern\":\"^[a-z]+\"}", "\"\\", 1); /* no escape can match */
    /* lengths count code points: a surrogate pair is one */
    const char *len = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}";
    ok(len, "\"\xc3\xa9\xf0\x9f\x98\x80\"");
    bad(len, "\"abc\"", 3), bad(len, "\"a\"", 2);
    c = make(len, 1);
    assert_int_equal(feed_bytes(c, "\"a\\ud83d\\ude00\""), -1);
    assert_true(kvq_json_constraint_complete(c));
    kvq_json_constraint_free(c);
    c = make(len, 1);
    assert_int_equal(feed_bytes(c, "\"\\ud83dx"), 7); /* a high surrogate wants its low half */
    kvq_json_constraint_free(c);
}

static void test_formats(void **st) {
    (void)st;
    static const struct { const char *fmt, *good, *bad; long at; } f[] = {
        {"date", "\"2024-02-28\"", "\"2024-13-01\"", 7},
        {"date", "\"1999-04-30\"", "\"1999-04-31\"", 10},
        {"time", "\"23:59:59.5Z\"", "\"24:00:00Z\"", 2},
        {"date-time", "\"2024-06-01T12:00:00+02:00\"", "\"2024-06-01 12:00:00Z\"", 11},
        {"duration", "\"P1Y2M3DT4H5M6S\"", "\"PT\"", 3},
        {"duration", "\"P3W\"", "\"P\"", 2},
        {"email", "\"ann.lee@mail.example.org\"", "\"ann..lee@x.org\"", 5},
        {"hostname", "\"api-1.example.com\"", "\"-api\"", 1},
        {"ipv4", "\"192.168.0.255\"", "\"192.168.0.256\"", 13},
        {"ipv6", "\"2001:db8::1\"", "\"2001:db8:::1\"", 11},
        {"uuid", "\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\"", 36},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"format\":\"%s\"}", f[i].fmt);
        ok(schema, f[i].good);
        bad(schema, f[i].bad, f[i].at);
    }
}

static void test_anyof_alike(void **st) {
    (void)st;
    /* objects with different required keys, told apart by a later key */
    const char *shape =
        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{\"type\":\"number\"}},"
        "\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},"
        "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"square\"},\"side\":{\"type\":\"integer\",\"minimum\":1}},"
        "\"required\":[\"kind\",\"side\"],\"additionalProperties\":false}]}";
    ok(shape, "{\"kind\":\"circle\",\"r\":1.5}");
    ok(shape, "{\"side\":3,\"kind\":\"square\"}");
    bad(shape, "{\"kind\":\"circle\",\"side\":1}", 18);
    bad(shape, "{\"side\":0", 8);
    bad(shape, "{\"side\":2}", 9); /* kind is required */
    /* string enums sharing a prefix; integer beside number */
    const char *fruit = "{\"anyOf\":[{\"enum\":[\"apple\",\"apricot\"]},{\"enum\":[\"april\",\"apple pie\"]}]}";
    ok(fruit, "\"april\""), ok(fruit, "\"apple pie\""), ok(fruit, "\"apple\"");
    bad(fruit, "\"apx", 3);
    ok("{\"anyOf\":[{\"type\":\"integer\",\"maximum\":5},{\"type\":\"number\",\"minimum\":100}]}", "100.5");
    bad("{\"anyOf\":[{\"type\":\"integer\",\"maximum\":5},{\"type\":\"number\",\"minimum\":100}]}", "7", 1); /* 7xx may follow */
    /* null beside an object, and a nullable pattern string */
    const char *opt = "{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}},"
                      "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"string\",\"pattern\":\"^x+$\"}}}]}";
    ok(opt, "null"), ok(opt, "{\"a\":\"q\"}"), ok(opt, "{\"b\":\"xx\"}"), ok(opt, "{}");
    bad(opt, "{\"b\":\"xy\"}", 7);
    /* alternatives repeated in an array stay a small set (equal paths merge) */
    char t[4096] = "[";
    for (int i = 0; i < 200; i++) strcat(t, i ? ",\"apple\"" : "\"apple\"");
    strcat(t, "]");
    char s[256];
    snprintf(s, sizeof s, "{\"type\":\"array\",\"items\":%s}", fruit);
    ok(s, t);
}

static void test_layout(void **st) {
    (void)st;
    bad("{\"type\":\"object\"}", "{ }", 1);
    bad("{\"type\":\"array\"}", "[1, 2]", 3);
    bad("{\"type\":\"string\"}", "\"a\\/b\"", 3);   /* JSON.stringify writes no "\/" */
    bad("{\"type\":\"string\"}", "\"\\u0041\"", 5);  /* nor \u for a printable character */
    ok("{\"type\":\"string\"}", "\"\\u001f\\n\"");
    kvq_json_constraint *c = make("{\"type\":\"array\"}", 1);
    assert_int_equal(feed_bytes(c, "[\n  1, \"\\/\"\n]"), -1);
    kvq_json_constraint_free(c);
}

static void test_strict_and_ignored(void **st) {
    (void)st;
    static const char *refused[] = {"allOf", "not", "if", "patternProperties", "propertyNames", "minProperties",
                                    "uniqueItems", "contains", "prefixItems", "dependentRequired"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char schema[128], err[256] = "";
        snprintf(schema, sizeof schema, "{\"type\":\"object\",\"%s\":{}}", refused[i]);
        kvq_json_constraint *c = kvq_json_constraint_new(NULL, schema, 1, err, sizeof err);
        if (c || !strstr(err, refused[i]) || !strstr(err, "refuses")) fail_msg("%s: %s", schema, err);
        c = kvq_json_constraint_new(NULL, schema, 0, err, sizeof err); /* not strict: ignored, named */
        assert_non_null(c);
        assert_string_equal(kvq_json_constraint_ignored(c), refused[i]);
        kvq_json_constraint_free(c);
    }
    /* what strict accepts: every keyword OpenAI's strict mode takes */
    kvq_json_constraint *c = make("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1,"
                                  "\"exclusiveMinimum\":-1,\"exclusiveMaximum\":2,\"multipleOf\":0.5},"
                                  "\"b\":{\"type\":\"string\",\"pattern\":\"^a\",\"format\":\"email\"}},"
                                  "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}", 0);
    assert_string_equal(kvq_json_constraint_ignored(c), "");
    kvq_json_constraint_free(c);
    static const char *bad_schema[] = {
        "{\"type\":\"number\",\"minimum\":\"1\"}", "{\"type\":\"integer\",\"multipleOf\":0}",
        "{\"type\":\"number\",\"minimum\":2,\"maximum\":1}", "{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":1.9}",
        "{\"type\":\"string\",\"pattern\":\"[\"}", "{\"type\":\"string\",\"format\":\"uri\"}"};
    for (size_t i = 0; i < sizeof bad_schema / sizeof *bad_schema; i++) {
        char err[256] = "";
        if (kvq_json_constraint_new(NULL, bad_schema[i], 1, err, sizeof err) || !err[0]) fail_msg("accepted %s", bad_schema[i]);
    }
}

/* ---- sampling on the demo's vocabulary, checked by the rules themselves ---------- */

static const char *S_KW =
    "{\"type\":\"object\",\"properties\":{"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"temp\":{\"type\":\"number\",\"exclusiveMinimum\":-40,\"maximum\":60.5},"
    "\"step\":{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":-100,\"multipleOf\":25},"
    "\"price\":{\"type\":\"number\",\"minimum\":0,\"maximum\":100,\"multipleOf\":0.25},"
    "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{2,4}$\"},"
    "\"day\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"},"
    "\"name\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},"
    "\"fruit\":{\"anyOf\":[{\"enum\":[\"apple\",\"apricot\"]},{\"enum\":[\"april\"]}]}},"
    "\"required\":[\"age\",\"temp\",\"step\",\"price\",\"code\",\"day\",\"ip\",\"name\",\"fruit\"],"
    "\"additionalProperties\":false}";

static int code_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 6 || n > 8 || s[3] != '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (i != 3 && !(i < 3 ? (s[i] >= 'A' && s[i] <= 'Z') : (s[i] >= '0' && s[i] <= '9'))) return 0;
    return 1;
}

static int date_ok(const char *s) {
    int y, m, d;
    char tail;
    if (strlen(s) != 10 || sscanf(s, "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3) return 0;
    static const int days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100) || y % 400 == 0;
    return m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 && !leap ? 28 : days[m - 1]);
}

static int ipv4_ok(const char *s) {
    for (int part = 0; part < 4; part++) {
        if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) return 0;
        long v = strtol(s, (char **)&s, 10);
        if (v > 255 || (part < 3 && *s++ != '.')) return 0;
    }
    return !*s;
}

static int cps(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static const char *kw_check(const cJSON *v) {
    const cJSON *x;
#define NUM(k) ((x = cJSON_GetObjectItemCaseSensitive(v, k)) && cJSON_IsNumber(x))
#define STR(k) ((x = cJSON_GetObjectItemCaseSensitive(v, k)) && cJSON_IsString(x))
    if (!cJSON_IsObject(v) || cJSON_GetArraySize(v) != 9) return "not an object of 9 keys";
    if (!NUM("age") || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 || x->valuedouble > 150) return "age";
    if (!NUM("temp") || !(x->valuedouble > -40) || x->valuedouble > 60.5) return "temp";
    if (!NUM("step") || x->valuedouble < -1000 || x->valuedouble > -100 || fmod(x->valuedouble, 25) != 0) return "step";
    if (!NUM("price") || x->valuedouble < 0 || x->valuedouble > 100 || x->valuedouble / 0.25 != floor(x->valuedouble / 0.25)) return "price";
    if (!STR("code") || !code_ok(x->valuestring)) return "code";
    if (!STR("day") || !date_ok(x->valuestring)) return "day";
    if (!STR("ip") || !ipv4_ok(x->valuestring)) return "ip";
    if (!STR("name") || cps(x->valuestring) < 2 || cps(x->valuestring) > 5) return "name";
    if (!STR("fruit") || (strcmp(x->valuestring, "apple") && strcmp(x->valuestring, "apricot") && strcmp(x->valuestring, "april")))
        return "fruit";
    return NULL;
#undef NUM
#undef STR
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 16777216.0f;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void test_sample_keywords(void **st) {
    (void)st;
    kvq_tokenizer *tok = NULL;
    assert_int_equal(kvq_tokenizer_load(KVQ_SOURCE_DIR "/models/demo", &tok), KVQ_OK);
    int n = kvq_vocab_size(tok), completed = 0, steps = 0, refused = 0;
    float *lg = malloc(sizeof *lg * (size_t)n);
    double t_check = 0, t_mask = 0, t_sample = 0;
    kvq_sampler_params sp2 = kvq_sampler_default_params();
    sp2.seed = 99;
    kvq_sampler *s2 = kvq_sampler_new(&sp2); /* the whole constrained draw, timed on the side */
    for (int run = 0; run < 6; run++) {
        kvq_json_constraint *c = kvq_json_constraint_new(tok, S_KW, 1, NULL, 0);
        assert_non_null(c);
        kvq_sampler_params sp = kvq_sampler_default_params();
        sp.seed = (uint64_t)run, sp.top_k = 0, sp.top_p = 1, sp.min_p = 0, sp.temp = 1;
        kvq_sampler *s = kvq_sampler_new(&sp);
        int32_t ids[800];
        int nid = 0;
        while (nid < 800 && kvq_json_constraint_complete(c) < 2) {
            for (int i = 0; i < n; i++) lg[i] = urand() * 4;
            double ts = now_s();
            int32_t side = kvq_json_constraint_sample(c, s2, lg, n);
            t_sample += now_s() - ts;
            assert_true(kvq_token_is_eog(tok, side) || kvq_json_constraint_allows(c, side));
            int32_t id = kvq_sample(s, lg, n);
            double t0 = now_s();
            int allowed = kvq_json_constraint_allows(c, id);
            double t1 = now_s();
            t_check += t1 - t0;
            steps++;
            if (!allowed) {
                kvq_json_constraint_apply(c, lg, n);
                t_mask += now_s() - t1;
                refused++;
                id = kvq_sample(s, lg, n);
            }
            if (kvq_token_is_eog(tok, id)) break;
            assert_int_equal(kvq_json_constraint_accept(c, id), 0);
            ids[nid++] = id;
        }
        char text[8192];
        int len = kvq_detokenize(tok, ids, nid, 1, text, sizeof text);
        assert_true(len >= 0 && len < (int)sizeof text);
        if (getenv("KVQ_TEST_SHOW")) fprintf(stderr, "%d: %s\n", kvq_json_constraint_complete(c), text);
        if (kvq_json_constraint_complete(c)) {
            completed++;
            cJSON *v = cJSON_Parse(text);
            const char *why = v ? kw_check(v) : "does not parse";
            if (why) fail_msg("run %d: %s: %s", run, why, text);
            cJSON_Delete(v);
        }
        kvq_sampler_free(s);
        kvq_json_constraint_free(c);
    }
    print_message("keywords schema on the demo vocabulary: %d of 6 complete; one-token check %.2f us, "
                  "full mask %.2f ms (%d of %d steps refused the pick; random logits); "
                  "kvq_json_constraint_sample %.3f ms a step (forced text, check, mask when refused)\n",
                  completed, t_check / steps * 1e6, refused ? t_mask / refused * 1e3 : 0.0, refused, steps,
                  t_sample / steps * 1e3);
    kvq_sampler_free(s2);
    assert_true(completed >= 5);
    free(lg);
    kvq_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integers),     cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),      cmocka_unit_test(test_formats),
        cmocka_unit_test(test_anyof_alike),  cmocka_unit_test(test_layout),
        cmocka_unit_test(test_strict_and_ignored), cmocka_unit_test(test_sample_keywords),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
