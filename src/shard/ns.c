/* SPDX-License-Identifier: Apache-2.0
 *
 * ns.c - Newton-Schulz orthogonalisation of one float32 matrix (loomNewtonSchulz), the
 * operation every Muon step runs on the owner's matrices. Three cblas_sgemm per iteration on the
 * wide orientation (short side first). A tall matrix is read transposed by the normalising pass
 * that every input needs, after which both orientations make the very same BLAS calls, so NS(U)
 * is bitwise the transpose of NS(U^T) whatever the BLAS. Never changes the BLAS thread count
 * (docs/shard.md, "Kernels").
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "loom_shard.h"

/* Keller Jordan's quintic: the slope at zero maximised rather than exact convergence; five
 * steps leave the singular values of a Gaussian input in about [0.68, 1.14]. */
static const float ns_default_coeffs[3] = {3.4445f, -4.7750f, 2.0315f};

/* Short and long side; 0 when the shape is empty or beyond what BLAS's int and size_t hold. */
static int ns_sides(size_t rows, size_t cols, size_t *m, size_t *n)
{
    *m = rows < cols ? rows : cols;
    *n = rows < cols ? cols : rows;
    if (*m == 0 || *n > (size_t)INT_MAX)
        return 0;
    /* 2 m^2 + 2 m n floats must fit a size_t of bytes. */
    size_t lim = SIZE_MAX / sizeof(float) / 4;
    return *m <= lim / *n && *m <= lim / *m;
}

size_t loomNewtonSchulzWorkspace(size_t rows, size_t cols)
{
    size_t m, n;
    if (!ns_sides(rows, cols, &m, &n))
        return 0;
    return 2 * m * m + 2 * m * n; /* A and B (m x m), X and the next X (m x n) */
}

static int ranges_overlap(const float *a, size_t na, const float *b, size_t nb)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 < b0 + nb * sizeof(float) && b0 < a0 + na * sizeof(float);
}

static loomResult_t ns_check(const float *out, const float *in, size_t rows, size_t cols, int steps,
                             float eps, const float *work)
{
    if (out == NULL || in == NULL || work == NULL) {
        LOOM_WARN("loomNewtonSchulz: out %p, in %p and work %p must not be NULL", (void *)out,
                  (const void *)in, (const void *)work);
        return loomInvalidArgument;
    }
    size_t m, n;
    if (!ns_sides(rows, cols, &m, &n)) {
        LOOM_WARN("loomNewtonSchulz: a %zu x %zu matrix: both sides must be >= 1 and the longer "
                  "at most %d",
                  rows, cols, INT_MAX);
        return loomInvalidArgument;
    }
    if (steps < 1) {
        LOOM_WARN("loomNewtonSchulz: steps %d must be >= 1", steps);
        return loomInvalidArgument;
    }
    if (!(eps > 0.0f) || isinf(eps)) {
        LOOM_WARN("loomNewtonSchulz: eps %g must be positive and finite (it divides a zero "
                  "input)",
                  (double)eps);
        return loomInvalidArgument;
    }
    size_t ws = loomNewtonSchulzWorkspace(rows, cols);
    if (ranges_overlap(work, ws, in, rows * cols) || ranges_overlap(work, ws, out, rows * cols)) {
        LOOM_WARN("loomNewtonSchulz: work (%zu floats at %p) overlaps in or out (%zu x %zu)", ws,
                  (const void *)work, rows, cols);
        return loomInvalidArgument;
    }
    if (out != in && ranges_overlap(out, rows * cols, in, rows * cols)) {
        LOOM_WARN("loomNewtonSchulz: out %p and in %p overlap without being equal (%zu x %zu)",
                  (const void *)out, (const void *)in, rows, cols);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* X (m x n, row-major) = the wide orientation of in, divided by max(||in||_F, eps). The sum of
 * squares runs in double over X in memory order, the order a wide input is stored in, so that U
 * and U^T get the same scale to the bit. */
static void ns_normalise(float *X, const float *in, size_t rows, size_t cols, float eps)
{
    const size_t count = rows * cols;
    if (rows <= cols) {
        memcpy(X, in, count * sizeof(float));
    } else {
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++)
                X[c * rows + r] = in[r * cols + c];
    }
    double ss = 0.0;
    for (size_t i = 0; i < count; i++)
        ss += (double)X[i] * (double)X[i];
    double norm = sqrt(ss);
    float d = (float)(norm > (double)eps ? norm : (double)eps);
    for (size_t i = 0; i < count; i++)
        X[i] = X[i] / d;
}

loomResult_t loomNewtonSchulz(float *out, const float *in, size_t rows, size_t cols, int steps,
                              const float *coeffs, float eps, float *work)
{
    LOOM_CHECK(ns_check(out, in, rows, cols, steps, eps, work));
    size_t m, n;
    ns_sides(rows, cols, &m, &n);
    /* Reading a tall input through BLAS's transpose flags instead would make the two
     * orientations run different kernels (NT against TN, or the operands' roles swapped), and
     * OpenBLAS's kernels then round differently (docs/shard.md). */
    const int im = (int)m, in_ = (int)n;
    float *A = work, *B = A + m * m, *X = B + m * m, *Y = X + m * n;
    ns_normalise(X, in, rows, cols, eps);
    for (int s = 0; s < steps; s++) {
        const float *c = coeffs ? coeffs + 3 * (size_t)s : ns_default_coeffs;
        /* A = X X^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, im, im, in_, 1.0f, X, in_, X, in_,
                    0.0f, A, im);
        /* B = b A + c A A */
        memcpy(B, A, m * m * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, im, im, c[2], A, im, A, im, c[1],
                    B, im);
        /* X = a X + B X, into the other buffer */
        memcpy(Y, X, m * n * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, in_, im, 1.0f, B, im, X, in_,
                    c[0], Y, in_);
        float *t = X;
        X = Y;
        Y = t;
    }
    if (rows <= cols) {
        memcpy(out, X, m * n * sizeof(float));
    } else {
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++)
                out[r * cols + c] = X[c * rows + r];
    }
    return loomSuccess;
}
