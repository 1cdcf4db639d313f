/* SPDX-License-Identifier: Apache-2.0
 *
 * ops.h - the numeric kernels of loom-train's GPT: forward and backward of every layer, and
 * AdamW. Pure functions on dense row-major arrays; no communication, no allocation.
 *
 * Every kernel exists twice, for float (the trainer) and for double (the finite-difference
 * gradient checks in tests/trainer), from one source (ops_impl.h): the names end in _f and _d.
 *
 * Conventions:
 * - Activations are [n][width] with a row stride ("ld") of at least width, so that one head's
 *   columns of a [n][C] array are addressed in place.
 * - A linear layer's weight is [in][out]: y = x W. No linear layer has a bias.
 * - Backward kernels ACCUMULATE into weight gradients (+=), so that micro-batches and tied
 *   weights add up; input gradients are written (=) unless the name says _acc.
 */
#ifndef LOOM_TRAINER_OPS_H
#define LOOM_TRAINER_OPS_H

#include <stddef.h>
#include <stdint.h>

#define OPS_DECLARE(T, S)                                                                          \
    /* y[n][out] = x[n][in] W[in][out] (+ y if accumulate). */                                     \
    void linear_fwd_##S(T *y, const T *x, const T *w, int n, int in, int out, int accumulate);     \
    /* dW[in][out] += x^T dy; dx[n][in] = dy W^T (either may be NULL: the zero-bubble B and W). */ \
    void linear_bwd_##S(T *dx, T *dw, const T *dy, const T *x, const T *w, int n, int in,          \
                        int out);                                                                  \
    /* LayerNorm over the last dimension (eps 1e-5): y = (x - mean) * rstd * g + b; mean[n] and    \
     * rstd[n] are saved for the backward. */                                                      \
    void layernorm_fwd_##S(T *y, T *mean, T *rstd, const T *x, const T *g, const T *b, int n,      \
                           int c);                                                                 \
    /* dx[n][c] += (the input gradient); dg[c] += ; db[c] += . */                                  \
    void layernorm_bwd_##S(T *dx, T *dg, T *db, const T *dy, const T *x, const T *mean,            \
                           const T *rstd, const T *g, int n, int c);                               \
    /* GELU, tanh approximation (GPT-2's), elementwise on n values. */                             \
    void gelu_fwd_##S(T *y, const T *x, size_t n);                                                 \
    /* dx = dy * gelu'(x) (written). */                                                            \
    void gelu_bwd_##S(T *dx, const T *dy, const T *x, size_t n);                                   \
    /* x[i][c] = wte[tok[i]][c] + wpe[pos[i]][c]. */                                               \
    void embed_fwd_##S(T *x, const uint8_t *tok, const int32_t *pos, const T *wte, const T *wpe,   \
                       int n, int c);                                                              \
    /* dwte[tok[i]] += dx[i]; dwpe[pos[i]] += dx[i]. */                                            \
    void embed_bwd_##S(T *dwte, T *dwpe, const T *dx, const uint8_t *tok, const int32_t *pos,      \
                       int n, int c);                                                              \
    /* Softmax cross-entropy of logits[n][v] against targets; returns scale * sum over rows of     \
     * -log p(target), and overwrites logits with scale * (softmax - onehot(target)), the          \
     * gradient of that returned value. Computed in double internally. */                          \
    double xent_fwd_bwd_##S(T *logits, const uint8_t *targets, int n, int v, double scale);        \
    /* Causal attention by blocks with an online softmax (flash attention, ring attention).        \
     * q: nq rows, k and v: nk rows; head h of a row is columns [h*hd, (h+1)*hd), row strides      \
     * ldq/ldk/ldv. Query i may see key j iff kpos[j] <= qpos[i]. The state of a query row and     \
     * head is acc[i][h*hd ...] (unnormalised output, stride lda), m[i*nh + h] (running max of     \
     * scaled scores, -INFINITY at the start) and l[i*nh + h] (running sum of exp). A row whose    \
     * m is -INFINITY is empty: its acc and l are ignored and overwritten by its first key. */     \
    void attn_fwd_block_##S(T *acc, T *m, T *l, int lda, const T *q, int ldq, const int32_t *qpos, \
                            int nq, const T *k, int ldk, const T *v, int ldv, const int32_t *kpos, \
                            int nk, int nh, int hd);                                               \
    /* o[i][h*hd...] = acc / l (stride ldo, may equal acc), lse[i*nh+h] = m + log(l). A row that   \
     * saw no key gets o = 0 and lse = -INFINITY. */                                               \
    void attn_fwd_finish_##S(T *o, int ldo, T *lse, const T *acc, int lda, const T *m, const T *l, \
                             int nq, int nh, int hd);                                              \
    /* delta[i*nh+h] = sum over d of dout * o (the softmax backward's row term). */                \
    void attn_bwd_delta_##S(T *delta, const T *dout, int lddo, const T *o, int ldo, int nq,        \
                            int nh, int hd);                                                       \
    /* One block of the backward: with P = exp(q.k * scale - lse) under the mask, adds             \
     * dv += P^T dout, dq += (P * (dout v^T - delta)) k * scale, dk += (...)^T q * scale.          \
     * scale is 1/sqrt(hd), the same the forward used. */                                          \
    void attn_bwd_block_##S(T *dq, int lddq, T *dk, int lddk, T *dv, int lddv, const T *dout,      \
                            int lddo, const T *lse, const T *delta, const T *q, int ldq,           \
                            const int32_t *qpos, int nq, const T *k, int ldk, const T *v, int ldv, \
                            const int32_t *kpos, int nk, int nh, int hd);                          \
    /* Mixture-of-experts router over logits[n][e]: probs = softmax (computed in double),          \
     * idx[n][k] = the k most probable experts, most probable first, ties to the lower id, and     \
     * w[n][k] = their probabilities renormalised to sum 1. */                                     \
    void router_fwd_##S(T *probs, int32_t *idx, T *w, const T *logits, int n, int e, int k);       \
    /* w[n][k] = the probabilities of the experts idx[n][k] renormalised to sum 1 (router_fwd's    \
     * weights, for a routing chosen elsewhere: a replayed one). */                                \
    void router_weights_##S(T *w, const T *probs, const int32_t *idx, int n, int e, int k);        \
    /* Its backward: dlogits[n][e] (written) from dw[n][k], the gradient of w, plus dprob[e]       \
     * (may be NULL), a gradient of every token's probabilities (the auxiliary loss's). */         \
    void router_bwd_##S(T *dlogits, const T *dw, const T *probs, const int32_t *idx, const T *w,   \
                        const T *dprob, int n, int e, int k);                                      \
    /* Switch/GShard load-balancing loss of n tokens: coef * e * sum_a f_a P_a, with f_a the       \
     * share of the n * k selections that chose a and P_a the mean of probs[.][a]; returns scale   \
     * times it, and writes dprob[e] = scale * its gradient in probs[t][a] (the same for every     \
     * token t; f is a count, not differentiated). */                                              \
    double moe_aux_##S(T *dprob, const T *probs, const int32_t *idx, int n, int e, int k,          \
                       double coef, double scale);                                                 \
    /* One AdamW step on n elements (PyTorch's AdamW: decoupled weight decay, bias-corrected       \
     * moments); step counts from 1; grad is multiplied by gscale first (clipping). */             \
    void adamw_##S(T *p, const T *g, T *m, T *v, size_t n, double lr, double beta1, double beta2,  \
                   double eps, double wd, int64_t step, double gscale);

OPS_DECLARE(float, f)
OPS_DECLARE(double, d)

#endif
