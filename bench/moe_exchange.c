/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_exchange.c - one step's dispatch and combine as bytes between pairs of ranks, the cost
 * model's prediction of them, and their replay file (moe_exchange.h).
 */
#include "moe_exchange.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "cost_model.h"

struct moe_x_links {
    int nranks, nhosts, ppn;
    int *host_of;
    loom_link_cost_t link, intra;
    double cache_bytes;
};

size_t moe_x_dispatch_row(size_t hidden, size_t elem_bytes, size_t pairs)
{
    size_t off = (hidden * elem_bytes + 3) & ~(size_t)3;
    return (off + 4 + 6 * pairs + 15) & ~(size_t)15;
}

size_t moe_x_combine_row(size_t hidden)
{
    return hidden * sizeof(float);
}

void moe_x_bytes(const uint64_t *rows, int G, size_t disp_row, size_t comb_row, double *disp,
                 double *comb)
{
    for (int s = 0; s < G; s++)
        for (int d = 0; d < G; d++) {
            double n = (double)rows[(size_t)s * (size_t)G + (size_t)d];
            disp[(size_t)s * (size_t)G + (size_t)d] = MOE_X_HEADER + n * (double)disp_row;
            comb[(size_t)d * (size_t)G + (size_t)s] = MOE_X_HEADER + n * (double)comb_row;
        }
}

moe_x_links_t *moe_x_links_get(loomComm_t comm)
{
    moe_x_links_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    const loom_coll_ctx_t *c = &comm->coll;
    l->nranks = comm->nranks;
    l->nhosts = c->hosts.nhosts > 1 ? c->hosts.nhosts : 1;
    l->ppn = c->hosts.ppn;
    l->link = c->link;
    l->intra = c->intra;
    l->cache_bytes = c->cache_bytes;
    l->host_of = calloc((size_t)comm->nranks, sizeof(int));
    if (l->host_of == NULL) {
        free(l);
        return NULL;
    }
    for (int r = 0; r < comm->nranks && l->nhosts > 1 && c->hosts.host_of; r++)
        l->host_of[r] = c->hosts.host_of[r];
    return l;
}

void moe_x_links_free(moe_x_links_t *l)
{
    if (l)
        free(l->host_of);
    free(l);
}

void moe_x_links_describe(const moe_x_links_t *l, char *buf, size_t len)
{
    char link[192];
    loom_link_cost_describe(&l->link, link, sizeof(link));
    snprintf(buf, len, "%s %s; %d host(s) x %d rank(s)", loom_link_class_name(l->link.cls), link,
             l->nhosts, l->ppn ? l->ppn : l->nranks);
}

/* sent both ways at once and the rest one way, on link l as a call of that size sees it. */
static double pay(const loom_link_cost_t *l, double steps, double msgs, double out, double in,
                  double cache_bytes, int nranks)
{
    loom_cost_call_t call = {.nranks = nranks, .nbytes = fmax(out, in), .cache_bytes = cache_bytes};
    loom_link_cost_t at = loom_link_cost_for_call(l, &call);
    return loom_cost_eval_one_way(&at, steps, msgs, fmin(out, in), fabs(out - in), 0);
}

double moe_x_predict_us(const moe_x_links_t *l, const double *bytes)
{
    const int G = l->nranks;
    double worst = 0;
    /* The host's ranks share its link to the others: each sees its constants that many times
     * slower per byte. */
    int flows = l->nhosts > 1 ? (l->ppn ? l->ppn : (G + l->nhosts - 1) / l->nhosts) : 1;
    loom_link_cost_t net = loom_link_cost_shared(&l->link, flows);
    for (int r = 0; r < G; r++) {
        double out[2] = {0, 0}, in[2] = {0, 0}; /* [0] other hosts, [1] this host */
        for (int p = 0; p < G; p++) {
            if (p == r)
                continue;
            int near = l->nhosts > 1 && l->host_of[p] == l->host_of[r];
            out[near] += bytes[(size_t)r * (size_t)G + (size_t)p];
            in[near] += bytes[(size_t)p * (size_t)G + (size_t)r];
        }
        double ns = pay(&net, 1, 2.0 * (G - 1), out[0], in[0], l->cache_bytes, G);
        if (l->nhosts > 1)
            ns += pay(&l->intra, 0, 0, out[1], in[1], l->cache_bytes, G);
        worst = fmax(worst, ns);
    }
    return worst / 1e3;
}

void moe_x_write_header(FILE *f, int G, const char *what)
{
    fprintf(f, "moe-exchange v1 ranks %d %s\n", G, what);
}

void moe_x_write_step(FILE *f, int G, int step, const char *phase, const double *bytes)
{
    fprintf(f, "step %d %s\n", step, phase);
    for (int s = 0; s < G; s++)
        for (int d = 0; d < G; d++)
            fprintf(f, "%.0f%c", bytes[(size_t)s * (size_t)G + (size_t)d], d + 1 < G ? ' ' : '\n');
}
