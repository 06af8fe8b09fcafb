/*
 * Runs fuzz_sdpa.c's LLVMFuzzerTestOneInput without libFuzzer: every file of the given corpus
 * directories (the seed corpus and every past finding, as regressions), then N inputs drawn
 * from a seeded PRNG. Registered in the default suite; -Dfuzz=true builds the real fuzzer.
 *   fuzz_replay [-random N] [-seed S] DIR_OR_FILE...
 *   fuzz_replay [-seed S] -dump K FILE   (writes random input K, e.g. a finding of -random, as a seed)
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rb_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long g_runs;

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    ++g_runs;
}

static void run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        run_path(full);
    }
    if (d)
        closedir(d);
}

int main(int argc, char **argv)
{
    long random_inputs = 0, dump = -1;
    const char *dump_to = NULL;
    uint64_t seed = 1;
    long files = 0;
    for (int a = 1; a < argc; ++a) {
        if (strcmp(argv[a], "-random") == 0 && a + 1 < argc) {
            random_inputs = atol(argv[++a]);
        } else if (strcmp(argv[a], "-dump") == 0 && a + 2 < argc) {
            dump = atol(argv[++a]);
            dump_to = argv[++a];
        } else if (strcmp(argv[a], "-seed") == 0 && a + 1 < argc) {
            seed = strtoull(argv[++a], NULL, 0);
        } else {
            run_path(argv[a]);
        }
    }
    files = g_runs;
    if (dump >= random_inputs)
        random_inputs = dump + 1;
    rb_rng r = {seed};
    static uint8_t buf[2048];
    for (long t = 0; t < random_inputs; ++t) {
        size_t n = (size_t)rb_int(&r, 1, (int64_t)sizeof buf);
        for (size_t b = 0; b < n; ++b)
            buf[b] = (uint8_t)rb_next(&r);
        if (t == dump) { /* save random input number t (from 0) as a corpus file, and stop */
            FILE *f = fopen(dump_to, "wb");
            if (f == NULL || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
                perror(dump_to);
                return 2;
            }
            printf("fuzz_replay: random input %ld (seed %llu, %zu bytes) written to %s\n", t, (unsigned long long)seed, n,
                   dump_to);
            return 0;
        }
        LLVMFuzzerTestOneInput(buf, n);
        ++g_runs;
    }
    printf("fuzz_replay: %ld corpus files and %ld random inputs executed, no finding\n", files, g_runs - files);
    return 0;
}
