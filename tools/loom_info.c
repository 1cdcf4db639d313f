/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_info.c - what this loom build is and how it is configured: version,
 * transports built in, the algorithms per collective, and (-p) every LOOM_*
 * parameter with its current value and documentation. Like ucx_info.
 * Reads internals (the parameter and transport tables); changes nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"
#include "kernels.h"
#include "loom.h"
#include "param.h"
#include "transport.h"

static void usage(void)
{
    printf("usage: loom_info [-v] [-p] [-a] [-h]\n"
           "  -v  version and build (default)\n"
           "  -p  every LOOM_* parameter: value, default, documentation\n"
           "  -a  algorithms per collective (first = default)\n");
}

static void print_version(void)
{
    int v = 0;
    loomGetVersion(&v);
    printf("# loom version %d.%d.%d (code %d)\n", v / 10000, (v / 100) % 100, v % 100, v);
    int n = 0;
    const loom_tp_t *const *reg = loom_tp_registry(&n);
    printf("# transports:");
    for (int i = 0; i < n; i++)
        printf(" %s", reg[i]->name);
    printf("\n# device buffers: none (host memory only)\n");
    printf("# reduction kernels: %s\n", loom_kernels_isa_name(loom_kernels_isa()));
}

static void print_params(void)
{
    int n = 0;
    const loom_param_info_t *t = loom_param_table(&n);
    for (int i = 0; i < n; i++) {
        char var[96];
        snprintf(var, sizeof(var), "LOOM_%s", t[i].name);
        const char *val = getenv(var);
        printf("%-22s = %-12s (default %s, %s, %s)\n    %s\n", var, val ? val : t[i].def,
               t[i].def[0] ? t[i].def : "empty", t[i].type, t[i].subsys, t[i].doc);
    }
}

static void print_algos(void)
{
    for (int k = 0; k < LOOM_COLL_NUM; k++) {
        printf("%-14s", loom_coll_name((loom_coll_kind_t)k));
        int n = 0;
        const loom_algo_t *a = loom_algo_table(&n);
        for (int i = 0; i < n; i++)
            if (a[i].kind == (loom_coll_kind_t)k)
                printf(" %s", a[i].name);
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    int opt, any = 0;
    while ((opt = getopt(argc, argv, "vpah")) != -1) {
        any = 1;
        switch (opt) {
        case 'v':
            print_version();
            break;
        case 'p':
            print_params();
            break;
        case 'a':
            print_algos();
            break;
        case 'h':
            usage();
            return 0;
        default:
            usage();
            return 2;
        }
    }
    if (!any)
        print_version();
    return 0;
}
