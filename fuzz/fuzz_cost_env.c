/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_cost_env.c - libFuzzer harness for the LOOM_COST_<CLASS> constants
 * ("alpha_us,beta_ns,gamma_ns[,o_us[,beta_one_ns[,cold_ns]]]",
 * src/collectives/cost_model.c), checked against a parser of the harness's own:
 * the text split at every comma, 3 to 6 fields, each one whole number that strtod reads to its end,
 * finite and not negative. Both must agree on every input and, where they accept, on every constant
 * (alpha and o in ns; beta_one the fifth field, at most beta, else beta; cold the sixth, else
 * kept); the constants written back out with %a read back the same; and the same text in
 * LOOM_COST_TCP reaches loom_link_cost_default, which takes it or keeps the built-in constants.
 * Built by fuzz/run.sh with cost_model.c, param.c, debug.c and log_line.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost_model.h"
#include "fuzz_check.h"
#include "param.h"

FUZZ_LOOM_LOG_OFF() /* the code under test WARNs every refusal */

/* The reference: 0 and the fields in v[] (alpha, beta, gamma, o, beta_one, cold; NAN
 * where absent), or -1. */
static int ref_parse(const char *text, double v[6])
{
    int fields = 0;
    const char *s = text;
    for (;;) {
        const char *comma = strchr(s, ',');
        const size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (fields == 6 || len == 0 || len > 200)
            return -1;
        char field[201];
        memcpy(field, s, len);
        field[len] = '\0';
        char *end = NULL;
        const double d = strtod(field, &end);
        if (end != field + len || !(d >= 0) || !isfinite(d))
            return -1;
        v[fields++] = d;
        if (comma == NULL)
            break;
        s = comma + 1;
    }
    if (fields < 3)
        return -1;
    for (int k = fields; k < 6; k++)
        v[k] = NAN;
    return 0;
}

static int same(double a, double b)
{
    return a == b && signbit(a) == signbit(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    const loom_link_cost_t keep = {LOOM_LINK_TCP, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, {0}};
    loom_link_cost_t l = keep;
    double v[6];
    const int got = loom_link_cost_parse(text, &l); /* a NUL in the input ends the text */
    REQUIRE(got == ref_parse(text, v));
    if (got != 0) {
        REQUIRE(memcmp(&l, &keep, sizeof(l)) == 0); /* a refusal changes nothing */
    } else {
        REQUIRE(same(l.alpha_ns, v[0] * 1000.0) && same(l.beta_ns, v[1]) && same(l.gamma_ns, v[2]));
        REQUIRE(isnan(v[3]) ? l.o_ns == keep.o_ns : same(l.o_ns, v[3] * 1000.0));
        REQUIRE(same(l.beta_one_ns, isnan(v[4]) || v[4] > v[1] ? v[1] : v[4]));
        REQUIRE(same(l.cold_ns, isnan(v[5]) ? 0.0 : v[5]));
        /* Written back out (o and beta_one given or not), read back the same. */
        char again[256];
        if (isnan(v[3]))
            snprintf(again, sizeof(again), "%a,%a,%a", v[0], v[1], v[2]);
        else if (isnan(v[4]))
            snprintf(again, sizeof(again), "%a,%a,%a,%a", v[0], v[1], v[2], v[3]);
        else if (isnan(v[5]))
            snprintf(again, sizeof(again), "%a,%a,%a,%a,%a", v[0], v[1], v[2], v[3], v[4]);
        else
            snprintf(again, sizeof(again), "%a,%a,%a,%a,%a,%a", v[0], v[1], v[2], v[3], v[4], v[5]);
        loom_link_cost_t back = keep;
        REQUIRE(loom_link_cost_parse(again, &back) == 0);
        REQUIRE(memcmp(&back, &l, sizeof(l)) == 0);
    }
    /* Through the environment: the text's constants, or the built-in ones. */
    setenv("LOOM_COST_TCP", text, 1);
    loom_param_reset_cache();
    const loom_link_cost_t env = loom_link_cost_default(LOOM_LINK_TCP);
    loom_link_cost_t expect = loom_link_cost_builtin(LOOM_LINK_TCP);
    if (text[0] != '\0' && got == 0) {
        expect.alpha_ns = l.alpha_ns;
        expect.beta_ns = l.beta_ns;
        expect.gamma_ns = l.gamma_ns;
        expect.beta_one_ns = l.beta_one_ns;
        if (!isnan(v[3]))
            expect.o_ns = l.o_ns;
        expect.cold_ns = l.cold_ns;
    }
    REQUIRE(env.cls == LOOM_LINK_TCP);
    REQUIRE(same(env.alpha_ns, expect.alpha_ns) && same(env.beta_ns, expect.beta_ns) &&
            same(env.gamma_ns, expect.gamma_ns) && same(env.o_ns, expect.o_ns) &&
            same(env.beta_one_ns, expect.beta_one_ns) && same(env.cold_ns, expect.cold_ns));
    unsetenv("LOOM_COST_TCP");
    free(text);
    return 0;
}
