// The public header compiles as C++11 and its functions link from C++ (extern "C").
#include <sdpa.h>

#include <cstdio>
#include <cstring>

int main()
{
    sdpa_options options;
    std::memset(&options, 0xAB, sizeof options);
    sdpa_options_init(&options);
    int failures = 0;
    if (options.struct_size != sizeof(sdpa_options)) {
        std::fprintf(stderr, "struct_size %zu != %zu\n", options.struct_size, sizeof(sdpa_options));
        ++failures;
    }
    if (options.scale != 0.0f || options.causal != 0 || options.sliding_window != 0 ||
        options.window_left != -1 || options.window_right != -1 || options.skip_finite_check != 0 ||
        options.allow_mask != nullptr || options.dropout_p != 0.0f || options.num_threads != 0 ||
        options.workspace != nullptr) {
        std::fprintf(stderr, "sdpa_options_init did not set the documented defaults\n");
        ++failures;
    }
    if (sdpa_version() != SDPA_VERSION_NUMBER) {
        std::fprintf(stderr, "sdpa_version() %u != %u\n", sdpa_version(),
                     static_cast<unsigned>(SDPA_VERSION_NUMBER));
        ++failures;
    }
    if (std::strcmp(sdpa_version_string(), SDPA_VERSION_STRING) != 0) {
        std::fprintf(stderr, "sdpa_version_string() \"%s\"\n", sdpa_version_string());
        ++failures;
    }
    const char *name = sdpa_status_string(SDPA_ERR_SHAPE);
    if (name == nullptr || std::strcmp(name, "SDPA_ERR_SHAPE") != 0) {
        std::fprintf(stderr, "sdpa_status_string(SDPA_ERR_SHAPE) wrong\n");
        ++failures;
    }
    // Views of const data need no cast (0.4): an f16 KV-cache slice and a const float32 query.
    static const unsigned short cache[2 * 3 * 4] = {0};
    static const float query[3 * 4] = {0};
    const int64_t shape[2] = {3, 4}, strides[2] = {8, 1};
    sdpa_tensor kv, q;
    if (sdpa_tensor_init_strided(&kv, cache, SDPA_DTYPE_F16, 2, shape, strides) != SDPA_OK ||
        sdpa_tensor_init_dtype(&q, query, SDPA_DTYPE_F32, 2, shape) != SDPA_OK || kv.dtype != SDPA_DTYPE_F16 ||
        sdpa_dtype_size(SDPA_DTYPE_BF16) != 2 || options.precision != SDPA_PRECISION_DEFAULT) {
        std::fprintf(stderr, "const-data views or 0.4 defaults wrong: %s\n", sdpa_last_error_message());
        ++failures;
    }
    std::printf("%s\n", failures ? "FAIL" : "OK");
    return failures ? 1 : 0;
}
