/* watchdog: turns a wait that does not end into a report instead of a
 * hang. Every wait of the program on other ranks registers itself here —
 * collectives and transfers (comm.c does it), blocking MPI calls such as
 * communicator splits, and phases that MPI cannot watch, like an HDF5
 * collective write (zt_comm_phase_begin/end) — in a slot of the thread that
 * waits (slot 0 the main thread, slot 1 a background checkpoint writer).
 * A thread checks the slots every 20 ms; when a wait has lasted longer
 * than the timeout it asks every member of the group, over the
 * out-of-band channel (oob.h, which answers even while MPI is blocked),
 * how far each got there and where it waits, and reports on stderr:
 *   - the ranks that do not answer (stopped, hung hard) or have exited:
 *     the cause, named with pid and host;
 *   - the ranks that answer but have not arrived, and where they wait;
 * then ends the job (MPI_Abort, exit 1). One rank reports: the lowest
 * rank among those that answer and wait; the others only report if the
 * job is still alive a few seconds later. A phase in which every member
 * answers and is inside is slow, not stuck (a large checkpoint on a slow
 * disk): it gets a warning each timeout period, not an abort.
 * Needs MPI_THREAD_MULTIPLE (for MPI_Abort from the thread). */
#ifndef ZT_WATCHDOG_H
#define ZT_WATCHDOG_H

#include "parallel/comm.h"

/* parallel.timeout's default (lua/ztrain.lua says the same): also what
 * watches start-up before a script is read. */
#define ZT_WATCHDOG_DEFAULT_S 1800.0

/* Starts the watchdog thread and the out-of-band channel; collective over
 * world, right after MPI starts. timeout in seconds (<= 0: watch nothing,
 * but still answer other ranks' questions). -1 with *why (256 bytes) when
 * it cannot run (no MPI thread support), -2 when the ranks did not all
 * start in time. */
int zt_watchdog_start(const zt_comm *world, double timeout_s, char *why);
/* Changes the timeout (e.g. once the run's script is read). */
void zt_watchdog_set_timeout(double timeout_s);
/* Stops it; local (the caller's final barrier has met every rank). */
void zt_watchdog_stop(void);

/* The calling thread's slot: 0 (default) or 1 (a background writer). */
void zt_watchdog_thread_slot(int slot);

/* Called by comm around every wait; `what` names a phase (else NULL). */
void zt_watchdog_enter(zt_comm *c, zt_comm_op op, uint64_t seq, const char *what);
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

/* Test hook: ZT_TEST_STOP="RANK:WHERE" makes world rank RANK stop itself
 * (SIGSTOP, as a debugger or a frozen node would) when it reaches the
 * point `where` names, e.g. "start", "step:12", "save:20". */
void zt_watchdog_test_stop(const char *where);

#endif
