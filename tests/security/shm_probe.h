/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_probe.h - the shared-memory segment calls of src/transport/shm/shm_seg.h
 * for the security suite's C++ tests, which cannot include that header (its
 * ring types are C11 atomics). Each wraps one call and releases what it
 * mapped; it asserts nothing. Used by test_security_shm.cc.
 */
#ifndef LOOM_TESTS_SECURITY_SHM_PROBE_H
#define LOOM_TESTS_SECURITY_SHM_PROBE_H

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* loom_seg_create of name in dir for n_local ranks (4 KiB rings), then unmapped. */
loomResult_t shm_probe_create(const char *dir, const char *name, int n_local);
/* loom_seg_open of name as a rank that did not create it; *ready_p as it
 * says, and the mapping, if any, is released. */
loomResult_t shm_probe_open(const char *dir, const char *name, int n_local, int *ready_p);
/* loom_seg_file_open(dir, name, O_RDWR), the arena's way in; the result as is. */
int shm_probe_file_open(const char *dir, const char *name);

#ifdef __cplusplus
}
#endif

#endif
