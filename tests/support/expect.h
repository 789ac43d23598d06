/* EXPECT(cond) for the C99 tests: reports a failed condition with its line
 * and counts it; main returns `failures == 0 ? 0 : 1`. */
#ifndef CMF_TESTS_EXPECT_H
#define CMF_TESTS_EXPECT_H

#include <stdio.h>

static int failures = 0;
#define EXPECT(cond)                                                            \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                         \
        }                                                                       \
    } while (0)

#endif
