/* SPDX-License-Identifier: Apache-2.0
 *
 * ops_impl.h - the bodies of the kernels declared in ops.h, written once over a real type.
 * ops.c includes it once per type after defining:
 *   T          the element type (float, double)
 *   S          the name suffix (f, d)
 *   OPS_GEMM   the CBLAS gemm of T (cblas_sgemm, cblas_dgemm)
 *   OPS_EXP, OPS_LOG, OPS_SQRT  the libm functions of T (expf, exp, ...)
 * No include guard on purpose: everything type-dependent carries the suffix so that the second
 * inclusion does not collide with the first; the type-free helpers sit under their own guard.
 *
 * Precision: per-element arithmetic is in T; reductions whose result feeds a whole row (the
 * LayerNorm statistics and sums, the cross-entropy, AdamW) run in double, because they are cheap
 * next to the matrix products and float sums over thousands of terms would dominate the float
 * kernels' error. The attention loops stay in T: they are the hot loops.
 */
#if !defined(T) || !defined(S) || !defined(OPS_GEMM) || !defined(OPS_EXP) || !defined(OPS_LOG) ||  \
    !defined(OPS_SQRT)
#error "define T, S, OPS_GEMM, OPS_EXP, OPS_LOG and OPS_SQRT before including ops_impl.h"
#endif

#ifndef OPS_PASTE
#define OPS_PASTE_(a, b) a##_##b
#define OPS_PASTE(a, b)  OPS_PASTE_(a, b)
#define OPS_FN(name)     OPS_PASTE(name, S)
/* Attention tiles: at most OPS_ATTN_TQ query rows by OPS_ATTN_TK keys, whose scores live on the
 * stack (the kernels never allocate): 16 KiB per scratch array in float, 32 in double. */
#define OPS_ATTN_TQ 64
#define OPS_ATTN_TK 64
#define OPS_GELU_K0 0.7978845608028654 /* sqrt(2/pi) */
#define OPS_GELU_K1 0.044715

/* Rows per attention tile for head size hd. OpenBLAS runs a gemm with M N K <= 2^18 on the
 * calling thread and wakes its thread pool above that, which costs more than a tile's arithmetic;
 * so large heads get fewer rows per tile. */
static inline int ops_attn_tile_rows(int hd)
{
    int tq = OPS_ATTN_TQ;
    while (tq > 8 && (int64_t)tq * OPS_ATTN_TK * hd > 262144)
        tq /= 2;
    return tq;
}

static inline void ops_pos_range(const int32_t *pos, int n, int32_t *lo, int32_t *hi)
{
    int32_t a = pos[0], b = pos[0];
    for (int i = 1; i < n; i++) {
        if (pos[i] < a)
            a = pos[i];
        if (pos[i] > b)
            b = pos[i];
    }
    *lo = a;
    *hi = b;
}
#endif

/* --- small vector helpers ---------------------------------------------------------------
 * Unrolled by 8 with independent lanes: at -O2 gcc only vectorises straight-line code (SLP), and
 * eight lanes also break the add latency chain of a reduction. restrict: no caller passes
 * overlapping rows (an activation and a gradient are always different arrays). */

static inline T OPS_FN(ops_dot)(const T *restrict a, const T *restrict b, int n)
{
    T s[8] = {0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int u = 0; u < 8; u++)
            s[u] += a[d + u] * b[d + u];
    T r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; d < n; d++)
        r += a[d] * b[d];
    return r;
}

/* y += a x */
static inline void OPS_FN(ops_axpy)(T *restrict y, T a, const T *restrict x, int n)
{
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int u = 0; u < 8; u++)
            y[d + u] += a * x[d + u];
    for (; d < n; d++)
        y[d] += a * x[d];
}

static inline void OPS_FN(ops_scale)(T *restrict y, T a, int n)
{
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int u = 0; u < 8; u++)
            y[d + u] *= a;
    for (; d < n; d++)
        y[d] *= a;
}

/* --- linear ------------------------------------------------------------------------------ */

void OPS_FN(linear_fwd)(T *y, const T *x, const T *w, int n, int in, int out, int accumulate)
{
    if (n <= 0 || out <= 0)
        return;
    if (in <= 0) { /* an empty sum; BLAS rejects lda = 0 */
        if (!accumulate)
            for (size_t i = 0; i < (size_t)n * (size_t)out; i++)
                y[i] = 0;
        return;
    }
    /* beta = 0 makes BLAS ignore y's old contents, NaN included. */
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, out, in, (T)1, x, in, w, out,
             accumulate ? (T)1 : (T)0, y, out);
}

void OPS_FN(linear_bwd)(T *dx, T *dw, const T *dy, const T *x, const T *w, int n, int in, int out)
{
    if (n <= 0 || in <= 0)
        return;
    if (out <= 0) {
        if (dx)
            for (size_t i = 0; i < (size_t)n * (size_t)in; i++)
                dx[i] = 0;
        return;
    }
    if (dw)
        OPS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, n, (T)1, x, in, dy, out, (T)1,
                 dw, out);
    if (dx)
        OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, n, in, out, (T)1, dy, out, w, out, (T)0,
                 dx, in);
}

/* --- layernorm --------------------------------------------------------------------------- */

void OPS_FN(layernorm_fwd)(T *y, T *mean, T *rstd, const T *x, const T *g, const T *b, int n, int c)
{
    for (int i = 0; i < n; i++) {
        const T *xr = x + (size_t)i * c;
        T *yr = y + (size_t)i * c;
        double sum = 0;
        for (int j = 0; j < c; j++)
            sum += xr[j];
        double mu = sum / c;
        /* Two passes: E[x^2] - mu^2 cancels badly when |mu| >> std. */
        double var = 0;
        for (int j = 0; j < c; j++) {
            double dev = xr[j] - mu;
            var += dev * dev;
        }
        double rs = 1.0 / sqrt(var / c + 1e-5);
        T mu_t = (T)mu, rs_t = (T)rs;
        for (int j = 0; j < c; j++)
            yr[j] = (xr[j] - mu_t) * rs_t * g[j] + b[j];
        mean[i] = mu_t;
        rstd[i] = rs_t;
    }
}

void OPS_FN(layernorm_bwd)(T *dx, T *dg, T *db, const T *dy, const T *x, const T *mean,
                           const T *rstd, const T *g, int n, int c)
{
    for (int i = 0; i < n; i++) {
        const T *xr = x + (size_t)i * c, *dyr = dy + (size_t)i * c;
        T *dxr = dx + (size_t)i * c;
        T mu = mean[i], rs = rstd[i];
        /* dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy g. */
        double s1 = 0, s2 = 0;
        for (int j = 0; j < c; j++) {
            T xhat = (xr[j] - mu) * rs;
            T dxhat = dyr[j] * g[j];
            s1 += dxhat;
            s2 += (double)dxhat * xhat;
            dg[j] += dyr[j] * xhat;
            db[j] += dyr[j];
        }
        T m1 = (T)(s1 / c), m2 = (T)(s2 / c);
        for (int j = 0; j < c; j++) {
            T xhat = (xr[j] - mu) * rs;
            dxr[j] += rs * (dyr[j] * g[j] - m1 - xhat * m2);
        }
    }
}

/* --- gelu ---------------------------------------------------------------------------------
 * 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the sigmoid form needs
 * one exp and gives sigmoid' = e s^2 (e = exp(-2u)) without the cancellation of 1 - tanh^2.
 * u is clamped at -40 so that e stays finite (e s^2 would be inf * 0); the error that leaves is
 * below x e^-80. */

void OPS_FN(gelu_fwd)(T *y, const T *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        T xi = x[i];
        T u = (T)OPS_GELU_K0 * (xi + (T)OPS_GELU_K1 * xi * xi * xi);
        if (u < (T)-40)
            u = (T)-40;
        y[i] = xi / ((T)1 + OPS_EXP((T)-2 * u));
    }
}

void OPS_FN(gelu_bwd)(T *dx, const T *dy, const T *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        T xi = x[i];
        T u = (T)OPS_GELU_K0 * (xi + (T)OPS_GELU_K1 * xi * xi * xi);
        T du = (T)OPS_GELU_K0 * ((T)1 + (T)(3 * OPS_GELU_K1) * xi * xi);
        if (u < (T)-40) {
            u = (T)-40;
            du = 0; /* the clamped function is flat */
        }
        T e = OPS_EXP((T)-2 * u);
        T s = (T)1 / ((T)1 + e);
        dx[i] = dy[i] * (s + (T)2 * xi * e * s * s * du);
    }
}

/* --- embedding ----------------------------------------------------------------------------- */

void OPS_FN(embed_fwd)(T *x, const uint8_t *tok, const int32_t *pos, const T *wte, const T *wpe,
                       int n, int c)
{
    for (int i = 0; i < n; i++) {
        const T *te = wte + (size_t)tok[i] * c, *pe = wpe + (size_t)pos[i] * c;
        T *xr = x + (size_t)i * c;
        for (int j = 0; j < c; j++)
            xr[j] = te[j] + pe[j];
    }
}

void OPS_FN(embed_bwd)(T *dwte, T *dwpe, const T *dx, const uint8_t *tok, const int32_t *pos, int n,
                       int c)
{
    for (int i = 0; i < n; i++) {
        const T *dxr = dx + (size_t)i * c;
        T *te = dwte + (size_t)tok[i] * c, *pe = dwpe + (size_t)pos[i] * c;
        for (int j = 0; j < c; j++) {
            te[j] += dxr[j];
            pe[j] += dxr[j];
        }
    }
}

/* --- cross-entropy -------------------------------------------------------------------------- */

double OPS_FN(xent_fwd_bwd)(T *logits, const uint8_t *targets, int n, int v, double scale)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        T *row = logits + (size_t)i * v;
        double mx = -INFINITY;
        for (int j = 0; j < v; j++)
            if (row[j] > mx)
                mx = row[j];
        double sum = 0;
        for (int j = 0; j < v; j++)
            sum += exp((double)row[j] - mx);
        double lse = mx + log(sum);
        int t = targets[i];
        total += lse - (double)row[t];
        /* The one-hot is subtracted in double: p(target) near 1 would cancel in float. */
        for (int j = 0; j < v; j++)
            row[j] = (T)(scale * (exp((double)row[j] - lse) - (j == t ? 1.0 : 0.0)));
    }
    return scale * total;
}

/* --- attention -------------------------------------------------------------------------------
 * Work goes head by head, then by tiles of query rows x keys, so that one head's key and value
 * rows stay in cache while the query tiles pass over them. A tile is one of:
 * - entirely masked (every key after every query): skipped, which is what halves causal work;
 * - entirely visible: the scores and the products go through BLAS gemm, reading the strided head
 *   columns in place; the hot case, many times faster than scalar loops;
 * - mixed (near the diagonal): row by row, every masked pair skipped before its dot product, so
 *   that nothing in a masked position, not even a NaN in a padding row, reaches an output.
 * Every visible pair is computed once whatever the path, and a tile is just one more block to the
 * online softmax. The state update of a row is the same in both computing paths. */

/* Brings a row's state to the new maximum cmax (finite). A row whose m is -INFINITY starts
 * empty whatever acc and l hold, so that a caller need only set m. */
static inline void OPS_FN(attn_rescale)(T *restrict a, T *mi, T *li, T cmax, int hd)
{
    if (*mi == -INFINITY) {
        for (int d = 0; d < hd; d++)
            a[d] = 0;
        *li = 0;
        *mi = cmax;
    } else if (cmax > *mi) {
        T alpha = OPS_EXP(*mi - cmax);
        OPS_FN(ops_scale)(a, alpha, hd);
        *li *= alpha;
        *mi = cmax;
    }
}

/* A fully visible tile. Pointers are at the tile's first row and the head's first column; state
 * of tile row r is m[r * nh], l[r * nh]. s is OPS_ATTN_TQ x OPS_ATTN_TK scratch. */
static void OPS_FN(attn_fwd_tile)(T *acc, T *m, T *l, int lda, const T *q, int ldq, int tq,
                                  const T *k, int ldk, const T *v, int ldv, int tk, int nh, int hd,
                                  T scale, T *s)
{
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, tq, tk, hd, scale, q, ldq, k, ldk, (T)0, s,
             OPS_ATTN_TK);
    for (int r = 0; r < tq; r++) {
        T *row = s + (size_t)r * OPS_ATTN_TK;
        T cmax = row[0];
        for (int j = 1; j < tk; j++)
            if (row[j] > cmax)
                cmax = row[j];
        T *mi = m + (size_t)r * nh, *li = l + (size_t)r * nh;
        OPS_FN(attn_rescale)(acc + (size_t)r * lda, mi, li, cmax, hd);
        T sum = 0;
        for (int j = 0; j < tk; j++) {
            row[j] = OPS_EXP(row[j] - *mi);
            sum += row[j];
        }
        *li += sum;
    }
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, hd, tk, (T)1, s, OPS_ATTN_TK, v, ldv,
             (T)1, acc, lda);
}

/* A mixed tile, same arguments plus the positions. */
static void OPS_FN(attn_fwd_rows)(T *acc, T *m, T *l, int lda, const T *q, int ldq,
                                  const int32_t *qpos, int tq, const T *k, int ldk, const T *v,
                                  int ldv, const int32_t *kpos, int tk, int nh, int hd, T scale,
                                  T *s)
{
    for (int r = 0; r < tq; r++) {
        const T *qr = q + (size_t)r * ldq;
        const int32_t qp = qpos[r];
        T cmax = -INFINITY;
        for (int j = 0; j < tk; j++) {
            if (kpos[j] > qp) {
                s[j] = -INFINITY;
                continue;
            }
            s[j] = OPS_FN(ops_dot)(qr, k + (size_t)j * ldk, hd) * scale;
            if (s[j] > cmax)
                cmax = s[j];
        }
        if (cmax == -INFINITY)
            continue; /* no visible key for this row here */
        T *ar = acc + (size_t)r * lda, *mi = m + (size_t)r * nh, *li = l + (size_t)r * nh;
        OPS_FN(attn_rescale)(ar, mi, li, cmax, hd);
        for (int j = 0; j < tk; j++) {
            if (s[j] == -INFINITY)
                continue;
            T p = OPS_EXP(s[j] - *mi);
            *li += p;
            OPS_FN(ops_axpy)(ar, p, v + (size_t)j * ldv, hd);
        }
    }
}

void OPS_FN(attn_fwd_block)(T *acc, T *m, T *l, int lda, const T *q, int ldq, const int32_t *qpos,
                            int nq, const T *k, int ldk, const T *v, int ldv, const int32_t *kpos,
                            int nk, int nh, int hd)
{
    const T scale = (T)1 / OPS_SQRT((T)hd);
    const int tqmax = ops_attn_tile_rows(hd);
    T s[OPS_ATTN_TQ * OPS_ATTN_TK];
    for (int h = 0; h < nh; h++) {
        const size_t col = (size_t)h * hd;
        for (int i0 = 0; i0 < nq; i0 += tqmax) {
            const int tq = nq - i0 < tqmax ? nq - i0 : tqmax;
            int32_t qlo, qhi;
            ops_pos_range(qpos + i0, tq, &qlo, &qhi);
            T *at = acc + (size_t)i0 * lda + col;
            T *mt = m + (size_t)i0 * nh + h, *lt = l + (size_t)i0 * nh + h;
            const T *qt = q + (size_t)i0 * ldq + col;
            for (int j0 = 0; j0 < nk; j0 += OPS_ATTN_TK) {
                const int tk = nk - j0 < OPS_ATTN_TK ? nk - j0 : OPS_ATTN_TK;
                int32_t klo, khi;
                ops_pos_range(kpos + j0, tk, &klo, &khi);
                if (klo > qhi)
                    continue;
                const T *kt = k + (size_t)j0 * ldk + col, *vt = v + (size_t)j0 * ldv + col;
                if (khi <= qlo)
                    OPS_FN(attn_fwd_tile)
                (at, mt, lt, lda, qt, ldq, tq, kt, ldk, vt, ldv, tk, nh, hd, scale, s);
                else OPS_FN(attn_fwd_rows)(at, mt, lt, lda, qt, ldq, qpos + i0, tq, kt, ldk, vt,
                                           ldv, kpos + j0, tk, nh, hd, scale, s);
            }
        }
    }
}

/* No restrict here: o may be acc, element for element. */
void OPS_FN(attn_fwd_finish)(T *o, int ldo, T *lse, const T *acc, int lda, const T *m, const T *l,
                             int nq, int nh, int hd)
{
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < nh; h++) {
            const size_t st = (size_t)i * nh + h;
            const T *ar = acc + (size_t)i * lda + (size_t)h * hd;
            T *orow = o + (size_t)i * ldo + (size_t)h * hd;
            if (m[st] == -INFINITY) {
                for (int d = 0; d < hd; d++)
                    orow[d] = 0;
                lse[st] = -INFINITY;
                continue;
            }
            T inv = (T)1 / l[st];
            for (int d = 0; d < hd; d++)
                orow[d] = ar[d] * inv;
            lse[st] = m[st] + OPS_LOG(l[st]);
        }
}

void OPS_FN(attn_bwd_delta)(T *delta, const T *dout, int lddo, const T *o, int ldo, int nq, int nh,
                            int hd)
{
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < nh; h++)
            delta[(size_t)i * nh + h] = OPS_FN(ops_dot)(dout + (size_t)i * lddo + (size_t)h * hd,
                                                        o + (size_t)i * ldo + (size_t)h * hd, hd);
}

/* Backward of a fully visible tile; pointers as in attn_fwd_tile, lse and delta of tile row r at
 * [r * nh]. s and ds are OPS_ATTN_TQ x OPS_ATTN_TK scratch (P, then dS). */
static void OPS_FN(attn_bwd_tile)(T *dq, int lddq, T *dk, int lddk, T *dv, int lddv, const T *dout,
                                  int lddo, const T *lse, const T *delta, const T *q, int ldq,
                                  int tq, const T *k, int ldk, const T *v, int ldv, int tk, int nh,
                                  int hd, T scale, T *s, T *ds)
{
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, tq, tk, hd, scale, q, ldq, k, ldk, (T)0, s,
             OPS_ATTN_TK);
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, tq, tk, hd, (T)1, dout, lddo, v, ldv, (T)0,
             ds, OPS_ATTN_TK);
    for (int r = 0; r < tq; r++) {
        T *pr = s + (size_t)r * OPS_ATTN_TK, *dsr = ds + (size_t)r * OPS_ATTN_TK;
        const T li = lse[(size_t)r * nh], di = delta[(size_t)r * nh];
        if (li == -INFINITY) { /* cannot happen in a consistent call: no key was visible */
            for (int j = 0; j < tk; j++)
                pr[j] = dsr[j] = 0;
            continue;
        }
        for (int j = 0; j < tk; j++) {
            pr[j] = OPS_EXP(pr[j] - li);
            dsr[j] = pr[j] * (dsr[j] - di) * scale;
        }
    }
    OPS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, tk, hd, tq, (T)1, s, OPS_ATTN_TK, dout, lddo,
             (T)1, dv, lddv);
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, hd, tk, (T)1, ds, OPS_ATTN_TK, k, ldk,
             (T)1, dq, lddq);
    OPS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, tk, hd, tq, (T)1, ds, OPS_ATTN_TK, q, ldq,
             (T)1, dk, lddk);
}

static void OPS_FN(attn_bwd_rows)(T *dq, int lddq, T *dk, int lddk, T *dv, int lddv, const T *dout,
                                  int lddo, const T *lse, const T *delta, const T *q, int ldq,
                                  const int32_t *qpos, int tq, const T *k, int ldk, const T *v,
                                  int ldv, const int32_t *kpos, int tk, int nh, int hd, T scale)
{
    for (int r = 0; r < tq; r++) {
        const T li = lse[(size_t)r * nh];
        if (li == -INFINITY)
            continue; /* the row saw no key: its output is a constant 0 */
        const T di = delta[(size_t)r * nh];
        const int32_t qp = qpos[r];
        const T *qr = q + (size_t)r * ldq, *dor = dout + (size_t)r * lddo;
        T *dqr = dq + (size_t)r * lddq;
        for (int j = 0; j < tk; j++) {
            if (kpos[j] > qp)
                continue;
            const T *kr = k + (size_t)j * ldk, *vr = v + (size_t)j * ldv;
            T p = OPS_EXP(OPS_FN(ops_dot)(qr, kr, hd) * scale - li);
            T ds = p * (OPS_FN(ops_dot)(dor, vr, hd) - di) * scale;
            OPS_FN(ops_axpy)(dv + (size_t)j * lddv, p, dor, hd);
            OPS_FN(ops_axpy)(dqr, ds, kr, hd);
            OPS_FN(ops_axpy)(dk + (size_t)j * lddk, ds, qr, hd);
        }
    }
}

void OPS_FN(attn_bwd_block)(T *dq, int lddq, T *dk, int lddk, T *dv, int lddv, const T *dout,
                            int lddo, const T *lse, const T *delta, const T *q, int ldq,
                            const int32_t *qpos, int nq, const T *k, int ldk, const T *v, int ldv,
                            const int32_t *kpos, int nk, int nh, int hd)
{
    const T scale = (T)1 / OPS_SQRT((T)hd);
    const int tqmax = ops_attn_tile_rows(hd);
    T s[OPS_ATTN_TQ * OPS_ATTN_TK], ds[OPS_ATTN_TQ * OPS_ATTN_TK];
    for (int h = 0; h < nh; h++) {
        const size_t col = (size_t)h * hd;
        for (int i0 = 0; i0 < nq; i0 += tqmax) {
            const int tq = nq - i0 < tqmax ? nq - i0 : tqmax;
            int32_t qlo, qhi;
            ops_pos_range(qpos + i0, tq, &qlo, &qhi);
            const size_t st = (size_t)i0 * nh + h;
            const T *qt = q + (size_t)i0 * ldq + col, *dot = dout + (size_t)i0 * lddo + col;
            T *dqt = dq + (size_t)i0 * lddq + col;
            for (int j0 = 0; j0 < nk; j0 += OPS_ATTN_TK) {
                const int tk = nk - j0 < OPS_ATTN_TK ? nk - j0 : OPS_ATTN_TK;
                int32_t klo, khi;
                ops_pos_range(kpos + j0, tk, &klo, &khi);
                if (klo > qhi)
                    continue;
                const T *kt = k + (size_t)j0 * ldk + col, *vt = v + (size_t)j0 * ldv + col;
                T *dkt = dk + (size_t)j0 * lddk + col, *dvt = dv + (size_t)j0 * lddv + col;
                if (khi <= qlo)
                    OPS_FN(attn_bwd_tile)
                (dqt, lddq, dkt, lddk, dvt, lddv, dot, lddo, lse + st, delta + st, qt, ldq, tq, kt,
                 ldk, vt, ldv, tk, nh, hd, scale, s, ds);
                else OPS_FN(attn_bwd_rows)(dqt, lddq, dkt, lddk, dvt, lddv, dot, lddo, lse + st,
                                           delta + st, qt, ldq, qpos + i0, tq, kt, ldk, vt, ldv,
                                           kpos + j0, tk, nh, hd, scale);
            }
        }
    }
}

/* --- Mixture-of-experts router ------------------------------------------------------------- */

void OPS_FN(router_fwd)(T *probs, int32_t *idx, T *w, const T *logits, int n, int e, int k)
{
    for (int i = 0; i < n; i++) {
        const T *row = logits + (size_t)i * e;
        T *p = probs + (size_t)i * e;
        int32_t *id = idx + (size_t)i * k;
        double mx = -INFINITY, sum = 0;
        for (int a = 0; a < e; a++)
            mx = row[a] > mx ? row[a] : mx;
        for (int a = 0; a < e; a++)
            sum += exp((double)row[a] - mx);
        for (int a = 0; a < e; a++)
            p[a] = (T)(exp((double)row[a] - mx) / sum);
        /* Selection by rank of the stored probabilities, ties to the lower id: the same choice
         * wherever the same probabilities are seen. */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int a = 0; a < e; a++) {
                int taken = 0;
                for (int q = 0; q < j; q++)
                    taken |= id[q] == a;
                if (!taken && (best < 0 || p[a] > p[best]))
                    best = a;
            }
            id[j] = best;
        }
    }
    OPS_FN(router_weights)(w, probs, idx, n, e, k);
}

void OPS_FN(router_weights)(T *w, const T *probs, const int32_t *idx, int n, int e, int k)
{
    for (int i = 0; i < n; i++) {
        const T *p = probs + (size_t)i * e;
        const int32_t *id = idx + (size_t)i * k;
        double sel = 0;
        for (int j = 0; j < k; j++)
            sel += (double)p[id[j]];
        for (int j = 0; j < k; j++)
            w[(size_t)i * k + j] = (T)((double)p[id[j]] / sel);
    }
}

void OPS_FN(router_bwd)(T *dlogits, const T *dw, const T *probs, const int32_t *idx, const T *w,
                        const T *dprob, int n, int e, int k)
{
    for (int i = 0; i < n; i++) {
        const T *p = probs + (size_t)i * e, *dwi = dw + (size_t)i * k, *wi = w + (size_t)i * k;
        const int32_t *id = idx + (size_t)i * k;
        T *dl = dlogits + (size_t)i * e;
        /* w_j = p_j / s with s the sum of the selected p: dp_j = (dw_j - sum_q dw_q w_q) / s. */
        double s = 0, g = 0, dot = 0;
        for (int j = 0; j < k; j++)
            s += (double)p[id[j]], g += (double)dwi[j] * (double)wi[j];
        for (int a = 0; a < e; a++)
            dot += (double)p[a] * (dprob ? (double)dprob[a] : 0.0);
        for (int j = 0; j < k; j++)
            dot += (double)p[id[j]] * ((double)dwi[j] - g) / s;
        /* Softmax: dlogit_a = p_a (dp_a - sum_b p_b dp_b). */
        for (int a = 0; a < e; a++)
            dl[a] = (T)((double)p[a] * ((dprob ? (double)dprob[a] : 0.0) - dot));
        for (int j = 0; j < k; j++)
            dl[id[j]] = (T)((double)dl[id[j]] + (double)p[id[j]] * ((double)dwi[j] - g) / s);
    }
}

double OPS_FN(moe_aux)(T *dprob, const T *probs, const int32_t *idx, int n, int e, int k,
                       double coef, double scale)
{
    for (int a = 0; a < e; a++)
        dprob[a] = 0;
    if (n == 0)
        return 0;
    for (size_t i = 0; i < (size_t)n * (size_t)k; i++)
        dprob[idx[i]] += 1;
    double aux = 0;
    for (int a = 0; a < e; a++) {
        double f = (double)dprob[a] / ((double)n * k), pm = 0;
        for (int i = 0; i < n; i++)
            pm += (double)probs[(size_t)i * e + a];
        aux += f * pm / n;
        dprob[a] = (T)(scale * coef * e * f / n);
    }
    return scale * coef * e * aux;
}

/* --- AdamW ----------------------------------------------------------------------------------- */

void OPS_FN(adamw)(T *p, const T *g, T *m, T *v, size_t n, double lr, double beta1, double beta2,
                   double eps, double wd, int64_t step, double gscale)
{
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const double bc2 = 1.0 - pow(beta2, (double)step);
    const double decay = 1.0 - lr * wd;
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * gscale;
        double mi = beta1 * (double)m[i] + (1.0 - beta1) * gi;
        double vi = beta2 * (double)v[i] + (1.0 - beta2) * gi * gi;
        double pi = (double)p[i] * decay; /* PyTorch decays before the Adam step */
        pi -= lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
        m[i] = (T)mi;
        v[i] = (T)vi;
        p[i] = (T)pi;
    }
}
