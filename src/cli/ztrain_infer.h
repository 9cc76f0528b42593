/* ztrain_infer (internal to the ztrain command): `ztrain eval` and
 * `ztrain sample` (ztrain_infer.c), and the piece of ztrain.c's own
 * start-up that they share with training. */
#ifndef ZT_CLI_ZTRAIN_INFER_H
#define ZT_CLI_ZTRAIN_INFER_H

#include "kernels/kernels.h"
#include "src/config/config.h"
#include "src/core/err.h"

/* `ztrain eval ...` and `ztrain sample ...` (argv[1] names which): the
 * whole program, MPI included; returns the exit status. */
int zt_infer_main(int argc, char **argv);

/* ztrain.c: the backend a rank computes on (parallel.device). */
int zt_cli_pick_backend(zt_device_kind want, const zt_backend **be, zt_err *e);
/* OpenMP threads as training chooses them (OMP_NUM_THREADS, else this
 * rank's share of its affinity's cores); *why says which (ztrain.c). */
void zt_cli_set_threads(char *why, size_t n);

#endif
