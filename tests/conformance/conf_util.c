/* Helpers shared by the conformance runners. */
#include "conf_util.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char *conf_read_file(const char *path, size_t *size, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        snprintf(err, errlen, "out of memory reading %s", path);
        return NULL;
    }
    for (;;) {
        if (len == cap) {
            if (cap > ((size_t)-1) / 4) {
                snprintf(err, errlen, "%s is too large", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            size_t ncap = cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                snprintf(err, errlen, "out of memory reading %s", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(err, errlen, "read error on %s", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            break; /* EOF */
        }
    }
    if (fclose(f) != 0) {
        snprintf(err, errlen, "close error on %s", path);
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    *size = len;
    return buf;
}

cJSON *conf_read_json(const char *path, char *err, size_t errlen)
{
    size_t size = 0;
    char *text = conf_read_file(path, &size, err, errlen);
    if (!text)
        return NULL;
    if (memchr(text, '\0', size) != NULL) {
        snprintf(err, errlen, "%s contains a NUL byte", path);
        free(text);
        return NULL;
    }
    /* The length includes the terminating NUL: cJSON's "require null terminated" check
     * looks at the byte after the value, which must lie inside the given length. */
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, size + 1, &end, 1);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        snprintf(err, errlen, "JSON parse error in %s near byte %ld", path,
                 at ? (long)(at - text) : -1L);
    }
    free(text);
    return root;
}

static int cmp_names(const void *a, const void *b)
{
    const char *const *x = a;
    const char *const *y = b;
    return strcmp(*x, *y);
}

void conf_free_names(char **names, int count)
{
    if (!names)
        return;
    for (int i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

char *conf_path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p)
        return NULL;
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb);
    p[la + 1 + lb] = '\0';
    return p;
}

int conf_list_dir(const char *dir, int want_dirs, const char *suffix, char ***names, char *err,
                  size_t errlen)
{
    *names = NULL;
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "cannot open directory %s: %s", dir, strerror(errno));
        return -1;
    }
    char **list = NULL;
    int count = 0, cap = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *full = conf_path_join(dir, e->d_name);
        if (!full)
            goto oom;
        struct stat st;
        int ok = stat(full, &st) == 0;
        free(full);
        if (!ok) {
            snprintf(err, errlen, "cannot stat %s/%s", dir, e->d_name);
            goto fail;
        }
        if (want_dirs ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
            continue;
        if (suffix) {
            size_t ln = strlen(e->d_name), ls = strlen(suffix);
            if (ln < ls || strcmp(e->d_name + ln - ls, suffix) != 0)
                continue;
        }
        if (count == cap) {
            int ncap = cap ? cap * 2 : 64;
            char **nl = realloc(list, (size_t)ncap * sizeof *nl);
            if (!nl)
                goto oom;
            list = nl;
            cap = ncap;
        }
        list[count] = malloc(strlen(e->d_name) + 1);
        if (!list[count])
            goto oom;
        strcpy(list[count], e->d_name);
        count++;
        errno = 0;
    }
    if (errno != 0) {
        snprintf(err, errlen, "error reading directory %s: %s", dir, strerror(errno));
        goto fail;
    }
    closedir(d);
    if (count > 1)
        qsort(list, (size_t)count, sizeof *list, cmp_names);
    *names = list;
    return count;
oom:
    snprintf(err, errlen, "out of memory listing %s", dir);
fail:
    conf_free_names(list, count);
    closedir(d);
    return -1;
}

void conf_compare(const float *got, const float *expect, int64_t n, double rtol, double atol,
                  conf_cmp *res)
{
    res->mismatches = 0;
    res->first_bad = -1;
    res->max_abs_err = 0.0;
    res->nonfinite_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], e = expect[i];
        int bad;
        if (!isfinite(e) || !isfinite(g)) {
            if (isnan(e))
                bad = !isnan(g);
            else
                bad = !(g == e); /* +-inf must match exactly; NaN got never equals */
            if (bad)
                res->nonfinite_bad = 1;
        } else {
            double d = fabs(g - e);
            if (d > res->max_abs_err)
                res->max_abs_err = d;
            bad = !(d <= atol + rtol * fabs(e));
        }
        if (bad) {
            if (res->first_bad < 0)
                res->first_bad = i;
            res->mismatches++;
        }
    }
}

int conf_json_int(const cJSON *item, int64_t lo, int64_t hi, int64_t *out)
{
    if (!cJSON_IsNumber(item))
        return -1;
    double v = item->valuedouble;
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v))
        return -1;
    *out = (int64_t)v;
    return 0;
}

int conf_same_shape(int rank_a, const int64_t *shape_a, int rank_b, const int64_t *shape_b)
{
    if (rank_a != rank_b)
        return 0;
    for (int d = 0; d < rank_a; d++)
        if (shape_a[d] != shape_b[d])
            return 0;
    return 1;
}

int64_t conf_numel(const int64_t *shape, int rank)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++) {
        if (shape[d] < 0)
            return -1;
        if (shape[d] != 0 && n > INT64_MAX / shape[d])
            return -1;
        n *= shape[d];
    }
    return n;
}

int conf_json_shape(const cJSON *arr, int64_t *shape, int max_rank)
{
    if (!cJSON_IsArray(arr))
        return -1;
    int rank = cJSON_GetArraySize(arr);
    if (rank < 0 || rank > max_rank)
        return -1;
    int d = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (conf_json_int(it, 0, (int64_t)1 << 40, &shape[d]) != 0)
            return -1;
        d++;
    }
    return rank;
}
