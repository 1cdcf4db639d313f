/* SPDX-License-Identifier: Apache-2.0
 *
 * comm_tickets.c - how many calls a communicator has handed tickets to (src/api/comm.h), for the
 * check that a step issues no collective; C, because comm.h is the library's C.
 */
#include <stdint.h>

#include "comm.h"

uint64_t shardtest_comm_tickets(loomComm_t comm);

uint64_t shardtest_comm_tickets(loomComm_t comm)
{
    return __atomic_load_n(&comm->next_ticket, __ATOMIC_SEQ_CST);
}
