/* kvq-bench spec on the demo model: the line has every field, the speculative tokens equal
 * plain decode's (same=1) and drafts were made; a wrong pairing of options is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static char *bench(const char *args, int *status) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/kvq-bench spec -t 1 -n 12 %s 2>/dev/null", KVQ_TOOLS_DIR, args);
    return tu_run(cmd, status);
}

static void check_line(const char *args, const char *name) {
    int status;
    char *out = bench(args, &status);
    assert_int_equal(status, 0);
    const char *keys[] = {"k=", "accept_rate=", "tokens_per_step=", "tg_tps=", "tg_base_tps=", "speedup=", "verify_ratio=",
                          "free_draft_speedup="};
    if (strncmp(out, "spec draft=", 11) || strncmp(out + 11, name, strlen(name))) fail_msg("line: %s", out);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strstr(out, keys[i])) fail_msg("no %s in: %s", keys[i], out);
    if (!strstr(out, " same=1")) fail_msg("not plain decode's tokens: %s", out);
    const char *d = strstr(out, " drafted=");
    if (!d || strtol(d + 9, NULL, 10) <= 0) fail_msg("no drafts: %s", out);
    free(out);
}

static void test_spec_line(void **st) {
    (void)st;
    check_line("--draft self --draft-max 3", "self");
    check_line("--lookup 2", "lookup");
    int status;
    free(bench("", &status)); /* neither --draft nor --lookup */
    assert_int_not_equal(status, 0);
    free(bench("--draft self --lookup 2", &status));
    assert_int_not_equal(status, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_spec_line)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
