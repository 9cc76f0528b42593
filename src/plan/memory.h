/* memory (plan): what each rank of a plan holds in memory, by purpose and
 * by placement, before anything runs — from the very functions that size
 * the allocations at start-up (zt_model_plan, zt_zero_plan_bytes,
 * zt_pipe_plan_bytes, zt_trainer_own_bytes, the backend's gemm_scratch),
 * so the estimate is the allocation. No MPI and no model memory: a rank's
 * place in the grid comes from the plan's layout (rank = tp + TP*(dp +
 * DP*pp), parallel/grid). `ztrain plan` prints it; ztrain checks it
 * against the memory it may use before it allocates. */
#ifndef ZT_PLAN_MEMORY_H
#define ZT_PLAN_MEMORY_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "src/config/config.h"

/* Columns: where bytes live, offload's placements (parallel/offload.h):
 * the backend's device memory, host memory (ZT_PLACE_CPU: the cpu tier's
 * pinned memory, and the host's own buffers), NVMe files. The CPU
 * backend's device memory is host memory. */

/* The rows of a breakdown. */
typedef enum {
  ZT_MEM_PARAMS = 0, /* the weights the passes compute with (model dtype) */
  ZT_MEM_MASTERS,    /* fp32 master weights (none apart in fp32: the params) */
  ZT_MEM_GRADS,      /* fp32 gradients */
  ZT_MEM_MOMENTS,    /* AdamW's two moments */
  ZT_MEM_TIED,       /* a tied head's copy of the embedding (last stage) */
  ZT_MEM_ACTS,       /* saved activations of every slot, recomputation's set */
  ZT_MEM_COMM,       /* ZeRO buckets / gather buffers / 16-bit reduce, pipeline transfers */
  ZT_MEM_MPI,        /* the MPI library's temporaries in the largest reductions */
  ZT_MEM_WORKSPACE,  /* a pass's scratch, GEMM scratch */
  ZT_MEM_OTHER,      /* batch arrays, losses, the step's sums */
  ZT_MEM_ROWS
} zt_mem_row;

typedef struct zt_memplan {
  int rank, dp_rank, tp_rank, pp_rank;
  int64_t bytes[ZT_MEM_ROWS][ZT_PLACES];
  char detail[ZT_MEM_ROWS][160];
  /* activations: per block and micro-batch with and without
   * recomputation, and how many of each this rank holds */
  int64_t block_kept, block_input;
  int kept_blocks, recomputed_blocks;
  int slots;     /* micro-batches in flight at once (summed over chunks) */
  int threads;   /* threads the figures assume */
  int64_t offload_staging; /* of the workspace: the host update's pinned chunks */
  int64_t peak[ZT_PLACES];
  /* what this process holds: device and host where the device's memory
   * is host memory (the CPU backend), else the device's */
  int64_t peak_bytes;
  /* of the peak, what timing decides: with overlap, the MPI library's
   * temporaries of a second bucket in flight (the plan counts them: a
   * bound); peak_floor_bytes = peak_bytes less that */
  int64_t timing_bytes, peak_floor_bytes;
} zt_memplan;

/* Rank `rank` of the plan's layout (0 .. dp*tp*pp - 1), with `threads`
 * OpenMP threads per rank. ZT_EINPUT for a layout the model refuses. */
int zt_memplan_rank(const zt_plan *p, int rank, int threads, zt_memplan *out, zt_err *e);

/* Refuses (ZT_EINPUT) a rank whose planned peak in host memory exceeds
 * the memory it may use (p->model.mem; avail 0: no check), saying what
 * needs what, what is available, and what would fit (a micro-batch, a
 * ZeRO stage). device_is_host: the backend's device memory is host memory
 * (the CPU backend's; zt_backend.host_visible), so it counts too. */
int zt_memplan_check(const zt_plan *p, int rank, int threads, int device_is_host, zt_err *e);

/* The row's name in tables and JSON. */
const char *zt_memplan_row_name(zt_mem_row r);

/* One rank as a JSON object: rank, grid coordinates, peak_bytes, peak by
 * placement and the breakdown (row -> {device, host, nvme, detail}). */
json_t *zt_memplan_json(const zt_memplan *m);

/* A table of ranks m->rank..last (alike), in MiB/GiB, with the peak. */
void zt_memplan_print(const zt_memplan *m, int last, FILE *f);

/* Whether two ranks' breakdowns are the same (to print one table for both). */
int zt_memplan_same(const zt_memplan *a, const zt_memplan *b);

#endif
