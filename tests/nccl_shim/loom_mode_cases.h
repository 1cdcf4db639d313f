/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_mode_cases.h - the calls that the NCCL program (loom_mode_prog.c, which
 * sees only nccl.h) and its loom reference (test_shim_loom_ref.cc, which sees
 * only loom.h) both make, and their inputs, so that the two write comparable
 * records: one list of cases, deterministic inputs per case and rank, and one
 * record format. Plain C with no header of either library: datatypes and ops
 * are the numbers NCCL and loom share.
 *
 * Inputs are multiples of 1/8 (1/4 for fp8 e5m2) in [-2, 2], exact in every
 * float format, so both sides start from the same values; PreMulSum scalars
 * have more significant bits than the narrow formats keep, so that scaling
 * rounds.
 */
#ifndef LOOM_TESTS_NCCL_SHIM_CASES_H
#define LOOM_TESTS_NCCL_SHIM_CASES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Datatype numbers (NCCL's and loom's). */
enum {
    LM_INT32 = 2,
    LM_HALF = 6,
    LM_FLOAT = 7,
    LM_DOUBLE = 8,
    LM_BF16 = 9,
    LM_E4M3 = 10,
    LM_E5M2 = 11
};
/* Ops: the built-in numbers, then the two PreMulSum flavours of the test. */
enum {
    LM_SUM = 0,
    LM_PROD = 1,
    LM_MAX = 2,
    LM_MIN = 3,
    LM_AVG = 4,
    LM_PREMUL_HOST = 5,
    LM_PREMUL_DEV = 6
};

typedef enum {
    LM_ALLREDUCE,
    LM_REDUCESCATTER,
    LM_REDUCE,
    LM_ALLGATHER,
    LM_BROADCAST,
    LM_BCAST,
    LM_ALLTOALL,
    LM_GATHER,
    LM_SCATTER,
    LM_SENDRECV /* a ring inside one group: send to rank+1, receive from rank-1 */
} lm_kind_t;

typedef struct {
    lm_kind_t kind;
    int dtype;
    int op;      /* reductions only */
    int inplace; /* NCCL's in-place layout of the collective */
    int root;
    size_t count; /* the call's count argument */
} lm_case_t;

/* The cases for nranks ranks into out[max]; returns how many. */
int lm_cases(int nranks, lm_case_t *out, int max);
const char *lm_kind_name(lm_kind_t kind);
size_t lm_dtype_size(int dtype);

/* Elements of each buffer of a case on nranks ranks. */
size_t lm_send_elems(const lm_case_t *c, int nranks);
size_t lm_recv_elems(const lm_case_t *c, int nranks);

/* Fills n elements of dtype, deterministic in (case index, rank). */
void lm_fill(void *buf, int dtype, size_t n, int case_index, int rank);
/* A PreMulSum scalar in dtype: which 0 is the value at creation, 1 the value
 * a device-resident scalar holds when the call runs. */
void lm_scalar(int dtype, int which, void *out);

/* One record: case index, byte count, the bytes. */
int lm_record(FILE *f, int case_index, const void *data, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
