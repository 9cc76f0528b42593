/* policy: a directory of checkpoints, as Slurm jobs that requeue need it:
 * dir/step_NNNNNNNN.h5 per save, a `latest` file naming the newest (written
 * last, by rename, so it always names a complete file), the newest `keep`
 * kept; and resuming from the newest one that loads, falling back to older
 * ones when the newest is damaged. */
#ifndef ZT_CKPT_POLICY_H
#define ZT_CKPT_POLICY_H

#include <stddef.h>

#include "src/ckpt/ckpt.h"

/* Collective. Rank 0 creates dir and its missing parents; every rank gets
 * the outcome, a failure as `code` with the folder and the reason. */
int zt_ckpt_dir_make(const char *dir, zt_comm *world, int code, zt_err *e);

/* Collective. Saves at the current step into dir, updates `latest`, removes
 * the oldest beyond `keep`; *written gets the path (may be NULL). With
 * async, the save runs in the background (after waiting for the previous
 * one) and `latest` moves when it is complete; its errors surface at the
 * next save or at zt_ckpt_async_wait. */
int zt_ckpt_dir_save(const char *dir, int keep, const zt_ckpt_state *s, zt_ckpt_async *async,
                     char *written, size_t n, zt_err *e);

/* Collective. Loads the newest checkpoint of dir that loads cleanly (the
 * one `latest` names first, then the others newest first); *used gets its
 * path, empty when dir holds none (a fresh start). Skipped, each with a
 * warning from rank 0 naming what it is and where it points: a file that
 * does not load, a `latest` holding a path instead of a bare file name, a
 * step file resolving outside dir (a link to another run's file), one
 * whose name is not step_N.h5, and one whose recorded step differs from
 * its name or that holds no step (no optimizer state). When all are
 * skipped: ZT_EINPUT. */
int zt_ckpt_dir_resume(const char *dir, const zt_ckpt_state *s, char *used, size_t n,
                       zt_err *e);

#endif
