/* Helpers shared by the conformance runners: files, directories, JSON, comparison. */
#ifndef SDPA_CONF_UTIL_H
#define SDPA_CONF_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

/* Read a whole file. Returns a malloc'd buffer (NUL-terminated one byte past *size) or NULL,
 * with a reason in err[errlen]. */
char *conf_read_file(const char *path, size_t *size, char *err, size_t errlen);

/* Parse a JSON file; NULL with a reason in err on failure. Free with cJSON_Delete. */
cJSON *conf_read_json(const char *path, char *err, size_t errlen);

/* Sorted list of the entries of directory `dir` (no "." / ".."). want_dirs: 1 = only
 * directories, 0 = only regular files; suffix (nullable) filters file names by ending.
 * Returns the count (>= 0) and *names (free with conf_free_names), or -1 with err. */
int conf_list_dir(const char *dir, int want_dirs, const char *suffix, char ***names, char *err,
                  size_t errlen);
void conf_free_names(char **names, int count);

/* Join a and b with '/' into a malloc'd string (NULL on allocation failure). */
char *conf_path_join(const char *a, const char *b);

/* Comparison of `n` floats `got` against `expect`: |g - e| <= atol + rtol * |e|; non-finite
 * expected values (+-inf, NaN) must be matched exactly (same class and sign). */
typedef struct conf_cmp {
    int64_t mismatches;   /* elements out of tolerance */
    int64_t first_bad;    /* index of the first, or -1 */
    double max_abs_err;   /* over all elements with finite expected and got values */
    int nonfinite_bad;    /* a non-finite mismatch (inf/NaN where not expected or vice versa) */
} conf_cmp;
void conf_compare(const float *got, const float *expect, int64_t n, double rtol, double atol,
                  conf_cmp *res);

/* Integer value of a JSON number that must be an integer in [lo, hi]. 0 on success. */
int conf_json_int(const cJSON *item, int64_t lo, int64_t hi, int64_t *out);

/* Product of shape[0..rank) with an overflow / negative check; -1 on error. */
int64_t conf_numel(const int64_t *shape, int rank);

/* Whether a shape (rank_a, shape_a) equals (rank_b, shape_b). */
int conf_same_shape(int rank_a, const int64_t *shape_a, int rank_b, const int64_t *shape_b);

/* Read a JSON array of up to max_rank integer sizes >= 0. Returns the rank or -1. */
int conf_json_shape(const cJSON *arr, int64_t *shape, int max_rank);

#endif
