/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_check.h - what the harnesses in fuzz/ share: REQUIRE, which traps (a crash libFuzzer
 * reports with the input) when an invariant does not hold, and loom's logging turned off for
 * harnesses whose code WARNs every refusal. Nothing else; included by each fuzz_*.c.
 */
#ifndef LOOM_FUZZ_CHECK_H
#define LOOM_FUZZ_CHECK_H

#include <stdlib.h>

#define REQUIRE(_cond)                                                                             \
    do {                                                                                           \
        if (!(_cond))                                                                              \
            __builtin_trap();                                                                      \
    } while (0)

/* Defines libFuzzer's initializer to set LOOM_DEBUG=NONE before loom reads it. */
#define FUZZ_LOOM_LOG_OFF()                                                                        \
    int LLVMFuzzerInitialize(int *argc, char ***argv)                                              \
    {                                                                                              \
        (void)argc;                                                                                \
        (void)argv;                                                                                \
        setenv("LOOM_DEBUG", "NONE", 1);                                                           \
        return 0;                                                                                  \
    }

#endif
