/* Compiled (syntax only) by clang with -Weverything -Wdocumentation -Werror, as C11 and as
 * C++11 (tests/header/meson.build): the public header must add no warning. It uses every
 * inline function and a few macros so that they are checked too. */
#include <sdpa.h>

static int header_ok(void);
static int header_ok(void) {
    sdpa_options opt;
    sdpa_mha_params params;
    sdpa_mha_options mha;
    sdpa_options_init(&opt);
    sdpa_mha_params_init(&params);
    sdpa_mha_options_init(&mha);
    return SDPA_VERSION_NUMBER > 0 && SDPA_MAX_RANK == 8 && opt.causal == 0 &&
           params.num_heads == 0 && mha.causal == 0;
}

int main(void) {
    return header_ok() ? 0 : 1;
}
