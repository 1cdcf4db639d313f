/* SPDX-License-Identifier: Apache-2.0
 *
 * ops.c - instantiates the kernels of ops.h for float (the trainer) and double (the gradient
 * checks) from the single source ops_impl.h, so that the checked code is the trained code.
 */
#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ops.h"

#define T        float
#define S        f
#define OPS_GEMM cblas_sgemm
#define OPS_EXP  expf
#define OPS_LOG  logf
#define OPS_SQRT sqrtf
#include "ops_impl.h"
#undef T
#undef S
#undef OPS_GEMM
#undef OPS_EXP
#undef OPS_LOG
#undef OPS_SQRT

#define T        double
#define S        d
#define OPS_GEMM cblas_dgemm
#define OPS_EXP  exp
#define OPS_LOG  log
#define OPS_SQRT sqrt
#include "ops_impl.h"
#undef T
#undef S
#undef OPS_GEMM
#undef OPS_EXP
#undef OPS_LOG
#undef OPS_SQRT
