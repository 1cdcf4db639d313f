/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_token.h - loom mode's answer to ncclCommRegister and
 * ncclCommWindowRegister: loom needs no registration of host memory, so each
 * registration is a small heap token kept on its communicator, checked and
 * freed by the matching deregistration (shim_impl_misc.c).
 */
#ifndef LOOM_NCCL_SHIM_TOKEN_H
#define LOOM_NCCL_SHIM_TOKEN_H

#include <stddef.h>

#include "shim_comm.h"

typedef enum { SHIM_TOKEN_REGISTER, SHIM_TOKEN_WINDOW } shim_token_kind_t;

struct shim_token {
    shim_token_kind_t kind;
    void *buff;
    size_t size;
    int flags;
    struct shim_token *next;
};

/* Frees every token left on c (when c is freed). */
void shim_tokens_free_all(shim_comm_t *c);

#endif
