/* Row softmax over the allowed entries of a score row. */
#include "internal.h"

#include <math.h>

float sdpa__masked_max(const float *s, const uint8_t *allowed, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j)
        if (allowed[j] && s[j] > m)
            m = s[j];
    return m;
}

double sdpa__masked_exp_sum(float *s, const uint8_t *allowed, int64_t n, float max) {
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        float e = allowed[j] ? expf(s[j] - max) : 0.0f;
        s[j] = e;
        sum += e;
    }
    return sum;
}
