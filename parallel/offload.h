/* offload: the optimizer states of a rank (fp32 master weights and the two
 * AdamW moments over one flat range [lo, hi)) kept where a policy places
 * each unit's part of them: device memory, pinned host memory ("cpu",
 * ZeRO-Offload) or a file (nvme, ZeRO-Infinity). The optimizer step of a
 * part held off the device runs on the host (the CPU backend's AdamW: the
 * same float ops as every backend's), its gradients copied down and its
 * updated weights copied back up in chunks on a copy stream, written as
 * if the device were asynchronous: chunk i+1 (and i+2) is being copied
 * down while chunk i updates, chunk i-1's weights are going back up.
 * The weights the passes compute with (PARAM) may be placed per unit too
 * (ZeRO-Infinity's parameter tier; the owner allocates them, unit_param
 * says where): a unit whose weights live on the host is updated on the
 * host, its new weights copied to where they live. Weights placed on nvme
 * live in the rank's file after the states, an aligned extent per unit;
 * their owner reads a unit's ahead of its use into one of the store's
 * host buffers (zt_offload_param_fetch), and the update writes them back.
 * The ZeRO engine (zero.c) owns one of these when its policy offloads
 * anything; nothing here knows ZeRO or models, only flat ranges and units. */
#ifndef ZT_OFFLOAD_H
#define ZT_OFFLOAD_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "src/core/err.h"

/* Where a state group lives. */
typedef enum { ZT_PLACE_DEVICE = 0, ZT_PLACE_CPU, ZT_PLACE_NVME, ZT_PLACES } zt_place;

/* The kinds of state groups a policy places (the script's names). */
typedef enum {
  ZT_OFF_PARAMS = 0,
  ZT_OFF_GRADS,
  ZT_OFF_MASTER,
  ZT_OFF_MOMENTS,
  ZT_OFF_KINDS
} zt_offload_kind;

/* The policy as the plan resolved it: per kind, the placement of each
 * unit (n_units entries; n_units = 0: everything on the device). dir: the
 * directory of the nvme files; job: a name that tells this job's files
 * from another's. */
typedef struct zt_offload_cfg {
  int n_units;
  unsigned char *place[ZT_OFF_KINDS];
  char *dir;
  char *job;
} zt_offload_cfg;

const char *zt_place_name(zt_place p);
const char *zt_offload_kind_name(zt_offload_kind k);
/* Whether cfg places any unit of kind k off the device. */
int zt_offload_any(const zt_offload_cfg *cfg, zt_offload_kind k);
/* Whether cfg places any unit of any kind at p. */
int zt_offload_uses(const zt_offload_cfg *cfg, zt_place p);

/* What one optimizer step updates: flat elements [lo, hi), every pointer
 * at element lo: fp32 master weights, summed gradients and moments; w16
 * is where the update writes the weights rounded to dt16 in the same pass
 * (NULL in fp32). */
typedef struct zt_update_range {
  int64_t lo, hi;
  float *w, *g, *m, *v;
  void *w16;
  zt_dtype dt16;
} zt_update_range;

/* Where a piece of the update runs: the backend and stream its pointers
 * belong to, and a zt_step_sums there (device memory, or host memory for
 * the CPU backend). */
typedef struct zt_update_exec {
  const zt_backend *be;
  zt_stream *stream;
  zt_step_sums *sums;
} zt_update_exec;

/* Called for each piece of a range, in flat order. */
typedef void (*zt_update_fn)(void *ctx, const zt_update_exec *x, const zt_update_range *piece);

/* The three states, in this order. */
enum { ZT_OFF_W = 0, ZT_OFF_M, ZT_OFF_V, ZT_OFF_STATES };

typedef struct zt_offload zt_offload;

/* The layout a store is made for: units (flat ranges, in order, covering
 * the buffer), the states' range [lo, hi) (a ZeRO shard or the whole
 * buffer), the weights the passes compute with (`param`: element lo of
 * PARAM, device memory, of dtype param_dt) and, in fp32, whether the
 * device-placed masters are PARAM itself (else they get their own device
 * memory). rank: names this rank's nvme file. */
typedef struct zt_offload_layout {
  int n_units;
  const int64_t *start, *numel;
  int64_t lo, hi;
  void *param;
  void *const *unit_param; /* params placed per unit (then param is unused): each
                            * unit's part of PARAM, at its first element in
                            * [lo, hi); NULL: one buffer */
  zt_dtype param_dt;
  int master_is_param;
  int grads_ahead; /* gradients of host-updated units final before the step
                    * (zt_offload_grads_final): a pinned copy of them */
  int rank;
} zt_offload_layout;

/* Allocates the states (zeroed) where cfg places them. NULL with *e set:
 * ZT_EINPUT for an nvme file that cannot be made, ZT_ERUNTIME otherwise. */
zt_offload *zt_offload_new(const zt_offload_cfg *cfg, const zt_offload_layout *lay,
                           const zt_backend *be, zt_stream *stream, zt_err *e);
void zt_offload_free(zt_offload *o);

/* What zt_offload_new holds, in bytes. */
typedef struct zt_offload_sizes {
  int64_t state[ZT_OFF_STATES][ZT_PLACES]; /* each state (ZT_OFF_W, _M, _V) per placement
                                            * (nvme: its extent of the file, padded) */
  int64_t param_file; /* the weights placed in the file (padded) */
  int64_t grads_host; /* grads_ahead: the pinned copy of the host-updated gradients */
  int64_t staging;    /* pinned: the host update's chunks, the weights read from the file */
} zt_offload_sizes;
/* zt_offload_new's sizes without allocating; -1 when out of memory. */
int zt_offload_plan_bytes(const zt_offload_cfg *cfg, const zt_offload_layout *lay,
                          zt_offload_sizes *out);

/* Bytes held per placement (all three states, and the pinned copy of the
 * gradients). */
void zt_offload_bytes(const zt_offload *o, int64_t bytes[ZT_PLACES]);

/* State s as one buffer when all of it lives in one memory (*mem its
 * kind): element lo at the result. NULL when it is spread over several
 * or lives in a file: then read and write it with the calls below. */
void *zt_offload_state(const zt_offload *o, int s, zt_mem_kind *mem);
/* Copies flat elements [a, a + n) of state s to or from host memory
 * (synchronous: the model stream is waited for). */
int zt_offload_read(zt_offload *o, int s, int64_t a, int64_t n, float *dst, zt_err *e);
int zt_offload_write(zt_offload *o, int s, int64_t a, int64_t n, const float *src, zt_err *e);

/* PARAM := the masters rounded to param_dt over [lo, hi) (after a load or
 * the initial values). */
int zt_offload_sync_params(zt_offload *o, zt_err *e);

/* One pass over the range with gradients `g` (device memory, element lo):
 * fn is called for each piece, on the device for device-placed parts and
 * on the host (the CPU backend, pinned staging) for the others, whose
 * weights then go back to PARAM when `update` (a visit without it only
 * reads). dev: where the device pieces run; *host_nonfinite += what the
 * host pieces counted in their sums. The model stream waits for the
 * write-backs before its next work. */
int zt_offload_step(zt_offload *o, float *g, int update, zt_update_fn fn, void *ctx,
                    const zt_update_exec *dev, uint64_t *host_nonfinite, zt_err *e);

/* Weights placed on nvme (ZeRO-Infinity's parameter tier): the host
 * buffers a unit's piece is read into, one read in flight in each. */
#define ZT_OFFLOAD_PARAM_SLOTS 2
/* Starts reading this rank's piece of unit's weights (param_dt, the
 * unit's part of [lo, hi)) from the file into host buffer `slot`, after
 * the last update's writes of weights have landed and the slot's last
 * read is done with. The caller must be done with what the slot held. */
int zt_offload_param_fetch(zt_offload *o, int unit, int slot, zt_err *e);
/* Waits for the slot's read; the piece (pinned host memory), or NULL with
 * *e set when the read failed. */
const void *zt_offload_param_wait(zt_offload *o, int slot, zt_err *e);

/* ZeRO-Offload's overlap, with lay.grads_ahead: the gradients of flat
 * range [a, b) (device memory, `g` at element lo, written on the model
 * stream) are final for this step; their host-updated part starts down to
 * the pinned copy on the copy stream, so that the step's host update
 * finds it there. Between zt_offload_grads_begin (every step, before the
 * passes) and the step; a range written again after this call
 * (zt_offload_grads_stale) is copied at the step as without it. */
void zt_offload_grads_begin(zt_offload *o);
void zt_offload_grads_final(zt_offload *o, const float *g, int64_t a, int64_t b);
void zt_offload_grads_stale(zt_offload *o, int64_t a, int64_t b);

/* The NVMe engine that reads and writes this rank's file, as
 * zt_nvme_engine_name says it; NULL when nothing is placed on nvme. */
const char *zt_offload_nvme_engine(const zt_offload *o);

#endif
