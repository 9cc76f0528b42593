/* oob: the watchdog's out-of-band channel. Ranks answer each other's
 * questions over plain TCP sockets, outside MPI: an answer never waits for
 * MPI's lock or progress engine, so a rank whose main thread is blocked in
 * an MPI call or inside an HDF5 collective still answers, and a rank that
 * does not answer is stopped, hung hard or gone — which is what a report
 * has to tell apart from the healthy ranks that merely wait for it (the
 * same reason PyTorch keeps a TCP store beside NCCL). Addresses are
 * exchanged once over MPI at start; after that nothing here touches MPI. */
#ifndef ZT_OOB_H
#define ZT_OOB_H

#include <mpi.h>

#define ZT_OOB_QUESTION 16 /* bytes of a question */
#define ZT_OOB_ANSWER 256  /* bytes of an answer */

/* Fills `answer` (ZT_OOB_ANSWER bytes, zeroed) for `question`; runs on
 * whichever thread calls zt_oob_serve or zt_oob_ask. */
typedef void (*zt_oob_answer_fn)(const void *question, void *answer);

typedef enum {
  ZT_OOB_ANSWERED = 0,
  ZT_OOB_SILENT, /* reachable, but no answer in time: stopped or hung hard */
  ZT_OOB_GONE    /* nobody listens any more: the process has exited */
} zt_oob_status;

/* Collective over `world` (the only MPI this module makes): opens this
 * rank's listening socket and learns every rank's host, pid and address.
 * Gives up after wait_s (a rank that never starts): -1 with a message in
 * why (256 bytes). */
int zt_oob_start(MPI_Comm world, zt_oob_answer_fn fn, double wait_s, char *why);
void zt_oob_stop(void);

/* Answers the questions that have arrived, waiting up to wait_ms for one. */
void zt_oob_serve(int wait_ms);

/* Asks ranks[0..n) the same question at once and waits up to wait_s for
 * their answers (answers: n * ZT_OOB_ANSWER bytes), answering others'
 * questions meanwhile. st[i] says what became of rank i's. */
void zt_oob_ask(const int *ranks, int n, const void *question, void *answers,
                zt_oob_status *st, double wait_s);

/* How long this process did not run (no serve call for over 1.5 s: it
 * was stopped, or starved of CPU), if that ended within the last
 * `within` seconds; else 0. */
double zt_oob_stalled(double within);

/* The world's size, and where a rank runs, for reports. */
int zt_oob_size(void);
const char *zt_oob_host(int rank);
int zt_oob_pid(int rank);

#endif
