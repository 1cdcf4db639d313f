/* SPDX-License-Identifier: Apache-2.0
 *
 * ucx_api.h - the part of UCP's API the ucx transport calls, as a table filled from libucp at
 * run time (ucx_api.c). loom compiles against UCX's headers but does not link UCX: the library
 * (and libucm, which patches the allocator as it loads) is opened only when a communicator
 * starts the ucx transport, so a build with UCX runs where UCX is not installed, and programs
 * that never use UCX never load it. Each entry has the type of the function UCX's header
 * declares, so a mismatch is a compile error.
 */
#ifndef LOOM_TRANSPORT_UCX_API_H
#define LOOM_TRANSPORT_UCX_API_H

#include <ucp/api/ucp.h>

#include "loom.h"

typedef struct {
    __typeof__(ucp_config_read) *config_read;
    __typeof__(ucp_config_release) *config_release;
    __typeof__(ucp_init_version) *init_version; /* ucp_init is an inline wrapper of it */
    __typeof__(ucp_cleanup) *cleanup;
    __typeof__(ucp_get_version_string) *get_version_string;
    __typeof__(ucp_worker_create) *worker_create;
    __typeof__(ucp_worker_destroy) *worker_destroy;
    __typeof__(ucp_worker_get_efd) *worker_get_efd;
    __typeof__(ucp_worker_get_address) *worker_get_address;
    __typeof__(ucp_worker_release_address) *worker_release_address;
    __typeof__(ucp_worker_progress) *worker_progress;
    __typeof__(ucp_worker_arm) *worker_arm;
    __typeof__(ucp_ep_create) *ep_create;
    __typeof__(ucp_ep_close_nbx) *ep_close_nbx;
    __typeof__(ucp_ep_flush_nbx) *ep_flush_nbx;
    __typeof__(ucp_tag_send_nbx) *tag_send_nbx;
    __typeof__(ucp_tag_recv_nbx) *tag_recv_nbx;
    __typeof__(ucp_tag_probe_nb) *tag_probe_nb;
    __typeof__(ucp_tag_msg_recv_nbx) *tag_msg_recv_nbx;
    __typeof__(ucp_request_check_status) *request_check_status;
    __typeof__(ucp_request_cancel) *request_cancel;
    __typeof__(ucp_request_free) *request_free;
    __typeof__(ucs_status_string) *status_string; /* libucs, which libucp depends on */
} loom_ucx_api_t;

/* The table; valid once loom_ucx_load has succeeded. */
extern loom_ucx_api_t loom_ucx;

/* Opens LOOM_UCX_LIB (default libucp.so.0) and fills loom_ucx, once per process. Success, or
 * SystemError with a WARN that says what is missing (the library, or a function in it); a
 * failed load is not retried. Thread-safe. */
loomResult_t loom_ucx_load(void);

#endif
