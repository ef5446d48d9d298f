/* kvq-chat as a user meets it: driven through a pseudo-terminal (typing, Up to
 * recall, Ctrl-C during a reply, /stats, /reset, Ctrl-D), through a pipe (one
 * reply line per input line, any line length), with a tiny context (turns are
 * dropped and the session goes on) and with a chat template (the second turn
 * reuses the cache). All on the demo model or fixtures, fixed seeds, one thread. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static char g_err[1 << 16];

/* Runs `kvq-chat ARGS < input` (input written to a file first); returns stdout. */
static char *chat_pipe(const char *args, const char *input, size_t input_len, int *status) {
    char in_path[512], err_path[512], cmd[4096];
    snprintf(in_path, sizeof in_path, "%s/chat_in.txt", tu_tmpdir());
    snprintf(err_path, sizeof err_path, "%s/chat_err.txt", tu_tmpdir());
    FILE *f = fopen(in_path, "wb");
    assert_non_null(f);
    fwrite(input, 1, input_len, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "HOME=%s KVQ_CHAT_VERIFY=1 %s/kvq-chat --exact %s < %s 2> %s", tu_tmpdir(), KVQ_TOOLS_DIR, args, in_path,
             err_path);
    char *out = tu_run(cmd, status);
    f = fopen(err_path, "rb");
    size_t n = f ? fread(g_err, 1, sizeof g_err - 1, f) : 0;
    g_err[n] = 0;
    if (f) fclose(f);
    return out;
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

static int count_str(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void test_piped_lines(void **state) {
    int st;
    char *out = chat_pipe("--seed 1 -t 1", "a\nb\n", 4, &st);
    if (st != 0) fail_msg("exit %d, stderr: %s", st, g_err);
    if (count_char(out, '\n') != 2) fail_msg("two inputs gave '%s' (want two reply lines)", out);
    free(out);
    /* a 20,000-byte line is one turn: longer than the demo's context, so one message
     * on stderr and an empty reply line; the next line is answered as usual */
    size_t n = 20000;
    char *big = malloc(n + 8);
    for (size_t i = 0; i < n; i++) big[i] = "the jury said "[i % 14];
    memcpy(big + n, "\nb\n", 3);
    out = chat_pipe("--seed 1 -t 1 -n 16", big, n + 3, &st);
    if (st != 0) fail_msg("exit %d, stderr: %s", st, g_err);
    if (count_char(out, '\n') != 2) fail_msg("20,000-byte line + 'b' gave %d reply lines: '%s'", count_char(out, '\n'), out);
    if (out[0] != '\n' || strlen(out) < 3) fail_msg("want an empty reply then a reply, got '%s'", out);
    if (count_str(g_err, "input too long") != 1 || !strstr(g_err, "-c ")) fail_msg("stderr: %s", g_err);
    free(out);
    free(big);
}

/* Ten turns in a 128-token context: older turns are dropped with one line each
 * time, an input longer than the context gets its message, the session goes on. */
static void test_ten_turns_small_context(void **state) {
    char input[8192] = "";
    const char *lines[] = {"The jury said", "It added that", "The city", "In the morning", "He was"};
    for (int i = 0; i < 10; i++) {
        strcat(input, lines[i % 5]);
        strcat(input, "\n");
        if (i == 5) { /* about 300 tokens: longer than the whole context */
            for (int k = 0; k < 60; k++) strcat(input, "the grand jury ");
            strcat(input, "\n");
        }
    }
    int st;
    /* KVQ_CHAT_VERIFY: after every cache update the logits are compared with a fresh evaluation */
    char *out = chat_pipe("-c 128 -n 24 --seed 7 -t 1", input, strlen(input), &st);
    if (st != 0) fail_msg("exit %d, stderr: %s", st, g_err);
    if (count_char(out, '\n') != 11) fail_msg("11 inputs gave %d reply lines: '%s'", count_char(out, '\n'), out);
    int drops = count_str(g_err, "context full: dropped"), full = count_str(g_err, "context full:");
    if (drops < 1) fail_msg("no context shift reported: %s", g_err);
    if (count_str(g_err, "input too long") != 1 || !strstr(g_err, "context holds 128")) fail_msg("stderr: %s", g_err);
    /* one line per event: besides the checks, every stderr line is the load line, the backend lines (the
     * choice, why a GPU backend was passed over, the plan), a context event or the long input */
    int lines_n = count_char(g_err, '\n') - count_str(g_err, ": verify: ") - count_str(g_err, "kvq-chat: backend ") -
                  count_str(g_err, "; using the next backend") - count_str(g_err, "kvq-chat: plan: ");
    if (lines_n != 1 + full + 1) fail_msg("stderr has %d lines for %d context events: %s", lines_n, full, g_err);
    int checks = 0;
    for (const char *p = g_err; (p = strstr(p, ": verify: ")); p++, checks++) {
        int ntok;
        double d;
        assert_int_equal(sscanf(p, ": verify: %d tokens, squared rel. logits difference %lf", &ntok, &d), 2);
        if (d > 1e-8) fail_msg("cache after %d tokens differs from a fresh evaluation (%g): %s", ntok, d, g_err);
    }
    if (checks < 10) fail_msg("only %d cache checks ran: %s", checks, g_err);
    /* the turns after the long input were answered */
    const char *last = out + strlen(out) - 1;
    assert_true(last > out && last[-1] != '\n');
    free(out);
}

/* --keep N pins the first tokens through the shifts; the cache stays exact. */
static void test_keep(void **state) {
    char input[4096] = "";
    for (int i = 0; i < 8; i++) strcat(input, "The jury said that the city of Atlanta\n");
    int st;
    char *out = chat_pipe("-c 96 -n 20 --keep 6 --seed 3 -t 1 --verbose-prompt", input, strlen(input), &st);
    if (st != 0) fail_msg("exit %d, stderr: %s", st, g_err);
    assert_int_equal(count_char(out, '\n'), 8);
    if (!strstr(g_err, "context full: dropped")) fail_msg("no shift: %s", g_err);
    for (const char *p = g_err; (p = strstr(p, ": verify: ")); p++) {
        int ntok;
        double d;
        assert_int_equal(sscanf(p, ": verify: %d tokens, squared rel. logits difference %lf", &ntok, &d), 2);
        if (d > 1e-8) fail_msg("cache differs from a fresh evaluation: %s", g_err);
    }
    /* after a shift the next turn still reuses more than the pinned tokens */
    const char *shift = strstr(g_err, "context full: dropped"), *next = shift ? strstr(shift, "turn: ") : NULL;
    int e, r;
    if (!next || sscanf(next, "turn: %d tokens evaluated, %d reused", &e, &r) != 2 || r <= 6) fail_msg("stderr: %s", g_err);
    free(out);
}

/* One-shot: -f, --chat (one user turn in the template, one BOS), and a random seed by default. */
static void test_one_shot_modes(void **state) {
    char path[1024], args[4096];
    snprintf(path, sizeof path, "%s/prompt.txt", tu_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("The jury said", f);
    fclose(f);
    snprintf(args, sizeof args, "-f %s -n 6 --temp 0 -t 1", path);
    int st;
    char *a = chat_pipe(args, "", 0, &st);
    assert_int_equal(st, 0);
    char *b = chat_pipe("-p 'The jury said' -n 6 --temp 0 -t 1", "", 0, &st);
    assert_int_equal(st, 0);
    assert_string_equal(a, b);
    assert_true(!strncmp(a, "The jury said", 13) && strlen(a) > 15);
    free(a);
    free(b);
    /* default seed -1: two sampled runs differ */
    a = chat_pipe("-p 'The jury said' -n 48 -t 1", "", 0, &st);
    b = chat_pipe("-p 'The jury said' -n 48 -t 1", "", 0, &st);
    if (!strcmp(a, b)) fail_msg("two runs without --seed printed the same: '%s'", a);
    free(a);
    free(b);
    const char *dir = tu_fixture("models/llama3-tiny-aqlm-1x16g16");
    TU_NEED_FIXTURE(dir);
    snprintf(args, sizeof args, "-m %s --chat -p Hi -n 2 --temp 0 -t 1 --verbose-prompt", dir);
    a = chat_pipe(args, "", 0, &st);
    assert_int_equal(st, 0);
    /* <|begin_of_text|> <|start_header_id|> user <|end_header_id|> \n\n Hi <|eot_id|> + assistant header */
    if (!strstr(g_err, "prompt ids: 128000 128006 882 128007 271 13347 128009 128006 78191 128007 271\n"))
        fail_msg("--chat prompt ids: %s", g_err);
    free(a);
}

/* --prompt-cache: the second run takes all but the last prompt token from the file and
 * prints the same; a file for other cache types or a damaged one is a warning and a cold
 * start. (/save and /load with FILE.kvq: test_pty_session, commands need a terminal.) */
static void test_prompt_cache(void **state) {
    char cache[1024], args[4096];
    snprintf(cache, sizeof cache, "%s/prompt.kvq", tu_tmpdir());
    remove(cache);
    const char *p = "-p 'The jury said that the city of Atlanta should' -n 8 --temp 0 -t 1 --ids";
    int st;
    snprintf(args, sizeof args, "%s --prompt-cache %s", p, cache);
    char *cold = chat_pipe(p, "", 0, &st);
    assert_int_equal(st, 0);
    char *a = chat_pipe(args, "", 0, &st);
    if (st != 0) fail_msg("exit %d: %s", st, g_err);
    assert_string_equal(a, cold);
    FILE *f = fopen(cache, "rb");
    if (!f) fail_msg("no cache file written: %s", g_err);
    fclose(f);
    char *b = chat_pipe(args, "", 0, &st);
    assert_int_equal(st, 0);
    assert_string_equal(b, cold);
    if (!strstr(g_err, "taken from the cache file") || strstr(g_err, ": 0 of")) fail_msg("second run: %s", g_err);
    free(a);
    free(b);
    /* q4 cache types: the f16 file is refused with a warning, the run goes on */
    snprintf(args, sizeof args, "%s --prompt-cache %s -ctk q4 -ctv q4", p, cache);
    a = chat_pipe(args, "", 0, &st);
    assert_int_equal(st, 0);
    if (!strstr(g_err, "warning") || !strstr(g_err, "-ctk")) fail_msg("q4 run with an f16 file: %s", g_err);
    free(a);
    /* damaged */
    f = fopen(cache, "r+b");
    fseek(f, 200, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    snprintf(args, sizeof args, "%s --prompt-cache %s", p, cache);
    a = chat_pipe(args, "", 0, &st);
    assert_int_equal(st, 0);
    assert_string_equal(a, cold);
    if (!strstr(g_err, "warning") || !strstr(g_err, "damaged")) fail_msg("damaged file: %s", g_err);
    free(a);
    free(cold);
}

/* A template model: the second turn evaluates only what is new. */
static void test_template_incremental(void **state) {
    const char *dir = tu_fixture("models/llama3-tiny-aqlm-1x16g16");
    TU_NEED_FIXTURE(dir);
    char args[2048];
    snprintf(args, sizeof args, "-m %s -n 8 --temp 0 -t 1 --verbose-prompt --system 'Be brief.'", dir);
    int st;
    char *out = chat_pipe(args, "Hello there\nAnd again\n", 22, &st);
    if (st != 0) fail_msg("exit %d, stderr: %s", st, g_err);
    assert_int_equal(count_char(out, '\n'), 2);
    const char *t1 = strstr(g_err, "turn: "), *t2 = t1 ? strstr(t1 + 1, "turn: ") : NULL;
    if (!t2) fail_msg("no per-turn lines: %s", g_err);
    int e1, r1, e2, r2;
    assert_int_equal(sscanf(t1, "turn: %d tokens evaluated, %d reused", &e1, &r1), 2);
    assert_int_equal(sscanf(t2, "turn: %d tokens evaluated, %d reused", &e2, &r2), 2);
    assert_int_equal(r1, 0);
    /* turn 2 reuses the whole first turn (prompt + 8 reply tokens) bar at most the reply's retokenized tail */
    if (r2 < e1 || e2 > 24) fail_msg("turn 1: %d evaluated; turn 2: %d evaluated, %d reused", e1, e2, r2);
    free(out);
}

/* ---- pseudo-terminal session ---- */

typedef struct {
    int fd;
    char buf[1 << 17];
    size_t n, mark; /* mark: where the next wait starts looking */
} term;

/* Reads until needle appears after t->mark (then moves the mark past it), or fails after secs. */
static void wait_for(term *t, const char *needle, double secs) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        t->buf[t->n] = 0;
        char *hit = strstr(t->buf + t->mark, needle);
        if (hit) {
            t->mark = (size_t)(hit - t->buf) + strlen(needle);
            return;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double el = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (el > secs) fail_msg("waited %.0f s for '%s'; terminal shows: '%s'", secs, needle, t->buf + t->mark);
        struct pollfd p = {t->fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0) {
            ssize_t k = read(t->fd, t->buf + t->n, sizeof t->buf - 1 - t->n);
            if (k <= 0) fail_msg("terminal closed while waiting for '%s': '%s'", needle, t->buf + t->mark);
            t->n += (size_t)k;
            if (t->n > sizeof t->buf - 4096) { /* keep the tail */
                size_t keep = 8192, drop = t->n - keep;
                memmove(t->buf, t->buf + drop, keep);
                t->n = keep;
                t->mark = t->mark > drop ? t->mark - drop : 0;
            }
        }
    }
}

/* Waits until at least `bytes` more arrive after the mark (a reply streaming). */
static void wait_bytes(term *t, size_t bytes, double secs) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t start = t->mark;
    while (t->n < start + bytes) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) > secs) fail_msg("no streamed reply: '%s'", t->buf + start);
        struct pollfd p = {t->fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0) {
            ssize_t k = read(t->fd, t->buf + t->n, sizeof t->buf - 1 - t->n);
            if (k <= 0) fail_msg("terminal closed during the reply");
            t->n += (size_t)k;
        }
    }
    t->mark = t->n;
}

static void type(term *t, const char *s) {
    size_t n = strlen(s);
    assert_int_equal(write(t->fd, s, n), (ssize_t)n);
}

static void test_pty_session(void **state) {
    char exe[1024];
    snprintf(exe, sizeof exe, "%s/kvq-chat", KVQ_TOOLS_DIR);
    static term t;
    memset(&t, 0, sizeof t);
    struct winsize ws = {.ws_row = 40, .ws_col = 200};
    const char *home = tu_tmpdir(); /* made here: a child would make its own */
    pid_t pid = forkpty(&t.fd, NULL, NULL, &ws);
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("HOME", home, 1);
        setenv("TERM", "xterm", 1);
        unsetenv("NO_COLOR");
        /* --ignore-eos: replies run until Ctrl-C (with context shifts in 256 tokens) */
        execl(exe, "kvq-chat", "--seed", "1", "-t", "1", "-c", "256", "--ignore-eos", (char *)NULL);
        _exit(127);
    }
    double T = 60; /* generous: CI machines are shared */
    const char *PROMPT = ">\033[0m "; /* the coloured prompt marker */
    wait_for(&t, "Ctrl-D exits.", T);
    wait_for(&t, PROMPT, T);
    type(&t, "The jury said\r");
    wait_for(&t, "The jury said\r\n", T); /* echoed */
    wait_bytes(&t, 40, T);                /* the reply streams in */
    type(&t, "\003");                     /* Ctrl-C stops it ... */
    wait_for(&t, PROMPT, T);                /* ... and the prompt is back */
    type(&t, "\033[A");                   /* Up recalls the line */
    wait_for(&t, "The jury said", T);
    type(&t, "\r");
    wait_for(&t, "\r\n", T);
    wait_bytes(&t, 40, T);
    type(&t, "\003");
    wait_for(&t, PROMPT, T);
    type(&t, "/stats\r");
    wait_for(&t, "generation:", T);
    wait_for(&t, "tokens", T);
    wait_for(&t, "KV cache: K f16", T);
    wait_for(&t, "seed 1", T);
    wait_for(&t, PROMPT, T);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "/save %s/conv.json\r", home);
    type(&t, cmd);
    wait_for(&t, "saved ", T); /* 4 messages, or 2 when the first long reply was dropped */
    wait_for(&t, " messages to ", T);
    wait_for(&t, "tokens of KV cache to ", T); /* FILE.kvq beside it */
    wait_for(&t, PROMPT, T);
    snprintf(cmd, sizeof cmd, "/load %s/conv.json\r", home);
    type(&t, cmd);
    wait_for(&t, "loaded ", T);
    wait_for(&t, " messages from ", T);
    wait_for(&t, "tokens of KV cache restored", T);
    wait_for(&t, PROMPT, T);
    type(&t, "/reset\r");
    wait_for(&t, "conversation cleared", T);
    wait_for(&t, PROMPT, T);
    type(&t, "\004"); /* Ctrl-D */
    int status = 0;
    size_t tail = 0;
    char sink[4096];
    for (int i = 0; i < 1800; i++) { /* drain the terminal until the program exits (3 min: ASan on a loaded CI) */
        struct pollfd p = {t.fd, POLLIN, 0};
        int ready = poll(&p, 1, 100) > 0;
        ssize_t k = ready ? read(t.fd, sink + tail, sizeof sink - 1 - tail) : 0;
        if (k > 0) { /* keep the last output for the message */
            tail += (size_t)k;
            if (tail > sizeof sink / 2) {
                memmove(sink, sink + tail - sizeof sink / 4, sizeof sink / 4);
                tail = sizeof sink / 4;
            }
        } else if (ready) {
            usleep(100000); /* hung up (EOF or EIO, no wait in poll): it is exiting */
        }
        if (waitpid(pid, &status, WNOHANG) == pid) {
            pid = 0;
            break;
        }
    }
    if (pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        sink[tail] = 0;
        fail_msg("kvq-chat did not exit after Ctrl-D; last output: '%s'", sink);
    }
    close(t.fd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("exit status %d", status);
    /* the history file kept the line */
    char hist[1024];
    snprintf(hist, sizeof hist, "%s/.kvq_history", tu_tmpdir());
    char *h = tu_read_file(hist, NULL);
    assert_non_null(strstr(h, "jury"));
    free(h);
}

/* Ctrl-C at an empty prompt exits 0 too. */
static void test_pty_ctrl_c_exits(void **state) {
    char exe[1024];
    snprintf(exe, sizeof exe, "%s/kvq-chat", KVQ_TOOLS_DIR);
    static term t;
    memset(&t, 0, sizeof t);
    const char *home = tu_tmpdir();
    pid_t pid = forkpty(&t.fd, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("HOME", home, 1);
        setenv("NO_COLOR", "1", 1);
        execl(exe, "kvq-chat", "-t", "1", (char *)NULL);
        _exit(127);
    }
    wait_for(&t, "> ", 60);
    type(&t, "\003");
    int status = 0;
    int i = 0;
    for (; i < 600 && waitpid(pid, &status, WNOHANG) != pid; i++) {
        char sink[4096];
        struct pollfd p = {t.fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0 && read(t.fd, sink, sizeof sink) <= 0) usleep(100000);
    }
    if (i == 600) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("kvq-chat did not exit after Ctrl-C at an empty prompt");
    }
    close(t.fd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("Ctrl-C at an empty prompt: status %d", status);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pty_session),          cmocka_unit_test(test_pty_ctrl_c_exits),
        cmocka_unit_test(test_piped_lines),          cmocka_unit_test(test_ten_turns_small_context),
        cmocka_unit_test(test_template_incremental), cmocka_unit_test(test_keep),
        cmocka_unit_test(test_prompt_cache),
        cmocka_unit_test(test_one_shot_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
