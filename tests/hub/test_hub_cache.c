/* The hub code that needs no network: SHA-256, names, the index's shard list, and the cache
 * layout (refs, relative links into blobs, completeness of a snapshot). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hub/hub.h"

static void sha_of(const char *s, size_t n, size_t step, char out[65]) {
    kvq_sha256 h;
    kvq_sha256_init(&h);
    for (size_t i = 0; i < n; i += step) kvq_sha256_update(&h, s + i, n - i < step ? n - i : step);
    kvq_sha256_hex(&h, out);
}

static void test_sha256(void **state) {
    (void)state;
    char out[65];
    sha_of("", 0, 1, out);
    assert_string_equal(out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha_of("abc", 3, 1, out);
    assert_string_equal(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: padding spills a block */
    for (size_t step = 1; step <= 64; step += 7) {
        sha_of(two, strlen(two), step, out);
        assert_string_equal(out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    }
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    sha_of(a, 1000000, 4093, out);
    free(a);
    assert_string_equal(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_names(void **state) {
    (void)state;
    kvq_hub_name n;
    assert_true(kvq_hub_parse_name("ISTA-DASLab/Meta-Llama-3-8B-Instruct-AQLM-2Bit-1x16", &n));
    assert_string_equal(n.org, "ISTA-DASLab");
    assert_string_equal(n.rev, "main");
    assert_true(kvq_hub_parse_name("a/b.c_d:v1.0", &n));
    assert_string_equal(n.name, "b.c_d");
    assert_string_equal(n.rev, "v1.0");
    assert_string_equal(n.repo, "a/b.c_d");
    static const char *const bad[] = {"a", "a/b/c", "/a/b", "./a", "../a", "a/..", "a/b..c", "a/b:", "a/b:..", ".a/b", "-a/b",
                                      "a/", "/b", "a b/c", "a/b:x/y", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (kvq_hub_parse_name(bad[i], &n)) fail_msg("'%s' read as a hub name", bad[i]);
    assert_true(kvq_hub_safe_file_name("model.safetensors"));
    assert_true(kvq_hub_safe_file_name("sub/model-00001.safetensors"));
    static const char *const unsafe[] = {"", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", ".", "a\\b"};
    for (size_t i = 0; i < sizeof unsafe / sizeof *unsafe; i++)
        if (kvq_hub_safe_file_name(unsafe[i])) fail_msg("'%s' taken as safe", unsafe[i]);
}

static void test_index(void **state) {
    (void)state;
    kvq_hub_files f = {0};
    assert_int_equal(kvq_hub_index_shards("{\"metadata\":{},\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\",\"c\":\"m-1.safetensors\"}}",
                                          "idx", &f), KVQ_OK);
    assert_int_equal(f.n, 2);
    assert_string_equal(f.names[1], "m-2.safetensors");
    kvq_hub_files_free(&f);
    static const char *const bad[] = {"{}", "[]", "{\"weight_map\":{}}", "{\"weight_map\":{\"a\":1}}", "{\"weight_map\":{\"a\":\"../x\"}}", "not json"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (kvq_hub_index_shards(bad[i], "idx", &f) == KVQ_OK) fail_msg("index '%s' accepted", bad[i]);
        kvq_hub_files_free(&f);
    }
}

static void put(const char *dir, const char *name, const char *text) {
    char p[8400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_cache_layout(void **state) {
    (void)state;
    char root[] = "/tmp/kvq-hub-cache-XXXXXX";
    assert_non_null(mkdtemp(root));
    setenv("HF_HUB_CACHE", root, 1);
    kvq_hub_name n;
    assert_true(kvq_hub_parse_name("org/model", &n));
    char repo[4096], want[4200], blobs[4200], snap[4200], buf[256];
    (void)want;
    assert_int_equal(kvq_hub_repo_dir(&n, repo, sizeof repo), 0);
    snprintf(want, sizeof want, "%s/models--org--model", root);
    assert_string_equal(repo, want);

    char commit[41];
    assert_int_equal(kvq_hub_cache_commit(repo, "main", commit), -1);
    const char *c = "0123456789abcdef0123456789abcdef01234567";
    assert_int_equal(kvq_hub_write_ref(repo, "main", c), KVQ_OK);
    assert_int_equal(kvq_hub_cache_commit(repo, "main", commit), 0);
    assert_string_equal(commit, c);
    assert_int_equal(kvq_hub_cache_commit(repo, c, commit), 0); /* a commit names itself */
    snprintf(want, sizeof want, "%s/refs/dev", repo);
    put(repo, "refs/dev", "not-a-commit\n");
    assert_int_equal(kvq_hub_cache_commit(repo, "dev", commit), -1);

    snprintf(blobs, sizeof blobs, "%s/blobs", repo);
    assert_int_equal(kvq_hub_mkdirs(blobs), 0);
    put(blobs, "c0", "{}");
    put(blobs, "t0", "{}");
    put(blobs, "w0", "weights");
    assert_int_equal(kvq_hub_link_blob(repo, c, "config.json", "c0"), KVQ_OK);
    assert_int_equal(kvq_hub_snapshot_dir(repo, c, snap, sizeof snap), 0);
    assert_string_equal(kvq_hub_snapshot_missing(snap, 0, buf, sizeof buf), "tokenizer.json");
    assert_int_equal(kvq_hub_link_blob(repo, c, "tokenizer.json", "t0"), KVQ_OK);
    assert_null(kvq_hub_snapshot_missing(snap, 0, buf, sizeof buf));
    assert_string_equal(kvq_hub_snapshot_missing(snap, 1, buf, sizeof buf), "model.safetensors");
    assert_int_equal(kvq_hub_link_blob(repo, c, "model.safetensors", "w0"), KVQ_OK);
    assert_null(kvq_hub_snapshot_missing(snap, 1, buf, sizeof buf));

    /* links are relative, one "../" more per sub-folder, and replace an older link */
    char p[4300], link[256];
    snprintf(p, sizeof p, "%s/config.json", snap);
    ssize_t l = readlink(p, link, sizeof link - 1);
    assert_true(l > 0);
    link[l] = 0;
    assert_string_equal(link, "../../blobs/c0");
    assert_int_equal(kvq_hub_link_blob(repo, c, "sub/dir/x.json", "t0"), KVQ_OK);
    snprintf(p, sizeof p, "%s/sub/dir/x.json", snap);
    l = readlink(p, link, sizeof link - 1);
    link[l] = 0;
    assert_string_equal(link, "../../../../blobs/t0");
    assert_int_equal(kvq_hub_link_blob(repo, c, "config.json", "t0"), KVQ_OK);

    /* a sharded snapshot: a dangling index link, then a missing shard, is incomplete */
    const char *c2 = "1123456789abcdef0123456789abcdef01234567";
    char snap2[4200];
    assert_int_equal(kvq_hub_snapshot_dir(repo, c2, snap2, sizeof snap2), 0);
    assert_int_equal(kvq_hub_link_blob(repo, c2, "config.json", "c0"), KVQ_OK);
    assert_int_equal(kvq_hub_link_blob(repo, c2, "tokenizer.json", "t0"), KVQ_OK);
    assert_int_equal(kvq_hub_link_blob(repo, c2, "model.safetensors.index.json", "idx"), KVQ_OK);
    const char *m = kvq_hub_snapshot_missing(snap2, 1, buf, sizeof buf);
    assert_non_null(m);
    assert_string_equal(m, "model.safetensors");
    put(blobs, "idx", "{\"weight_map\":{\"a\":\"model-1.safetensors\"}}");
    m = kvq_hub_snapshot_missing(snap2, 1, buf, sizeof buf);
    assert_non_null(m);
    assert_string_equal(m, "model-1.safetensors");
    assert_int_equal(kvq_hub_link_blob(repo, c2, "model-1.safetensors", "w0"), KVQ_OK);
    assert_null(kvq_hub_snapshot_missing(snap2, 1, buf, sizeof buf));

    assert_false(kvq_hub_is_absent(repo, c, "generation_config.json"));
    kvq_hub_mark_absent(repo, c, "generation_config.json");
    assert_true(kvq_hub_is_absent(repo, c, "generation_config.json"));

    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
    unsetenv("HF_HUB_CACHE");
}

static void test_env(void **state) {
    (void)state;
    char buf[4096];
    unsetenv("HF_HUB_CACHE");
    unsetenv("HUGGINGFACE_HUB_CACHE");
    setenv("HF_HOME", "/x/hf", 1);
    assert_int_equal(kvq_hub_cache_root(buf, sizeof buf), 0);
    assert_string_equal(buf, "/x/hf/hub");
    unsetenv("HF_HOME");
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    assert_int_equal(kvq_hub_cache_root(buf, sizeof buf), 0);
    assert_string_equal(buf, "/x/cache/huggingface/hub");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    assert_int_equal(kvq_hub_cache_root(buf, sizeof buf), 0);
    assert_string_equal(buf, "/home/u/.cache/huggingface/hub");
    setenv("HF_ENDPOINT", "http://127.0.0.1:9//", 1);
    assert_string_equal(kvq_hub_endpoint(buf, sizeof buf), "http://127.0.0.1:9");
    unsetenv("HF_ENDPOINT");
    assert_string_equal(kvq_hub_endpoint(buf, sizeof buf), "https://huggingface.co");
    setenv("HF_TOKEN", "hf_abc\n", 1);
    kvq_hub_token(buf, sizeof buf);
    assert_string_equal(buf, "hf_abc");
    setenv("HF_TOKEN", "hf a", 1); /* no header injection through the token */
    kvq_hub_token(buf, sizeof buf);
    assert_string_equal(buf, "");
    unsetenv("HF_TOKEN");
    setenv("HF_HUB_OFFLINE", "1", 1);
    assert_true(kvq_hub_offline());
    setenv("HF_HUB_OFFLINE", "0", 1);
    assert_false(kvq_hub_offline());
    unsetenv("HF_HUB_OFFLINE");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sha256), cmocka_unit_test(test_names), cmocka_unit_test(test_index),
                                       cmocka_unit_test(test_cache_layout), cmocka_unit_test(test_env)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
