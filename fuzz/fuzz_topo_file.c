/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_topo_file.c - libFuzzer harness for topology files (src/topology/topo_file.c over
 * json.c): any input is refused with a message or read into a description that, written back
 * out, reads again into the same description and the same text. Built by fuzz/run.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/topology/topo.h"

static char *write_text(const loom_topo_t *t, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        abort();
    if (loom_topo_write(t, f))
        abort();
    fclose(f);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    loom_topo_t t, back;
    char err[256];
    if (loom_topo_parse((const char *)data, size, &t, err, sizeof(err))) {
        if (!err[0] || t.hosts || t.ranks)
            abort(); /* a refusal names what is wrong and leaves nothing allocated */
        return 0;
    }
    size_t len, len2;
    char *text = write_text(&t, &len);
    if (loom_topo_parse(text, len, &back, err, sizeof(err)))
        abort(); /* what loom writes, loom reads */
    if (back.nhosts != t.nhosts || back.nranks != t.nranks ||
        memcmp(back.hosts, t.hosts, sizeof(*t.hosts) * (size_t)t.nhosts) ||
        (t.nranks && memcmp(back.ranks, t.ranks, sizeof(*t.ranks) * (size_t)t.nranks)))
        abort();
    char *text2 = write_text(&back, &len2);
    if (len2 != len || memcmp(text, text2, len))
        abort();
    free(text);
    free(text2);
    loom_topo_free(&t);
    loom_topo_free(&back);
    return 0;
}
