/* main() for builds without libFuzzer: runs a fuzz target once on every file
 * named on the command line (directories: every file inside), so the seed
 * corpora are exercised by ctest under any compiler. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: cannot open\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0, r;
    uint8_t *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) return 1;
    /* an exact-size copy, so reads past the input trip ASan as under libFuzzer */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) return 1;
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv) {
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: missing\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        char p[4096];
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            bad |= run_file(p);
            files++;
        }
        if (d) closedir(d);
    }
    printf("replay: %d inputs\n", files);
    if (!files) fprintf(stderr, "replay: no inputs\n");
    return bad || !files;
}
