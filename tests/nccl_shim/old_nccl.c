/* SPDX-License-Identifier: Apache-2.0
 *
 * old_nccl.c - a library that looks like a much older NCCL to the shim: it
 * has pncclGetVersion and nothing else, so every other forwarded call meets a
 * function the "real" library lacks.
 */
int pncclGetVersion(int *version);

int pncclGetVersion(int *version)
{
    *version = 2700; /* NCCL 2.7.0 */
    return 0;
}
