/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_info.h - what loom_info.c calls in its other files.
 */
#ifndef LOOM_INFO_H
#define LOOM_INFO_H

/* The device section of -v (loom_info_device.c): the runtime, the CUDA runtime and its GPUs,
 * the emulation, and the device transports with what each needs and why one cannot run. */
void loom_info_print_device(void);

#endif
