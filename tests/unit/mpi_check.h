/* mpi_check: how the multi-rank tests (test_tp, test_comm) report. Each
 * rank checks on its own and counts its failures; the ranks add them up
 * at the end, so one failing rank fails the run without hanging the
 * others in a collective. CHECK(cond, printf-args) prints "rank R: FAIL:
 * ..." and counts one in the including file's `failures`, with `rank`
 * its rank. */
#ifndef ZT_TEST_MPI_CHECK_H
#define ZT_TEST_MPI_CHECK_H

#include <stdio.h>

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "rank %d: FAIL: ", rank);            \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
    }                                                      \
  } while (0)

#endif
