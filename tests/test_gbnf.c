/* GBNF grammars (kvq_grammar_constraint_new), written here by hand in the style of llama.cpp's
 * grammars/ folder: JSON, arithmetic, a list and chess moves. Texts are taken or refused at
 * the right byte; grammars that cannot compile name the rule, line and column; random sampling
 * on the demo's vocabulary gives texts that a reference parser of the same grammar, written
 * here (cJSON for JSON, recursive descent for arithmetic, POSIX regular expressions for the
 * list and the moves), accepts. */
#include <cjson/cJSON.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "testutil.h"

static const char *G_JSON =
    "# JSON, values separated by optional blanks\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "    string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) ){0,24} \"\\\"\" ws\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,8}) (\".\" [0-9]{1,6})? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "ws     ::= [ \\t\\n]{0,3}\n";

static const char *G_ARITH =
    "root  ::= (expr \"=\" ws term \"\\n\"){1,3}\n"
    "expr  ::= term ([-+*/] term)*\n"
    "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
    "ident ::= [a-z] [a-z0-9_]{0,6} ws\n"
    "num   ::= [0-9]{1,6} ws\n"
    "ws    ::= [ \\t]{0,2}\n";

static const char *G_LIST =
    "root ::= item{1,5}\n"
    "# an item: a dash, then anything but a line break\n"
    "item ::= \"- \" [^\\r\\n\\x0b\\x0c\\u2028\\u2029]{1,40} \"\\n\"\n";

static const char *G_CHESS =
    "root    ::= (\n"
    "    # a first move pair, then numbered ones\n"
    "    \"1. \" move \" \" move \"\\n\"\n"
    "    ([1-9] [0-9]? \". \" move \" \" move \"\\n\"){1,4}\n"
    ")\n"
    "move    ::= (pawn | nonpawn | castle) [+#]?\n"
    "pawn    ::= ([a-h] \"x\")? [a-h] [1-8] (\"=\" [NBRQ])?\n"
    "nonpawn ::= [NBRQK] [a-h]? [1-8]? \"x\"? [a-h] [1-8]\n"
    "castle  ::= \"O-O\" \"-O\"?\n";

static kvq_json_constraint *grammar(const kvq_tokenizer *tok, const char *g) {
    char err[256];
    kvq_json_constraint *c = kvq_grammar_constraint_new(tok, g, err, sizeof err);
    if (!c) fail_msg("grammar refused: %s", err);
    return c;
}

/* -1: text taken whole and complete; else the byte refused (strlen: taken, not complete) */
static long run(const char *g, const char *text) {
    kvq_json_constraint *c = grammar(NULL, g);
    long at = -1;
    for (size_t i = 0; text[i] && at < 0; i++)
        if (kvq_json_constraint_feed(c, text + i, 1)) at = (long)i;
    if (at < 0 && !kvq_json_constraint_complete(c)) at = (long)strlen(text);
    kvq_json_constraint_free(c);
    return at;
}

static void test_bytes(void **st) {
    (void)st;
    assert_int_equal(run(G_JSON, "{\"a\": [1, -2.5e3, \"x\\n\\u00e9\", true, null], \"b\": {}}"), -1);
    assert_int_equal(run(G_JSON, "{\"a\":1,}"), 7);
    assert_int_equal(run(G_JSON, "{\"a\":01}"), 6);
    assert_int_equal(run(G_JSON, "{\"a\":1"), 6);
    assert_int_equal(run(G_ARITH, "x1 +2*( y -3)= 4\n"), -1);
    assert_int_equal(run(G_ARITH, "x = 1\ny=2\n"), -1);
    assert_int_equal(run(G_ARITH, "x + = 1\n"), 3);
    assert_int_equal(run(G_LIST, "- milk\n- \xc3\xa9pices \xe2\x82\xac\n"), -1);
    assert_int_equal(run(G_LIST, "- a\n* b\n"), 4);
    assert_int_equal(run(G_LIST, "- a\xe2\x80\xa8"), 5); /* U+2028 refused at its last byte */
    assert_int_equal(run(G_CHESS, "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 O-O-O+\n"), -1);
    assert_int_equal(run(G_CHESS, "1. e4 e9\n"), 7);
    assert_int_equal(run(G_CHESS, "1. e4 e5\n"), 9); /* one numbered pair at least */
    /* a UTF-8 lead byte no waiting class can finish is refused at once */
    assert_int_equal(run("root ::= [a-z]+\n", "ab\xc3"), 2);
    assert_int_equal(run("root ::= [^a-z]+\n", "\xe0\xa4\x85"), -1);
    assert_int_equal(run("root ::= \"x\"{2,3}\n", "xxxx"), 3);
    assert_int_equal(run("root ::= (\"ab\" | \"ac\")* \"!\"\n", "abacab!"), -1);
    assert_int_equal(run("root ::= .{3}\n", "\xf0\x9f\x98\x80\xc3\xa9z"), -1);
}

static void test_errors(void **st) {
    (void)st;
    static const struct { const char *g, *needle; } bad[] = {
        {"root ::= item\nitem ::= \"a\" (b | \"c\"\n", "rule 'item', line 3 column 1: ')' expected"},
        {"root ::= \"a\" missing\n", "rule 'missing', line 1 column 14: used but not defined"},
        {"start ::= \"a\"\n", "no rule named 'root'"},
        {"root ::= root \"a\" | \"b\"\n", "rule 'root', line 1 column 1: left-recursive"},
        {"root ::= x\nx ::= \"\"? x \"a\"\n", "rule 'x'"},
        {"root ::= [a-\n", "rule 'root', line 1 column"},
        {"root ::= \"\\q\"\n", "unknown escape"},
        {"root ::= \"a\"{3,2}\n", "rule 'root', line 1 column 13"},
        {"root ::= * \"a\"\n", "follows nothing"},
        {"root ::= \"a\" ; \"b\"\n", "rule 'root', line 1 column 14: unexpected ';'"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
        {"root \"a\"\n", "'::=' expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        kvq_json_constraint *c = kvq_grammar_constraint_new(NULL, bad[i].g, err, sizeof err);
        if (c) fail_msg("accepted: %s", bad[i].g);
        if (!strstr(err, bad[i].needle)) fail_msg("%s: \"%s\" lacks \"%s\"", bad[i].g, err, bad[i].needle);
    }
}

/* ---- reference parsers ---- */

static const char *ap;
static void sp(void) { while (*ap == ' ' || *ap == '\t') ap++; }
static int term(void);
static int expr(void) {
    if (!term()) return 0;
    while (strchr("-+*/", *ap) && *ap) {
        ap++;
        if (!term()) return 0;
    }
    return 1;
}
static int term(void) {
    if (*ap >= 'a' && *ap <= 'z') {
        while ((*ap >= 'a' && *ap <= 'z') || (*ap >= '0' && *ap <= '9') || *ap == '_') ap++;
    } else if (*ap >= '0' && *ap <= '9') {
        while (*ap >= '0' && *ap <= '9') ap++;
    } else if (*ap == '(') {
        ap++;
        sp();
        if (!expr() || *ap++ != ')') return 0;
    } else return 0;
    sp();
    return 1;
}
static int arith_ok(const char *t) {
    ap = t;
    for (int lines = 0;; lines++) {
        if (!*ap) return lines > 0;
        if (!expr() || *ap++ != '=') return 0;
        sp();
        if (!term() || *ap++ != '\n') return 0;
    }
}

static int regex_ok(const char *re, const char *t) {
    regex_t r;
    assert_int_equal(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0);
    int ok = !regexec(&r, t, 0, NULL, 0);
    regfree(&r);
    return ok;
}

#define MOVE "([a-h]x)?[a-h][1-8](=[NBRQ])?|[NBRQK][a-h]?[1-8]?x?[a-h][1-8]|O-O(-O)?"
#define MOVE2 "(" MOVE ")[+#]? (" MOVE ")[+#]?\n"

static int chess_ok(const char *t) { return regex_ok("^1\\. " MOVE2 "([1-9][0-9]?\\. " MOVE2 "){1,4}$", t); }
static int list_ok(const char *t) { return regex_ok("^(- [^\r\n]+\n){1,5}$", t); }
static int json_ok(const char *t) {
    cJSON *v = cJSON_Parse(t);
    int ok = cJSON_IsObject(v);
    cJSON_Delete(v);
    return ok;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 16777216.0f;
}

static void sample(const kvq_tokenizer *tok, const char *g, int (*ok)(const char *), const char *name) {
    int n = kvq_vocab_size(tok), done = 0;
    float *lg = malloc(sizeof *lg * (size_t)n);
    for (int run = 0; run < 3; run++) {
        kvq_json_constraint *c = grammar(tok, g);
        kvq_sampler_params sp = kvq_sampler_default_params();
        sp.seed = (uint64_t)run + 1, sp.top_k = 0, sp.top_p = 1, sp.min_p = 0, sp.temp = 1;
        kvq_sampler *s = kvq_sampler_new(&sp);
        int32_t ids[400];
        int nid = 0;
        while (nid < 400 && kvq_json_constraint_complete(c) < 2) {
            for (int i = 0; i < n; i++) lg[i] = urand() * 4;
            int32_t id = kvq_json_constraint_sample(c, s, lg, n);
            if (kvq_token_is_eog(tok, id)) break;
            assert_int_equal(kvq_json_constraint_accept(c, id), 0);
            ids[nid++] = id;
        }
        char text[8192];
        int len = kvq_detokenize(tok, ids, nid, 1, text, sizeof text);
        assert_true(len >= 0 && len < (int)sizeof text);
        if (kvq_json_constraint_complete(c)) {
            done++;
            if (!ok(text)) fail_msg("%s, run %d: the reference parser refuses: %s", name, run, text);
        }
        kvq_sampler_free(s);
        kvq_json_constraint_free(c);
    }
    print_message("%s: %d of 3 sampled texts complete, each accepted by the reference parser\n", name, done);
    assert_true(done >= 2);
    free(lg);
}

static void test_sample(void **st) {
    (void)st;
    kvq_tokenizer *tok = NULL;
    assert_int_equal(kvq_tokenizer_load(KVQ_SOURCE_DIR "/models/demo", &tok), KVQ_OK);
    sample(tok, G_JSON, json_ok, "json");
    sample(tok, G_ARITH, arith_ok, "arithmetic");
    sample(tok, G_LIST, list_ok, "list");
    sample(tok, G_CHESS, chess_ok, "chess");
    kvq_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bytes), cmocka_unit_test(test_errors), cmocka_unit_test(test_sample)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
