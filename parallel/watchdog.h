/* watchdog: turns a collective that does not finish into a report instead
 * of a hang. Every wait on a collective registers itself here; a thread
 * checks once a second, and when a wait has lasted longer than the timeout
 * it asks every member of the group (through the watchdog threads of the
 * other ranks, which answer even while their main thread is stuck) how far
 * each got on that group, prints on stderr which operation, which sequence
 * number and which ranks have not arrived, then aborts the job (exit 1).
 * Needs MPI_THREAD_MULTIPLE. */
#ifndef ZT_WATCHDOG_H
#define ZT_WATCHDOG_H

#include "parallel/comm.h"

/* Starts the watchdog thread; timeout in seconds (<= 0: watch nothing, but
 * still answer other ranks' questions). Collective over MPI_COMM_WORLD. */
int zt_watchdog_start(double timeout_s);
/* Stops it; collective over MPI_COMM_WORLD. */
void zt_watchdog_stop(void);

/* Called by comm around every wait. */
void zt_watchdog_enter(zt_comm *c, zt_comm_op op, uint64_t seq);
void zt_watchdog_leave(void);

/* Registers a group so that the watchdog can answer questions about it. */
void zt_watchdog_register(zt_comm *c);
void zt_watchdog_unregister(zt_comm *c);

/* Test hook: ZT_TEST_SKIP_COLLECTIVE="RANK:GROUP:SEQ" makes world rank RANK
 * skip collective SEQ of GROUP, so tests can check the report. */
int zt_watchdog_should_skip(const zt_comm *c, uint64_t seq);
/* The same hook for point-to-point transfers: on that group SEQ counts
 * this rank's sends (the pipeline's activations and gradients), and the
 * SEQ-th one is never posted, so its receiver waits forever. */
int zt_watchdog_should_skip_send(const zt_comm *c);

#endif
