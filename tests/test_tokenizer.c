/* Tokenizer tests: the HF fixtures (ids, decode, streaming), brown round trips,
 * older tokenizer.json layouts, small hand-made tokenizers for the rarer
 * pipeline parts, malformed files, the model directories and kvq-tokenize. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvq.h"
#include "testutil.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static kvq_tokenizer *load_dir(const char *dir) {
    kvq_tokenizer *t = NULL;
    kvq_status st = kvq_tokenizer_load(dir, &t);
    if (st != KVQ_OK) fail_msg("loading %s: %s", dir, kvq_last_error());
    return t;
}

/* Tokenizes into a malloc'd array; *n gets the count. */
static int32_t *encode(const kvq_tokenizer *t, const char *s, size_t len, int bos, int *n) {
    int k = kvq_tokenize(t, s, len, bos, NULL, 0);
    assert_true(k >= 0);
    int32_t *ids = malloc(((size_t)k + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(kvq_tokenize(t, s, len, bos, ids, k), k);
    *n = k;
    return ids;
}

static char *decode(const kvq_tokenizer *t, const int32_t *ids, int n, int skip) {
    int len = kvq_detokenize(t, ids, n, skip, NULL, 0);
    assert_true(len >= 0);
    char *s = malloc((size_t)len + 1);
    assert_non_null(s);
    assert_int_equal(kvq_detokenize(t, ids, n, skip, s, (size_t)len + 1), len);
    return s;
}

/* Streams ids through kvq_detok with a small buffer; every piece must be whole
 * UTF-8 characters, and the concatenation must equal the one-shot decode. */
static void check_stream(const kvq_tokenizer *t, const int32_t *ids, int n, int skip) {
    char *full = decode(t, ids, n, skip);
    size_t cap = strlen(full) + 64, len = 0;
    char *acc = calloc(cap, 1), piece[64];
    assert_non_null(acc);
    kvq_detok *d = kvq_detok_new(t, skip);
    assert_non_null(d);
    for (int i = 0; i <= n + 8; i++) {
        int k = i < n ? kvq_detok_push(d, ids[i], piece, sizeof piece) : kvq_detok_flush(d, piece, sizeof piece);
        assert_true(k >= 0);
        assert_int_equal((size_t)k, strlen(piece));
        /* never ends inside a character */
        if (k > 0) {
            int j = k - 1;
            while (j > 0 && ((unsigned char)piece[j] & 0xC0) == 0x80) j--;
            unsigned char lead = (unsigned char)piece[j];
            int need = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            assert_int_equal(k - j, need);
        }
        assert_true(len + (size_t)k < cap);
        memcpy(acc + len, piece, (size_t)k);
        len += (size_t)k;
    }
    acc[len] = 0;
    assert_string_equal(acc, full);
    kvq_detok_free(d);
    free(acc);
    free(full);
}

static void check_ids(const int32_t *got, int n, const cJSON *want, const char *text) {
    int m = cJSON_GetArraySize(want), same = n == m;
    for (int i = 0; same && i < n; i++) same = got[i] == cJSON_GetArrayItem(want, i)->valueint;
    if (!same) {
        char buf[2048];
        int off = snprintf(buf, sizeof buf, "ids of \"%s\": got", text);
        for (int i = 0; i < n && off < 1900; i++) off += snprintf(buf + off, sizeof buf - (size_t)off, " %d", got[i]);
        fail_msg("%s (want %d ids)", buf, m);
    }
}

/* Every expected.json entry: exact ids, HF decode, round trip, streaming, BOS. */
static void check_fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    const char *p = tu_fixture(rel);
    TU_NEED_FIXTURE(p);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", p);
    kvq_tokenizer *t = load_dir(dir);
    snprintf(rel, sizeof rel, "tokenizers/%s/expected.json", name);
    char *js = tu_read_file(tu_fixture(rel), NULL);
    cJSON *ex = cJSON_Parse(js);
    assert_non_null(ex);
    int entries = 0;
    for (const cJSON *e = ex->child; e; e = e->next, entries++) {
        const char *text = cJSON_GetObjectItem(e, "text")->valuestring;
        const char *want = cJSON_GetObjectItem(e, "decoded")->valuestring;
        int n;
        int32_t *ids = encode(t, text, strlen(text), 0, &n);
        check_ids(ids, n, cJSON_GetObjectItem(e, "ids"), text);
        char *got = decode(t, ids, n, 0);
        assert_string_equal(got, want);
        if (!strcmp(want, text)) assert_string_equal(got, text); /* decode(encode(s)) == s */
        check_stream(t, ids, n, 0);
        check_stream(t, ids, n, 1);
        int nb;
        int32_t *with_bos = encode(t, text, strlen(text), 1, &nb);
        assert_int_equal(nb, n + 1);
        assert_int_equal(with_bos[0], kvq_token_bos(t));
        assert_memory_equal(with_bos + 1, ids, (size_t)n * sizeof *ids);
        free(with_bos);
        free(got);
        free(ids);
    }
    assert_true(entries > 10);
    cJSON_Delete(ex);
    free(js);
    kvq_tokenizer_free(t);
}

static void test_fixture_llama2(void **state) { (void)state; check_fixture("llama2"); }
static void test_fixture_mistral(void **state) { (void)state; check_fixture("mistral"); }
static void test_fixture_llama3(void **state) { (void)state; check_fixture("llama3"); }

static void check_brown(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    const char *p = tu_fixture(rel);
    TU_NEED_FIXTURE(p);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", p);
    const char *tp = tu_fixture("text/brown-valid.txt");
    TU_NEED_FIXTURE(tp);
    size_t len;
    char *text = tu_read_file(tp, &len);
    double t0 = now();
    kvq_tokenizer *t = load_dir(dir);
    double t1 = now();
    int n;
    int32_t *ids = encode(t, text, len, 0, &n);
    double t2 = now();
    char *back = decode(t, ids, n, 0);
    double t3 = now();
    print_message("%s: load %.3f s, encode %zu bytes -> %d ids %.3f s (x2: count + fill), decode %.3f s\n", name,
                  t1 - t0, len, n, t2 - t1, t3 - t2);
    assert_true(n > 100000);
    assert_int_equal(strlen(back), len);
    assert_true(!memcmp(back, text, len));
    check_stream(t, ids, n < 5000 ? n : 5000, 0);
    free(back);
    free(ids);
    free(text);
    kvq_tokenizer_free(t);
}

static void test_brown_llama2(void **state) { (void)state; check_brown("llama2"); }
static void test_brown_llama3(void **state) { (void)state; check_brown("llama3"); }

/* ---- helpers for writing tokenizer directories ---------------------------------- */

static const char *make_dir(const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    mkdir(path, 0755);
    return path;
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void write_json(const char *dir, const cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    assert_non_null(s);
    write_file(dir, "tokenizer.json", s);
    free(s);
}

/* ---- older tokenizer.json layouts ---------------------------------------------- */

typedef struct {
    const char *what;
    int skip_leading_space; /* HF's Metaspace adds no "▁" before one already there */
    int skip_double_space;  /* split=true cuts "▁▁" apart */
    int skip_special_mid;   /* prepend_scheme "first": no "▁" after a leading special token */
} variant_rules;

static void check_variant(const char *dir, const cJSON *expected, variant_rules r) {
    kvq_tokenizer *t = load_dir(dir);
    int checked = 0;
    for (const cJSON *e = expected->child; e; e = e->next) {
        const char *text = cJSON_GetObjectItem(e, "text")->valuestring;
        int n;
        int32_t *ids = encode(t, text, strlen(text), 0, &n);
        char *back = decode(t, ids, n, 0);
        /* whatever the rules, the text must come back */
        if (!strstr(text, "<s>")) assert_string_equal(back, r.skip_leading_space && text[0] == ' ' ? back : text);
        int skip = (r.skip_leading_space && text[0] == ' ') || (r.skip_double_space && strstr(text, "  ")) ||
                   (r.skip_special_mid && strstr(text, "<s>"));
        if (!skip) {
            check_ids(ids, n, cJSON_GetObjectItem(e, "ids"), text);
            checked++;
        }
        free(back);
        free(ids);
    }
    print_message("%s: %d entries with identical ids\n", r.what, checked);
    assert_true(checked >= 10);
    kvq_tokenizer_free(t);
}

static void test_generation_variants(void **state) {
    (void)state;
    const char *src = tu_fixture("tokenizers/llama2/tokenizer.json");
    TU_NEED_FIXTURE(src);
    char *js = tu_read_file(src, NULL);
    char *exp_js = tu_read_file(tu_fixture("tokenizers/llama2/expected.json"), NULL);
    cJSON *expected = cJSON_Parse(exp_js);
    cJSON *root = cJSON_Parse(js);
    assert_non_null(root);
    assert_non_null(expected);

    /* merges as ["a", "b"] pairs: identical ids everywhere */
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON *pairs = cJSON_CreateArray();
    for (const cJSON *m = cJSON_GetObjectItem(model, "merges")->child; m; m = m->next) {
        char *sp = strchr(m->valuestring, ' ');
        assert_non_null(sp);
        *sp = 0;
        const char *ab[2] = {m->valuestring, sp + 1};
        cJSON_AddItemToArray(pairs, cJSON_CreateStringArray(ab, 2));
        *sp = ' ';
    }
    cJSON_ReplaceItemInObject(model, "merges", pairs);
    const char *dir = make_dir("llama2-pairs");
    write_json(dir, root);
    check_variant(dir, expected, (variant_rules){"pairs merges", 0, 0, 0});

    /* Metaspace pre-tokenizer instead of the Prepend+Replace normalizer */
    cJSON_ReplaceItemInObject(root, "normalizer", cJSON_CreateNull());
    cJSON *ms = cJSON_CreateObject();
    cJSON_AddStringToObject(ms, "type", "Metaspace");
    cJSON_AddStringToObject(ms, "replacement", "\xe2\x96\x81");
    cJSON_AddStringToObject(ms, "prepend_scheme", "always");
    cJSON_AddBoolToObject(ms, "split", 0);
    cJSON_ReplaceItemInObject(root, "pre_tokenizer", ms);
    dir = make_dir("llama2-metaspace-always");
    write_json(dir, root);
    check_variant(dir, expected, (variant_rules){"Metaspace always", 1, 0, 0});

    cJSON_ReplaceItemInObject(ms, "prepend_scheme", cJSON_CreateString("first"));
    dir = make_dir("llama2-metaspace-first");
    write_json(dir, root);
    check_variant(dir, expected, (variant_rules){"Metaspace first", 1, 0, 1});
    {
        /* "first": the segment after a leading <s> gets no "▁" (HF offsets rule) */
        kvq_tokenizer *t = load_dir(dir);
        int32_t ids[16];
        int n = kvq_tokenize(t, "<s>not", 6, 0, ids, 16);
        assert_true(n >= 2);
        assert_int_equal(ids[0], 1);
        assert_int_not_equal(ids[1], 451); /* "▁not" */
        kvq_tokenizer_free(t);
    }

    /* the oldest form: Metaspace with add_prefix_space and (implicit) split */
    cJSON_DeleteItemFromObject(ms, "prepend_scheme");
    cJSON_DeleteItemFromObject(ms, "split");
    cJSON_AddBoolToObject(ms, "add_prefix_space", 1);
    dir = make_dir("llama2-metaspace-legacy");
    write_json(dir, root);
    check_variant(dir, expected, (variant_rules){"Metaspace legacy", 1, 1, 0});

    /* a Metaspace decoder decodes plain pieces the same way */
    cJSON *md = cJSON_CreateObject();
    cJSON_AddStringToObject(md, "type", "Metaspace");
    cJSON_AddStringToObject(md, "replacement", "\xe2\x96\x81");
    cJSON_AddBoolToObject(md, "add_prefix_space", 1);
    cJSON_ReplaceItemInObject(root, "decoder", md);
    dir = make_dir("llama2-metaspace-decoder");
    write_json(dir, root);
    {
        kvq_tokenizer *t = load_dir(dir);
        const int32_t ids[] = {9038, 2501, 263, 931, 29892}; /* "Once upon a time," */
        char *s = decode(t, ids, 5, 0);
        assert_string_equal(s, "Once upon a time,");
        free(s);
        check_stream(t, ids, 5, 0);
        kvq_tokenizer_free(t);
    }
    cJSON_Delete(root);
    cJSON_Delete(expected);
    free(js);
    free(exp_js);
}

/* ---- hand-made tokenizers ---------------------------------------------------------- */

/* GPT-2 byte alphabet, written out independently of the library. */
static int byte_char(int b, char *out) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        int k = 0;
        for (int x = 0; x < b; x++) k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
    return 2;
}

/* Byte-level BPE: 256 byte pieces (id = byte), " t"+"he" merges, added tokens
 * with special / lstrip / single_word, ByteLevel decoder. */
static kvq_tokenizer *byte_level_tokenizer(void) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    char c[4];
    for (int b = 0; b < 256; b++) {
        byte_char(b, c);
        cJSON_AddNumberToObject(vocab, c, b);
    }
    cJSON_AddNumberToObject(vocab, "\xc4\xa0t", 256);    /* "Ġt" */
    cJSON_AddNumberToObject(vocab, "he", 257);
    cJSON_AddNumberToObject(vocab, "\xc4\xa0the", 258);  /* "Ġthe" */
    const char *merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he"};
    cJSON_AddItemToObject(model, "merges", cJSON_CreateStringArray(merges, 3));
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    const struct { int id; const char *content; int special, lstrip, single; } at[] = {
        {259, "<|end|>", 1, 0, 0}, {260, "[MASK]", 1, 1, 0}, {261, "hi", 0, 0, 1}, {262, "<|end|>x", 1, 0, 0}};
    for (int i = 0; i < 4; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", at[i].id);
        cJSON_AddStringToObject(a, "content", at[i].content);
        cJSON_AddBoolToObject(a, "special", at[i].special);
        cJSON_AddBoolToObject(a, "lstrip", at[i].lstrip);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "single_word", at[i].single);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddItemToArray(added, a);
    }
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
    cJSON_AddBoolToObject(pre, "use_regex", 1);
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    const char *dir = make_dir("bytelevel");
    write_json(dir, root);
    write_file(dir, "config.json", "{\"eos_token_id\": 259}");
    cJSON_Delete(root);
    return load_dir(dir);
}

static void expect_ids(const kvq_tokenizer *t, const char *text, const int32_t *want, int n) {
    int32_t got[64];
    int k = kvq_tokenize(t, text, strlen(text), 0, got, 64);
    if (k != n || memcmp(got, want, (size_t)n * sizeof *got)) {
        char buf[512];
        int off = snprintf(buf, sizeof buf, "\"%s\": got %d ids:", text, k);
        for (int i = 0; i < k && i < 64 && off < 480; i++) off += snprintf(buf + off, sizeof buf - (size_t)off, " %d", got[i]);
        fail_msg("%s", buf);
    }
}

static void test_byte_level(void **state) {
    (void)state;
    kvq_tokenizer *t = byte_level_tokenizer();
    assert_int_equal(kvq_vocab_size(t), 263);
    assert_int_equal(kvq_token_bos(t), -1);
    assert_true(kvq_token_is_eog(t, 259));
    assert_false(kvq_token_is_eog(t, 258));

    expect_ids(t, "the the", (int32_t[]){'t', 257, 258}, 3);
    expect_ids(t, "a<|end|>b", (int32_t[]){'a', 259, 'b'}, 3);
    expect_ids(t, "a<|end|>xb", (int32_t[]){'a', 262, 'b'}, 3); /* longest match wins */
    expect_ids(t, "x  [MASK]", (int32_t[]){'x', 260}, 2);      /* lstrip eats the spaces */
    expect_ids(t, "hi there", (int32_t[]){261, 258, 'r', 'e'}, 4);
    expect_ids(t, "chic", (int32_t[]){'c', 'h', 'i', 'c'}, 4); /* single_word: not inside a word */
    int32_t bos_ids[4];
    assert_int_equal(kvq_tokenize(t, "a", 1, 1, bos_ids, 4), 1); /* no BOS to add */

    /* special tokens go through the decoder, or are skipped */
    const int32_t ids[] = {258, 259, 'a'};
    char *s = decode(t, ids, 3, 0);
    assert_string_equal(s, " the<|end|>a");
    free(s);
    s = decode(t, ids, 3, 1);
    assert_string_equal(s, " thea");
    free(s);

    /* bytes: split characters are held back, invalid ones become U+FFFD */
    kvq_detok *d = kvq_detok_new(t, 0);
    char out[32];
    assert_int_equal(kvq_detok_push(d, 0xC3, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(kvq_detok_push(d, 0xA9, out, sizeof out), 2);
    assert_string_equal(out, "\xc3\xa9");
    assert_int_equal(kvq_detok_push(d, 0xE2, out, sizeof out), 0);
    assert_int_equal(kvq_detok_push(d, 'a', out, sizeof out), 4);
    assert_string_equal(out, "\xef\xbf\xbd" "a");
    assert_int_equal(kvq_detok_push(d, 0xF0, out, sizeof out), 0);
    assert_int_equal(kvq_detok_flush(d, out, sizeof out), 3);
    assert_string_equal(out, "\xef\xbf\xbd");
    /* a full character that does not fit waits for the next call */
    assert_int_equal(kvq_detok_push(d, 0xC3, out, 2), 0);
    assert_int_equal(kvq_detok_push(d, 0xA9, out, 2), 0);
    assert_int_equal(kvq_detok_push(d, 'b', out, 2), 0);
    assert_int_equal(kvq_detok_flush(d, out, sizeof out), 3);
    assert_string_equal(out, "\xc3\xa9" "b");
    assert_int_equal(kvq_detok_push(d, -5, out, sizeof out), -1);
    kvq_detok_free(d);
    const int32_t bad[] = {0xE2, 0x82, 'x', 0xFF, 0xC0, 0xAF};
    s = decode(t, bad, 6, 0);
    assert_string_equal(s, "\xef\xbf\xbd" "x" "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
    check_stream(t, bad, 6, 0);

    /* invalid UTF-8 input is encoded byte by byte and comes back */
    const char raw[] = "a\xff\xfe b";
    int n;
    int32_t *rid = encode(t, raw, sizeof raw - 1, 0, &n);
    s = decode(t, rid, n, 0);
    assert_string_equal(s, "a\xef\xbf\xbd\xef\xbf\xbd b");
    free(s);
    free(rid);
    kvq_tokenizer_free(t);
}

/* Word-level BPE (ignore_merges), normalizers, Whitespace and Digits pre-tokenizers, no decoder. */
static void test_normalizers(void **state) {
    (void)state;
    const char *json =
        "{\"added_tokens\": [],"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Lowercase\"},"
        "   {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"content\": \" \"},"
        "   {\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true}]},"
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Whitespace\"},"
        "   {\"type\": \"Digits\", \"individual_digits\": true}]},"
        " \"decoder\": null,"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"[UNK]\", \"fuse_unk\": true, \"ignore_merges\": true,"
        "   \"vocab\": {\"[UNK]\": 0, \"hello\": 1, \"world\": 2, \"1\": 3, \"2\": 4, \"3\": 5, \"!\": 6, \"a\": 7, \"ab\": 8, \"b\": 9},"
        "   \"merges\": [\"a b\"]}}";
    const char *dir = make_dir("words");
    write_file(dir, "tokenizer.json", json);
    kvq_tokenizer *t = load_dir(dir);
    expect_ids(t, "  HELLO \t World!  ", (int32_t[]){1, 2, 6}, 3);
    expect_ids(t, "\xef\xbc\xa8\xef\xbd\x85\xef\xbd\x8c\xef\xbd\x8c\xef\xbd\x8f", (int32_t[]){1}, 1); /* fullwidth */
    expect_ids(t, "123", (int32_t[]){3, 4, 5}, 3);
    expect_ids(t, "xyz", (int32_t[]){0}, 1); /* unknown characters fuse into one unk */
    expect_ids(t, "ab", (int32_t[]){8}, 1);
    char *s = decode(t, (int32_t[]){1, 2, 6}, 3, 0);
    assert_string_equal(s, "hello world !"); /* no decoder: joined with spaces */
    free(s);
    check_stream(t, (int32_t[]){1, 2, 6, 0}, 4, 0);
    kvq_tokenizer_free(t);
}

/* Split behaviors on "a-b" / "a--b" with a literal "-" pattern. */
static void test_split_behaviors(void **state) {
    (void)state;
    const struct { const char *behavior; const char *text; int32_t ids[4]; int n; } cases[] = {
        {"Removed", "a-b", {1, 2}, 2},
        {"Isolated", "a-b", {1, 3, 2}, 3},
        {"MergedWithPrevious", "a-b", {4, 2}, 2},
        {"MergedWithNext", "a-b", {1, 5}, 2},
        {"Contiguous", "a--b", {1, 6, 2}, 3},
        {"Isolated", "a--b", {1, 3, 3, 2}, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\","
                 " \"invert\": false}, \"decoder\": {\"type\": \"Fuse\"},"
                 " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"[UNK]\": 0, \"a\": 1, \"b\": 2,"
                 " \"-\": 3, \"a-\": 4, \"-b\": 5, \"--\": 6}, \"merges\": [], \"unk_token\": \"[UNK]\"}}",
                 cases[i].behavior);
        const char *dir = make_dir("split");
        write_file(dir, "tokenizer.json", json);
        kvq_tokenizer *t = load_dir(dir);
        expect_ids(t, cases[i].text, cases[i].ids, cases[i].n);
        kvq_tokenizer_free(t);
    }
}

/* ---- errors ---------------------------------------------------------------------------- */

static void expect_load_error(const char *name, const char *json, kvq_status want) {
    const char *dir = make_dir(name);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(dir, "tokenizer.json", json);
    kvq_tokenizer *t = (kvq_tokenizer *)1;
    kvq_status st = kvq_tokenizer_load(dir, &t);
    assert_int_not_equal(st, KVQ_OK);
    if (want != KVQ_OK) assert_int_equal(st, want);
    assert_null(t);
    const char *msg = kvq_last_error();
    if (!strstr(msg, path)) fail_msg("error \"%s\" does not name %s", msg, path);
    assert_null(strchr(msg, '\n'));
}

static void test_malformed(void **state) {
    (void)state;
    const char *src = tu_fixture("tokenizers/llama2/tokenizer.json");
    if (src) {
        char *js = tu_read_file(src, NULL);
        js[5000] = 0; /* truncated mid-file */
        expect_load_error("truncated", js, KVQ_ERR_FORMAT);
        free(js);
    }
    expect_load_error("truncated-small", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", KVQ_ERR_FORMAT);
    expect_load_error("no-model", "{\"version\": \"1.0\", \"added_tokens\": []}", KVQ_ERR_FORMAT);
    expect_load_error("unknown-type", "{\"model\": {\"type\": \"Foo\", \"vocab\": {}, \"merges\": []}}", KVQ_OK);
    expect_load_error("wordpiece", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", KVQ_ERR_UNSUPPORTED);
    expect_load_error("bad-merge", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a q\"]}}",
                      KVQ_ERR_FORMAT);
    expect_load_error("bad-id", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}",
                      KVQ_ERR_FORMAT);
    expect_load_error("bad-regex",
                      "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                      KVQ_OK);
    expect_load_error("bad-normalizer",
                      "{\"normalizer\": {\"type\": \"Bogus\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
                      KVQ_ERR_UNSUPPORTED);
    expect_load_error("not-object", "[1, 2]", KVQ_ERR_FORMAT);

    kvq_tokenizer *t = NULL;
    char missing[4096];
    snprintf(missing, sizeof missing, "%s/does-not-exist", tu_tmpdir());
    assert_int_equal(kvq_tokenizer_load(missing, &t), KVQ_ERR_IO);
    assert_non_null(strstr(kvq_last_error(), missing));
    assert_int_equal(kvq_tokenizer_load(NULL, &t), KVQ_ERR_ARG);

    /* a malformed optional config is an error too, naming that file */
    const char *dir = make_dir("bad-config");
    write_file(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}");
    write_file(dir, "tokenizer_config.json", "{\"bos_token\": ");
    assert_int_equal(kvq_tokenizer_load(dir, &t), KVQ_ERR_FORMAT);
    assert_non_null(strstr(kvq_last_error(), "tokenizer_config.json"));
}

/* ---- buffers and arguments -------------------------------------------------------------- */

static void test_buffers(void **state) {
    (void)state;
    const char *p = tu_fixture("tokenizers/llama2");
    TU_NEED_FIXTURE(p);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", p);
    kvq_tokenizer *t = load_dir(dir);
    const char *text = "Hello, world!";
    int32_t ids[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    assert_int_equal(kvq_tokenize(t, text, strlen(text), 1, ids, 2), 5);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043);
    assert_int_equal(ids[2], -7); /* nothing past max_ids */
    assert_int_equal(kvq_tokenize(t, "", 0, 0, NULL, 0), 0);
    assert_int_equal(kvq_tokenize(t, NULL, 3, 0, ids, 8), -1);
    assert_int_equal(kvq_tokenize(t, text, 5, 0, NULL, 4), -1);

    const int32_t hello[] = {15043, 29892, 3186, 29991};
    char out[8];
    memset(out, 'x', sizeof out);
    assert_int_equal(kvq_detokenize(t, hello, 4, 0, out, 6), 13);
    assert_string_equal(out, "Hello");
    assert_int_equal(out[6], 'x');
    assert_int_equal(kvq_detokenize(t, hello, 4, 0, NULL, 0), 13);
    assert_int_equal(kvq_detokenize(t, hello, -1, 0, out, 8), -1);
    int32_t neg = -1;
    assert_int_equal(kvq_detokenize(t, &neg, 1, 0, out, 8), -1);
    int32_t unknown = 999999; /* unknown ids are skipped, as HF does */
    assert_int_equal(kvq_detokenize(t, &unknown, 1, 0, out, 8), 0);

    /* specials: BOS / EOS from the configs */
    assert_int_equal(kvq_token_bos(t), 1);
    assert_true(kvq_token_is_eog(t, 2));
    assert_false(kvq_token_is_eog(t, 1));
    assert_false(kvq_token_is_eog(t, 32000));
    const int32_t sp[] = {1, 15043, 2};
    char *s = decode(t, sp, 3, 1);
    assert_string_equal(s, "Hello");
    free(s);
    s = decode(t, sp, 3, 0);
    assert_string_equal(s, "<s> Hello</s>");
    free(s);
    kvq_tokenizer_free(t);
}

/* ---- the model directories ----------------------------------------------------------------- */

static void check_model_dir(const char *name, const int32_t *eog, int n_eog) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    const char *p = tu_fixture(rel);
    TU_NEED_FIXTURE(p);
    char dir[4096], ref[4200];
    snprintf(dir, sizeof dir, "%s", p);
    snprintf(ref, sizeof ref, "%s/reference.json", dir);
    char *js = tu_read_file(ref, NULL);
    cJSON *r = cJSON_Parse(js);
    assert_non_null(r);
    const char *prompt = cJSON_GetObjectItem(r, "prompt")->valuestring;
    kvq_tokenizer *t = load_dir(dir);
    int n;
    int32_t *ids = encode(t, prompt, strlen(prompt), 1, &n);
    check_ids(ids, n, cJSON_GetObjectItem(r, "prompt_ids"), prompt);
    for (int i = 0; i < n_eog; i++) assert_true(kvq_token_is_eog(t, eog[i]));
    assert_false(kvq_token_is_eog(t, kvq_token_bos(t)));
    char *back = decode(t, ids, n, 1);
    assert_string_equal(back, prompt);
    free(back);
    free(ids);
    kvq_tokenizer_free(t);
    cJSON_Delete(r);
    free(js);
}

static void test_model_llama3(void **state) {
    (void)state;
    check_model_dir("llama3-tiny-aqlm-1x16g16", (int32_t[]){128001, 128008, 128009}, 3);
}
static void test_model_mistral(void **state) { (void)state; check_model_dir("mistral-tiny-aqlm-2x8", (int32_t[]){2}, 1); }
static void test_model_brown(void **state) { (void)state; check_model_dir("brown-llama-fp16", (int32_t[]){2}, 1); }

/* ---- kvq-tokenize ---------------------------------------------------------------------------- */

static void test_tool(void **state) {
    (void)state;
    const char *p = tu_fixture("tokenizers/llama2");
    TU_NEED_FIXTURE(p);
    char dir[4096], exe[4096], cmd[9000];
    snprintf(dir, sizeof dir, "%s", p);
    snprintf(exe, sizeof exe, "%s/kvq-tokenize", KVQ_TOOLS_DIR);
    if (access(exe, X_OK)) {
        print_message("%s not built, skipping\n", exe);
        skip();
    }
    int st;
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' -p 'Hello, world!'", exe, dir);
    char *out = tu_run(cmd, &st);
    assert_int_equal(st, 0);
    assert_string_equal(out, "15043 29892 3186 29991\n");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' --bos -p 'Hello, world!'", exe, dir);
    out = tu_run(cmd, &st);
    assert_string_equal(out, "1 15043 29892 3186 29991\n");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' --decode -p 'Hi you'", exe, dir);
    out = tu_run(cmd, &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "\" you\""));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' --help", exe);
    out = tu_run(cmd, &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "usage"));
    free(out);
    /* errors: exit 1, one line on stderr */
    snprintf(cmd, sizeof cmd, "'%s' -m '%s/nope' -p x 2>&1 >/dev/null", exe, tu_tmpdir());
    out = tu_run(cmd, &st);
    assert_int_equal(st, 1);
    assert_true(!strncmp(out, "kvq-tokenize: ", 14));
    assert_non_null(strstr(out, "nope/tokenizer.json"));
    assert_ptr_equal(strchr(out, '\n'), out + strlen(out) - 1);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' --bogus 2>&1 >/dev/null", exe);
    out = tu_run(cmd, &st);
    assert_int_equal(st, 1);
    assert_true(!strncmp(out, "kvq-tokenize: ", 14));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_llama2),
        cmocka_unit_test(test_fixture_mistral),
        cmocka_unit_test(test_fixture_llama3),
        cmocka_unit_test(test_brown_llama2),
        cmocka_unit_test(test_brown_llama3),
        cmocka_unit_test(test_generation_variants),
        cmocka_unit_test(test_byte_level),
        cmocka_unit_test(test_normalizers),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_buffers),
        cmocka_unit_test(test_model_llama3),
        cmocka_unit_test(test_model_mistral),
        cmocka_unit_test(test_model_brown),
        cmocka_unit_test(test_tool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
