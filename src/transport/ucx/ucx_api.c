/* SPDX-License-Identifier: Apache-2.0
 *
 * ucx_api.c - loads UCP when the ucx transport first starts (ucx_api.h says why): dlopen of
 * LOOM_UCX_LIB, then one dlsym per function of the table. Local binding (RTLD_LOCAL), so UCX's
 * symbols never interpose on the program's.
 */
#include "ucx_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "debug.h"
#include "param.h"

loom_ucx_api_t loom_ucx;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512] = "not loaded"; /* empty once loaded; written only by load() */

#define SYM(field, name)                                                                           \
    {                                                                                              \
        (void **)&loom_ucx.field, name                                                             \
    }

static void load(void)
{
    const struct {
        void **slot;
        const char *name;
    } syms[] = {
        SYM(config_read, "ucp_config_read"),
        SYM(config_release, "ucp_config_release"),
        SYM(init_version, "ucp_init_version"),
        SYM(cleanup, "ucp_cleanup"),
        SYM(get_version_string, "ucp_get_version_string"),
        SYM(worker_create, "ucp_worker_create"),
        SYM(worker_destroy, "ucp_worker_destroy"),
        SYM(worker_get_efd, "ucp_worker_get_efd"),
        SYM(worker_get_address, "ucp_worker_get_address"),
        SYM(worker_release_address, "ucp_worker_release_address"),
        SYM(worker_progress, "ucp_worker_progress"),
        SYM(worker_arm, "ucp_worker_arm"),
        SYM(ep_create, "ucp_ep_create"),
        SYM(ep_close_nbx, "ucp_ep_close_nbx"),
        SYM(ep_flush_nbx, "ucp_ep_flush_nbx"),
        SYM(tag_send_nbx, "ucp_tag_send_nbx"),
        SYM(tag_recv_nbx, "ucp_tag_recv_nbx"),
        SYM(tag_probe_nb, "ucp_tag_probe_nb"),
        SYM(tag_msg_recv_nbx, "ucp_tag_msg_recv_nbx"),
        SYM(request_check_status, "ucp_request_check_status"),
        SYM(request_cancel, "ucp_request_cancel"),
        SYM(request_free, "ucp_request_free"),
        SYM(status_string, "ucs_status_string"),
    };
    const char *lib = loom_param_UCX_LIB();
    if (lib == NULL || lib[0] == '\0') {
        snprintf(load_error, sizeof(load_error), "LOOM_UCX_LIB is empty: UCX is not loaded");
        return;
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *why = dlerror();
        snprintf(load_error, sizeof(load_error),
                 "cannot load %s (%s); install UCX (Debian: libucx0) or set LOOM_UCX_LIB", lib,
                 why ? why : "unknown error");
        return;
    }
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (*syms[i].slot == NULL) {
            snprintf(load_error, sizeof(load_error), "%s has no %s: not a UCX this loom can use",
                     lib, syms[i].name);
            /* The library stays open: its constructors ran, and closing it would run
             * destructors of a UCX that nothing uses, for nothing. */
            return;
        }
    }
    load_error[0] = '\0';
}

loomResult_t loom_ucx_load(void)
{
    pthread_once(&load_once, load);
    if (load_error[0] != '\0') {
        LOOM_WARN("ucx: %s", load_error);
        return loomSystemError;
    }
    return loomSuccess;
}
