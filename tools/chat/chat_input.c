/* kvq-chat line input. On a TTY: libedit (emacs keys, arrows, Ctrl-R search,
 * history in ~/.kvq_history), a line ending in '\' continues on the next one.
 * Otherwise: one line of any length per read, no prompt, no editing. */
#include <errno.h>
#include <histedit.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>
#include <wchar.h>

#include "chat.h"

volatile sig_atomic_t chat_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    chat_interrupted = 1;
}

void chat_install_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a read at the prompt returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

struct chat_input {
    int tty, color, cont;
    EditLine *el;
    History *hist;
    char hist_path[PATH_MAX];
    struct termios saved; /* the terminal as we found it */
    int saved_ok;
};

static char *prompt_fn(EditLine *el) {
    chat_input *in = NULL;
    el_get(el, EL_CLIENTDATA, &in);
    const char *mark = in && in->cont ? "." : ">";
    static char buf[64];
    /* the colour reset goes before the space: libedit drops an escape that ends the prompt */
    if (in && in->color) snprintf(buf, sizeof buf, "\1\033[1;32m\1%s\1\033[0m\1 ", mark);
    else snprintf(buf, sizeof buf, "%s ", mark);
    return buf;
}

/* libedit's character reader, replaced so that it polls: a Ctrl-C that lands
 * between the end of a reply and the read still ends the read (the built-in
 * reader would block with the signal already handled). Decodes UTF-8 itself. */
static int getc_fn(EditLine *el, wchar_t *wc) {
    (void)el;
    unsigned char b[4];
    int n = 0, need = 1;
    for (;;) {
        if (chat_interrupted) {
            errno = EINTR;
            return -1;
        }
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        int r = poll(&p, 1, 100);
        if (r < 0 && errno != EINTR) return -1;
        if (r <= 0) continue;
        ssize_t k = read(STDIN_FILENO, b + n, 1);
        if (k == 0) return 0;
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) need = b[0] < 0x80 ? 1 : b[0] >= 0xf0 ? 4 : b[0] >= 0xe0 ? 3 : b[0] >= 0xc0 ? 2 : 1;
        else if ((b[n] & 0xc0) != 0x80) { /* broken sequence: give the byte as is */
            *wc = b[n];
            return 1;
        }
        if (++n < need) continue;
        uint32_t cp = need == 1 ? b[0] : need == 2 ? b[0] & 0x1f : need == 3 ? b[0] & 0x0f : b[0] & 0x07;
        for (int i = 1; i < need; i++) cp = cp << 6 | (b[i] & 0x3f);
        *wc = (wchar_t)cp;
        return 1;
    }
}

chat_input *chat_input_open(int tty, int color) {
    chat_input *in = calloc(1, sizeof *in);
    if (!in) return NULL;
    in->tty = tty;
    in->color = color;
    if (!tty) return in;
    /* Between reads libedit leaves the terminal in cooked mode, where a Ctrl-D typed early
     * (right as the prompt appears, or pasted) becomes an end-of-file mark that the switch
     * to raw mode throws away: the Ctrl-D is lost. With VEOF off it stays a plain 0x04 byte
     * that libedit reads as end of input. libedit saves this state as its cooked mode. */
    if (tcgetattr(STDIN_FILENO, &in->saved) == 0) {
        in->saved_ok = 1;
        struct termios t = in->saved;
        t.c_cc[VEOF] = _POSIX_VDISABLE;
        tcsetattr(STDIN_FILENO, TCSADRAIN, &t);
    }
    in->el = el_init(CHAT_PROG, stdin, stdout, stderr);
    in->hist = history_init();
    if (!in->el || !in->hist) {
        chat_input_close(in);
        return NULL;
    }
    HistEvent ev;
    history(in->hist, &ev, H_SETSIZE, 1000);
    history(in->hist, &ev, H_SETUNIQUE, 1);
    const char *home = getenv("HOME");
    if (home && *home) {
        snprintf(in->hist_path, sizeof in->hist_path, "%s/.kvq_history", home);
        history(in->hist, &ev, H_LOAD, in->hist_path);
    }
    el_set(in->el, EL_CLIENTDATA, in);
    el_set(in->el, EL_EDITOR, "emacs");
    /* ... and libedit's own cooked mode may bring VEOF back: a Ctrl-D typed while the prompt is
     * being drawn (in that mode) became the kernel's end-of-file mark, read after the switch to
     * raw mode as a NUL byte, and kvq-chat waited on (strace of a hung test under load). Without
     * ICANON between reads a Ctrl-D is always a plain byte. */
    el_set(in->el, EL_SETTY, "-x", "-icanon", NULL);
    el_set(in->el, EL_PROMPT_ESC, prompt_fn, '\1');
    el_set(in->el, EL_HIST, history, in->hist);
    el_set(in->el, EL_SIGNAL, 1);
    el_set(in->el, EL_GETCFN, getc_fn);
    el_set(in->el, EL_BIND, "^R", "em-inc-search-prev", NULL);
    el_source(in->el, NULL); /* ~/.editrc, as other libedit programs */
    return in;
}

void chat_input_close(chat_input *in) {
    if (!in) return;
    HistEvent ev;
    if (in->hist && in->hist_path[0]) history(in->hist, &ev, H_SAVE, in->hist_path);
    if (in->el) el_end(in->el);
    if (in->hist) history_end(in->hist);
    if (in->saved_ok) tcsetattr(STDIN_FILENO, TCSADRAIN, &in->saved);
    free(in);
}

static int read_plain(char **line) {
    size_t cap = 0;
    char *buf = NULL;
    errno = 0;
    ssize_t n = getline(&buf, &cap, stdin);
    if (n < 0) {
        free(buf);
        return chat_interrupted ? CHAT_IN_INTR_EMPTY : CHAT_IN_EOF;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    *line = buf;
    return CHAT_IN_LINE;
}

int chat_input_read(chat_input *in, char **line) {
    *line = NULL;
    chat_interrupted = 0;
    if (!in->tty) return read_plain(line);
    char *acc = NULL;
    size_t acc_n = 0;
    in->cont = 0;
    for (;;) {
        int n = 0;
        const char *l = el_gets(in->el, &n);
        if (!l) {
            int had_text = acc_n > 0;
            const LineInfo *li = el_line(in->el);
            if (li && li->lastchar > li->buffer) had_text = 1;
            free(acc);
            if (n < 0 && chat_interrupted) {
                el_reset(in->el);
                fputc('\n', stdout);
                fflush(stdout);
                return had_text ? CHAT_IN_INTR_TEXT : CHAT_IN_INTR_EMPTY;
            }
            return CHAT_IN_EOF; /* Ctrl-D on an empty line, or a read error */
        }
        size_t len = strlen(l);
        while (len && (l[len - 1] == '\n' || l[len - 1] == '\r')) len--;
        int more = len && l[len - 1] == '\\';
        if (more) len--;
        char *a = realloc(acc, acc_n + len + 2);
        if (!a) {
            free(acc);
            return CHAT_IN_EOF;
        }
        acc = a;
        memcpy(acc + acc_n, l, len);
        acc_n += len;
        if (more) acc[acc_n++] = '\n';
        acc[acc_n] = 0;
        if (!more) break;
        in->cont = 1;
    }
    in->cont = 0;
    if (acc_n) {
        HistEvent ev;
        history(in->hist, &ev, H_ENTER, acc);
    }
    *line = acc;
    return CHAT_IN_LINE;
}
