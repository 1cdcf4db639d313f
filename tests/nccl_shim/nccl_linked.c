/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_linked.c - a program linked against the real libnccl.so.2 (NEEDED
 * libnccl.so.2, rpath to the toolkit's library directory), as PyTorch's and
 * nccl-tests' binaries are. check_loader.py runs it with and without
 * LD_PRELOAD of the shim; it prints which file provides ncclGetVersion and
 * what that returns.
 */
#include <dlfcn.h>
#include <stdio.h>

#include <nccl.h>

int main(void)
{
    int version = 0;
    ncclResult_t r = ncclGetVersion(&version);
    Dl_info info;
    void *fn = dlsym(RTLD_DEFAULT, "ncclGetVersion");
    const char *provider = fn && dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "(unknown)";
    printf("result=%d\nversion=%d\nprovider=%s\n", (int)r, version, provider);
    return 0;
}
