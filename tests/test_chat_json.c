/* kvq-chat --json-schema FILE / --json on the demo model (it writes nonsense, so only the
 * constraint makes the replies JSON): each completed reply parses and follows the schema;
 * a schema outside the strict subset, or the flags without -p, are errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
    "\"age\":{\"type\":\"integer\"},\"role\":{\"enum\":[\"admin\",\"user\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6},\"maxItems\":2}},"
    "\"required\":[\"name\",\"age\",\"role\",\"tags\"],\"additionalProperties\":false}";

static char *write_tmp(const char *name, const char *text) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static char *chat(const char *args, int *status) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "HOME=%s %s/kvq-chat -t 1 --no-display-prompt %s 2>/dev/null", tu_tmpdir(), KVQ_TOOLS_DIR, args);
    return tu_run(cmd, status);
}

static void check_person(const cJSON *v, const char *text) {
    if (!cJSON_IsObject(v)) fail_msg("not an object: %s", text);
    const cJSON *name = cJSON_GetObjectItem(v, "name"), *age = cJSON_GetObjectItem(v, "age");
    const cJSON *role = cJSON_GetObjectItem(v, "role"), *tags = cJSON_GetObjectItem(v, "tags");
    if (cJSON_GetArraySize(v) != 4 || !cJSON_IsString(name) || !cJSON_IsNumber(age) || !cJSON_IsString(role) ||
        !cJSON_IsArray(tags))
        fail_msg("fields: %s", text);
    if (strlen(name->valuestring) > 10 || (strcmp(role->valuestring, "admin") && strcmp(role->valuestring, "user")))
        fail_msg("name or role: %s", text);
    if (age->valuedouble != floor(age->valuedouble)) fail_msg("age is not an integer: %s", text);
    if (cJSON_GetArraySize(tags) > 2) fail_msg("tags: %s", text);
    const cJSON *t;
    cJSON_ArrayForEach(t, tags) if (!cJSON_IsString(t) || strlen(t->valuestring) > 6) fail_msg("tag: %s", text);
}

static void test_schema_replies(void **st) {
    (void)st;
    char args[2048];
    const char *path = write_tmp("person.json", SCHEMA);
    int complete = 0;
    for (int seed = 1; seed <= 4; seed++) {
        snprintf(args, sizeof args, "-p 'A person:' --json-schema %s --seed %d --temp %.1f -n 400", path, seed,
                 0.5 + 0.25 * seed);
        int status;
        char *out = chat(args, &status);
        assert_int_equal(status, 0);
        cJSON *v = cJSON_Parse(out);
        if (v) {
            check_person(v, out);
            complete++;
            cJSON_Delete(v);
        }
        free(out);
    }
    if (complete < 2) fail_msg("only %d of 4 replies were complete JSON values", complete);
    /* --json: any object */
    int status;
    char *out = chat("-p 'x' --json --seed 7 --temp 0 -n 400", &status);
    assert_int_equal(status, 0);
    cJSON *v = cJSON_Parse(out);
    if (v && !cJSON_IsObject(v)) fail_msg("--json gave a non-object: %s", out);
    cJSON_Delete(v);
    free(out);
}

static void test_bad_use(void **st) {
    (void)st;
    int status;
    char args[2048];
    snprintf(args, sizeof args, "-p x --json-schema %s", write_tmp("bad.json", "{\"type\":\"string\",\"pattern\":\"(a\"}"));
    free(chat(args, &status));
    assert_int_not_equal(status, 0);
    snprintf(args, sizeof args, "-p x --json-schema %s", write_tmp("empty.json", " \n"));
    free(chat(args, &status));
    assert_int_not_equal(status, 0);
    free(chat("--json < /dev/null", &status));
    assert_int_not_equal(status, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_schema_replies), cmocka_unit_test(test_bad_use)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
