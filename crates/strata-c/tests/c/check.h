/* What the C test programs share: CHECK/OK (count a check; on failure name it, with strata's
 * last error, and exit 1) and a small xorshift generator seeded from the command line. */
#ifndef STRATA_TEST_CHECK_H
#define STRATA_TEST_CHECK_H

#include "strata.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks = 0;
#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        checks++;                                                            \
        if (!(cond)) {                                                       \
            fprintf(stderr, "FAILED line %d: %s: ", __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, " (last error: %s)\n", strata_last_error());     \
            exit(1);                                                         \
        }                                                                    \
    } while (0)
#define OK(call) CHECK((call) == STRATA_OK, "%s", #call)

static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

#endif
