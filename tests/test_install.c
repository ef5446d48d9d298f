/* Installs this build into a temporary prefix and uses it as a new user would:
 * builds a small program with `pkg-config --cflags --libs kvq` (shared library)
 * and with `--static` (libkvq.a), runs both on the installed demo model, and
 * checks libkvq.so exports exactly the functions kvq.h declares. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define SAN_FLAGS "-fsanitize=address,undefined"
#else
#define SAN_FLAGS ""
#endif

static char g_prefix[512], g_pc[700];

static const char PROG[] =
    "#include <stdio.h>\n"
    "#include <string.h>\n"
    "#include <kvq.h>\n"
    "int main(void) {\n"
    "    const char *dir = kvq_demo_model_dir();\n"
    "    if (!dir) { fprintf(stderr, \"no demo model\\n\"); return 2; }\n"
    "    kvq_model *m; kvq_context *c;\n"
    "    if (kvq_model_load(dir, NULL, &m) != KVQ_OK) { fprintf(stderr, \"%s\\n\", kvq_last_error()); return 3; }\n"
    "    if (kvq_context_new(m, NULL, &c) != KVQ_OK) { fprintf(stderr, \"%s\\n\", kvq_last_error()); return 4; }\n"
    "    int32_t ids[64];\n"
    "    int n = kvq_tokenize(kvq_model_tokenizer(m), \"The jury said\", 13, 1, ids, 64);\n"
    "    if (n < 2 || kvq_eval(c, ids, n) != KVQ_OK) { fprintf(stderr, \"%s\\n\", kvq_last_error()); return 5; }\n"
    "    const float *l = kvq_logits(c);\n"
    "    int best = 0;\n"
    "    for (int i = 1; i < kvq_model_n_vocab(m); i++) if (l[i] > l[best]) best = i;\n"
    "    printf(\"version %s\\ndir %s\\ntokens %d\\nnext %d\\n\", kvq_version(), dir, n, best);\n"
    "    kvq_context_free(c);\n"
    "    kvq_model_free(m);\n"
    "    return 0;\n"
    "}\n";

static char *sh(const char *fmt, const char *a, const char *b, int want_ok) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    int st;
    char *out = tu_run(cmd, &st);
    if (want_ok && st != 0) fail_msg("command failed (%d): %s\n%s", st, cmd, out);
    return out;
}

static int setup(void **state) {
    snprintf(g_prefix, sizeof g_prefix, "%s/prefix", tu_tmpdir());
    free(sh("cmake --install '%s' --prefix '%s' 2>&1", KVQ_TOOLS_DIR, g_prefix, 1));
    char *pc = sh("find '%s' -name kvq.pc%s", g_prefix, "", 1);
    pc[strcspn(pc, "\n")] = 0;
    if (!pc[0]) fail_msg("kvq.pc not installed under %s", g_prefix);
    char *slash = strrchr(pc, '/');
    *slash = 0;
    snprintf(g_pc, sizeof g_pc, "%s", pc);
    free(pc);
    char p[800];
    snprintf(p, sizeof p, "%s/prog.c", tu_tmpdir());
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(PROG, f);
    fclose(f);
    return 0;
}

/* kvq.pc must not hold the configure-time prefix: the install was elsewhere. */
static void test_pc_relative(void **state) {
    char *v = sh("PKG_CONFIG_PATH='%s' pkg-config --variable=prefix kvq%s", g_pc, "", 1);
    if (!strstr(v, g_prefix)) fail_msg("prefix '%s' is not under %s", v, g_prefix);
    free(v);
    v = sh("PKG_CONFIG_PATH='%s' pkg-config --modversion kvq%s", g_pc, "", 1);
    assert_true(v[0] >= '0' && v[0] <= '9');
    free(v);
}

static void run_prog(const char *exe, const char *env) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd / && env -u KVQ_DEMO_MODEL %s '%s/%s'", env, tu_tmpdir(), exe);
    int st;
    char *out = tu_run(cmd, &st);
    if (st != 0) fail_msg("%s exited %d: %s", exe, st, out);
    if (!strstr(out, "version ") || !strstr(out, "next ")) fail_msg("%s printed '%s'", exe, out);
    /* the demo model is found through the install layout, not the source tree */
    if (!strstr(out, g_prefix)) fail_msg("%s did not find the installed demo model: %s", exe, out);
    free(out);
}

static void test_shared(void **state) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && PKG_CONFIG_PATH='%s' && export PKG_CONFIG_PATH && ${CC:-cc} " SAN_FLAGS
             " prog.c -o prog_shared $(pkg-config --cflags --libs kvq) 2>&1",
             tu_tmpdir(), g_pc);
    int st;
    char *out = tu_run(cmd, &st);
    if (st) fail_msg("shared build failed: %s\n%s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd, "readelf -d '%s/prog_shared' | grep NEEDED", tu_tmpdir());
    out = tu_run(cmd, &st);
    if (!strstr(out, "libkvq.so.0")) fail_msg("prog_shared does not need libkvq.so.0: %s", out);
    free(out);
    char env[1024];
    snprintf(env, sizeof env, "LD_LIBRARY_PATH='%s/..'", g_pc);
    run_prog("prog_shared", env);
}

static void test_static(void **state) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && PKG_CONFIG_PATH='%s' && export PKG_CONFIG_PATH && ${CC:-cc} " SAN_FLAGS
             " prog.c -o prog_static $(pkg-config --cflags kvq) -Wl,-Bstatic $(pkg-config --static --libs kvq) 2>&1",
             tu_tmpdir(), g_pc);
    int st;
    char *out = tu_run(cmd, &st);
    if (st) fail_msg("static build failed: %s\n%s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd, "readelf -d '%s/prog_static' | grep NEEDED", tu_tmpdir());
    out = tu_run(cmd, &st);
    if (strstr(out, "libkvq")) fail_msg("prog_static still needs libkvq: %s", out);
    free(out);
    /* a program outside the prefix finds the demo model through KVQ_DEMO_MODEL, which kvq.pc names */
    char *demo = sh("PKG_CONFIG_PATH='%s' pkg-config --variable=demo_model kvq%s", g_pc, "", 1);
    demo[strcspn(demo, "\n")] = 0;
    char env[1024];
    snprintf(env, sizeof env, "KVQ_DEMO_MODEL='%s'", demo);
    free(demo);
    run_prog("prog_static", env);
}

/* Exported = declared: every kvq.h function, nothing else (no internal kvq_ or tk_ symbols). */
static void test_exports(void **state) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s/../libkvq.so' | awk '$2 ~ /^[TtWiDdBbRrVv]$/ {print $3}' | sort", g_pc);
    int st;
    char *exp = tu_run(cmd, &st);
    assert_int_equal(st, 0);
    snprintf(cmd, sizeof cmd,
             "grep -o '^KVQ_API[^(]*(' '%s/include/kvq.h' | sed 's/($//; s/.*[ *]//' | sort",
             KVQ_SOURCE_DIR);
    char *decl = tu_run(cmd, &st);
    assert_int_equal(st, 0);
    int n = 0;
    for (char *p = decl; *p; n++) p = strchr(p, '\n') + 1;
    if (n < 30 || strcmp(exp, decl) != 0) fail_msg("libkvq.so exports:\n%s\nkvq.h declares (%d):\n%s", exp, n, decl);
    free(exp);
    free(decl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pc_relative),
        cmocka_unit_test(test_exports),
        cmocka_unit_test(test_shared),
        cmocka_unit_test(test_static),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
