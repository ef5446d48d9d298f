/* Model load progress for kvq-chat: a bar on stderr, on a TTY only and only
 * once loading has taken a second. The loader has no progress hook, so the
 * fraction is an estimate: memory made resident since the start (mapped weight
 * pages touched, repacked copies) against the size of the weight files. */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"

static double resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

static double weight_bytes(const char *dir) {
    DIR *d = opendir(dir);
    double total = 0;
    struct dirent *e;
    char path[4096];
    struct stat st;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) == 0) total += (double)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

static void *run(void *arg) {
    chat_progress *p = arg;
    double t0 = kvq_tool_now(), base = resident_bytes();
    while (!p->done) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double el = kvq_tool_now() - t0;
        if (p->done || el < 1.0) continue;
        double frac = p->total > 0 ? (resident_bytes() - base) / p->total : 0;
        frac = frac < 0 ? 0 : frac > 0.99 ? 0.99 : frac;
        char bar[41];
        int fill = (int)(frac * 40);
        for (int i = 0; i < 40; i++) bar[i] = i < fill ? '#' : '.';
        bar[40] = 0;
        fprintf(stderr, "\r%s: loading [%s] %3.0f%% of %.1f GB, %.0f s", CHAT_PROG, bar, 100 * frac, p->total / 1e9, el);
        fflush(stderr);
        p->shown = 1;
    }
    return NULL;
}

void chat_progress_start(chat_progress *p, const char *dir) {
    memset(p, 0, sizeof *p);
    if (!isatty(STDERR_FILENO)) return;
    p->total = weight_bytes(dir);
    p->running = pthread_create(&p->th, NULL, run, p) == 0;
}

void chat_progress_stop(chat_progress *p) {
    if (!p->running) return;
    p->done = 1;
    pthread_join(p->th, NULL);
    if (p->shown) fprintf(stderr, "\r\033[K");
    p->running = 0;
}
