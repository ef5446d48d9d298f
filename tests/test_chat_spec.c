/* kvq-chat --draft / --lookup: greedy output is byte for byte the output without them (one-shot
 * and a conversation whose context shifts inside replies), the timing line counts drafts, and a
 * draft with another vocabulary, or with --json, is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define DEMO KVQ_SOURCE_DIR "/models/demo"

/* kvq-chat on the demo model: stdout returned, stderr in *err (both malloc'd). */
static char *chat(const char *args, int *status, char **err) {
    char cmd[4096], path[512];
    snprintf(path, sizeof path, "%s/err.txt", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "HOME=%s %s/kvq-chat -t 1 --backend cpu -m %s --temp 0 %s 2>%s", tu_tmpdir(), KVQ_TOOLS_DIR,
             DEMO, args, path);
    char *out = tu_run(cmd, status);
    *err = tu_read_file(path, NULL);
    return out;
}

/* The drafted count on the timing line ("drafted N,"), -1 when there is none. */
static long drafted(const char *err) {
    const char *p = strstr(err, "drafted ");
    return p ? strtol(p + 8, NULL, 10) : -1;
}

static void same_as_plain(const char *base_args) {
    const char *spec[] = {"--draft " DEMO, "--draft " DEMO " --draft-max 3", "--lookup 2"};
    int status;
    char *err, args[2048];
    char *plain = chat(base_args, &status, &err);
    assert_int_equal(status, 0);
    assert_true(strlen(plain) > 40);
    assert_int_equal(drafted(err), -1);
    free(err);
    for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
        snprintf(args, sizeof args, "%s %s", base_args, spec[i]);
        char *out = chat(args, &status, &err);
        assert_int_equal(status, 0);
        if (strcmp(out, plain)) fail_msg("%s: output differs\n--- plain:\n%s\n--- with it:\n%s", spec[i], plain, out);
        if (drafted(err) <= 0) fail_msg("%s: no drafts on the timing line:\n%s", spec[i], err);
        free(out);
        free(err);
    }
    free(plain);
}

static void test_one_shot(void **st) {
    (void)st;
    /* a repeated phrase, so lookup finds n-grams; -n 37 ends inside a step */
    same_as_plain("-p 'The city of the river. The city of the river. The city' -n 37 --ignore-eos");
    same_as_plain("-p 'He said that' -n 50");
}

static void test_conversation(void **st) {
    (void)st;
    char path[512], args[1024];
    snprintf(path, sizeof path, "%s/turns.txt", tu_tmpdir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("Hello there\nTell me about the city\nAnd the river\n", f);
    fclose(f);
    /* -c 48 with --ignore-eos: replies run into full contexts, which shift inside them */
    snprintf(args, sizeof args, "-c 48 -n 70 --ignore-eos < %s", path);
    same_as_plain(args);
}

static void test_refused(void **st) {
    (void)st;
    int status;
    char *err, args[1024];
    free(chat("-p x --json --lookup 2", &status, &err));
    assert_int_not_equal(status, 0);
    assert_non_null(strstr(err, "--lookup"));
    free(err);
    const char *other = tu_fixture("models/llama3-tiny-aqlm-1x16g16");
    TU_NEED_FIXTURE(other);
    snprintf(args, sizeof args, "-p x --draft %s", other);
    free(chat(args, &status, &err));
    assert_int_not_equal(status, 0);
    /* the last line names the draft and says what differs */
    char *last = err + strlen(err);
    while (last > err && last[-1] == '\n') *--last = 0;
    while (last > err && last[-1] != '\n') last--;
    if (!strstr(last, other) || !strstr(last, "vocabulary")) fail_msg("refusal line: %s", last);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_one_shot), cmocka_unit_test(test_conversation),
                                       cmocka_unit_test(test_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
