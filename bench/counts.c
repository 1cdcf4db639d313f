/* SPDX-License-Identifier: Apache-2.0
 *
 * counts.c - the count and displacement arrays of the programs whose calls
 * take them (alltoallv_perf, all_gatherv_perf, reduce_scatterv_perf): kept
 * between calls, since a call queued on a stream reads them later, and the
 * uneven pattern of common.h (rank r's block r+1 units).
 */
#include "common.h"

#include <stdlib.h>

loomResult_t bench_kept_arrays(loomComm_t comm, loomStream_t stream, size_t param,
                               void (*fill)(size_t *v, int n, size_t param), size_t **v_p, int *n_p)
{
    static size_t *v, vparam, vn;
    int n = 0;
    loomResult_t res = loomCommCount(comm, &n);
    if (res != loomSuccess)
        return res;
    if (v == NULL || vn != (size_t)n || vparam != param) {
        if (v != NULL && stream != NULL && (res = loomStreamSynchronize(stream)) != loomSuccess)
            return res;
        free(v);
        v = malloc(2 * (size_t)n * sizeof(*v));
        if (v == NULL)
            return loomSystemError;
        fill(v, n, param);
        vn = (size_t)n;
        vparam = param;
    }
    *v_p = v;
    *n_p = n;
    return loomSuccess;
}

size_t bench_v_unit(size_t count, size_t elt_size, int nranks)
{
    const size_t parts = (size_t)nranks * (size_t)(nranks + 1) / 2;
    return bench_round16(count / parts, elt_size);
}

static void fill_v(size_t *v, int n, size_t unit)
{
    for (int r = 0; r < n; r++) {
        v[r] = bench_v_block(unit, r);
        v[n + r] = bench_v_displ(unit, r);
    }
}

loomResult_t bench_v_arrays(loomComm_t comm, loomStream_t stream, size_t unit,
                            const size_t **counts, const size_t **displs, int *rank)
{
    size_t *v = NULL;
    int n = 0;
    loomResult_t res = bench_kept_arrays(comm, stream, unit, fill_v, &v, &n);
    if (res == loomSuccess)
        res = loomCommUserRank(comm, rank);
    *counts = v;
    *displs = v ? v + n : NULL;
    return res;
}
