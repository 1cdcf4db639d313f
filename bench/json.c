/* SPDX-License-Identifier: Apache-2.0
 *
 * json.c - the JSON values the benchmarks' -J files are made of (strings,
 * numbers that may be infinite or NaN, the time of day), written the one way
 * every benchmark's records use. The documents' shape is each program's own.
 */
#include "common.h"

#include <math.h>
#include <time.h>

void bench_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void bench_json_double(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%lf", v);
    else
        fprintf(f, "\"%s\"", isnan(v) ? "nan" : "inf");
}

void bench_json_now(FILE *f)
{
    char buf[64];
    time_t t = time(NULL);
    strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", localtime(&t));
    bench_json_str(f, buf);
}
