/* SPDX-License-Identifier: Apache-2.0
 *
 * emu_hooks.h - what tests/nccl_shim/emu's build of libloom.so.0 exports
 * beyond loom's API: the streams and pointers of its emulated device runtime
 * (LOOM_DEVICE=emulated), for libfake-cuda-emu.so, the CUDA driver stand-in
 * that makes the drop-in NCCL library and a program see the emulation as a
 * GPU. Test-only: never installed. Every call but emuTestPtrDevice returns a
 * loomResult_t; InvalidUsage when the process's device runtime is not the
 * emulation.
 */
#ifndef LOOM_TEST_EMU_HOOKS_H
#define LOOM_TEST_EMU_HOOKS_H

#ifdef __cplusplus
extern "C" {
#endif

/* The device ordinal of emulated device memory holding p, -1 otherwise. */
int emuTestPtrDevice(const void *p);
/* A stream of the emulation (blocking, as cudaStreamCreate's). */
int emuTestStreamCreate(void **stream);
int emuTestStreamDestroy(void *stream);
/* Waits until everything queued on stream (NULL: the default stream) ran; its error. */
int emuTestStreamSynchronize(void *stream);
int emuTestStreamCapturing(void *stream, int *capturing);
/* Marks stream as capturing a CUDA graph (the emulation only flags it). */
int emuTestStreamSetCapturing(void *stream, int capturing);
/* Holds everything queued on stream after this until *word (device memory)
 * reaches value (cuStreamWaitValue32), so that a test can see a call queued
 * and not yet run. */
int emuTestStreamWaitWord(void *stream, unsigned *word, unsigned value);
int emuTestCurrentDevice(int *device);

#ifdef __cplusplus
}
#endif

#endif
