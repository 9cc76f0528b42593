/* zreshard (internal): what zreshard.c (arguments, info, verify, export)
 * and zreshard_convert.c (convert) share. */
#ifndef ZT_ZRESHARD_H
#define ZT_ZRESHARD_H

#include <stdint.h>

#include "src/ckpt/ckpt_file.h"
#include "src/core/err.h"
#include "src/model/model.h"

typedef struct args {
  const char *cmd, *ckpt, *out, *format;
  int verify, weights_only, bf16;
  int tp, pp, dp, zero; /* -1: the source's */
} args;

/* A chunk of a converted tensor holds at most this many bytes: HDF5's
 * limit is 4 GiB, and a reader of one shard reads whole chunks anyway.
 * ZRESHARD_CHUNK_BYTES (a test hook) sets it lower. */
extern int64_t zt_zreshard_chunk_max_bytes;

/* The model table of the plan at tp = 1 when the file's /model is exactly
 * that model (1), else 0. */
int zt_zreshard_plan_layout(const zt_ckpt_file *cf, zt_model *m, zt_model_cfg *cfg);

/* Group g's tensors (links left out) in the model's order when m is given
 * and matches, else in the file's; returns how many (-1: out of memory). */
int zt_zreshard_group_order(const zt_ckpt_file *cf, zt_ckpt_group g, const zt_model *m,
                            const zt_ckpt_tensor ***out);

/* PATH.tmp.PID, to write before renaming (caller frees). */
char *zt_zreshard_temp_name(const char *path);

/* zreshard convert. */
int zt_zreshard_convert(const args *a, zt_err *e);

#endif
