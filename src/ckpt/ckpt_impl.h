/* ckpt_impl: what the checkpoint writer (ckpt.c) and loader (ckpt_load.c)
 * share: where each state lives on this rank, the hyperslab of a local
 * piece, which part of a piece this rank vouches for, and the runs of
 * bytes that go straight between memory and the file. Not an interface
 * for other modules. */
#ifndef ZT_CKPT_IMPL_H
#define ZT_CKPT_IMPL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "src/ckpt/ckpt.h"
#include "src/ckpt/h5util.h"

/* State `which` 0..2 (weights, exp_avg, exp_avg_sq) is stored in group
 * zt_ckpt_group_path[which] (format.h). */

/* Base pointer such that flat element i of state `which` (0 weights, 1
 * exp_avg, 2 exp_avg_sq) is base[i - *lo], and the range [lo, hi) present. */
float *zt_ckpti_state_at(const zt_ckpt_state *s, int which, int64_t *lo, int64_t *hi);
/* Where the host cannot address the backend's device memory: *ls = *s with
 * host copies of the states (downloaded), which zt_ckpti_state_at then
 * hands out; ZT_ERUNTIME when out of host memory. Elsewhere *ls = *s. */
int zt_ckpti_host_begin(zt_ckpt_state *ls, const zt_ckpt_state *s, zt_err *e);
/* Frees the copies; with upload, after copying the first `kinds` back. */
void zt_ckpti_host_end(zt_ckpt_state *ls, int kinds);

/* Selects the logical image of local elements [a, b) of t's piece
 * (row-major in the local shape): its order equals the local order, so a
 * contiguous buffer of b - a elements matches it. */
void zt_ckpti_select_local(hid_t space, const zt_tensor_desc *t, int64_t a, int64_t b);

/* The checksum of local elements [a, b) of t's piece that starts at data;
 * adds their count of non-finite values to *bad. */
uint64_t zt_ckpti_piece_checksum(const zt_tensor_desc *t, const float *data, int64_t a, int64_t b,
                                 uint64_t *bad);

/* The local elements [a, b) of t this rank counts once for the world: its
 * ZeRO range, if it is the designated holder of its TP piece. */
void zt_ckpti_counted_range(const zt_ckpt_state *s, const zt_tensor_desc *t, int64_t *a,
                            int64_t *b);

/* Ranks agree after each part of their data: a failure stops everyone
 * within one part, and the watchdog sees progress per part. The staging
 * buffers of the direct writes and reads: large enough for the device to
 * stream, small enough to stay in cache. */
#define DIRECT_PART_BYTES ((int64_t)256 << 20)
#define DIRECT_BUFFER_BYTES ((size_t)8 << 20)

/* A run of a counted piece that is contiguous in the file: its elements
 * [at, at + n) (from the piece's counted start) are logical elements
 * [global, global + n) of tensor idx (which * n_params + i). */
typedef struct {
  int idx;
  int64_t at, global, n;
} span;

typedef struct {
  span *v;
  size_t n, cap;
  int idx, oom;
  int64_t a, b; /* the counted range of tensor idx */
} span_list;

/* zt_shard_runs callback: appends the part of a run inside [a, b) of the
 * list's tensor idx (sets oom when out of memory). */
void zt_ckpti_add_span(void *ctx, int64_t local, int64_t global, int64_t n);

/* This rank's stream of a save or load that goes straight between memory
 * and the file: its pieces of the tensors stored in long runs, as file
 * runs in tensor order, at the addresses HDF5 allocated (zt_fs_writer or
 * zt_fs_reader underneath). Ranks hold different
 * tensors (ZeRO partitions the flat buffer), so each writes its own
 * stream without waiting for the others; the stream is cut into the same
 * number of parts on every rank, and the ranks agree after each part. */
typedef struct {
  zt_fs_writer *w;
  span_list runs;
  int64_t total, done; /* elements: all of this rank's runs, written so far */
  size_t k;            /* the run being written, and elements of it done */
  int64_t at;
} direct;

/* Elements hashed and written per call: small enough that the checksum
 * reads what the write has just brought into the cache. */
#define DIRECT_CHUNK ((int64_t)1 << 18)

#endif
