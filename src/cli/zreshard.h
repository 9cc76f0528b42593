/* zreshard (internal): what zreshard.c (arguments, info, verify, the
 * checks every command shares), zreshard_export.c (export) and
 * zreshard_convert.c (convert) and zreshard_hf.c (Hugging Face export and
 * import) share. */
#ifndef ZT_ZRESHARD_H
#define ZT_ZRESHARD_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "src/ckpt/ckpt_file.h"
#include "src/core/err.h"
#include "src/model/model.h"

typedef struct args {
  const char *cmd, *ckpt, *out, *format;
  int verify; /* info: read the data (0: --no-verify, list only) */
  int force;  /* accept tensors that do not verify, with a warning each
                 (--force; export and convert also take --no-verify) */
  int weights_only, bf16;
  int tp, pp, dp, zero; /* -1: the source's */
} args;

/* A chunk of a converted tensor holds at most this many bytes: HDF5's
 * limit is 4 GiB, and a reader of one shard reads whole chunks anyway.
 * ZRESHARD_CHUNK_BYTES (a test hook) sets it lower. */
extern int64_t zt_zreshard_chunk_max_bytes;

/* Opens a checkpoint and checks its record (zt_ckpt_file_check_record):
 * every command starts here, so all refuse the same files with the same
 * message (ZT_EINPUT). On failure nothing is left open. */
int zt_zreshard_open(const char *path, zt_ckpt_file *cf, zt_ckpt_record *rec, zt_err *e);
void zt_zreshard_close(zt_ckpt_file *cf, zt_ckpt_record *rec);

/* Group g's tensors (links to /model left out) in the model's order;
 * returns how many (-1: out of memory). The record check made the group
 * hold exactly the model's tensors. */
int zt_zreshard_group_order(const zt_ckpt_file *cf, zt_ckpt_group g, const zt_model *m,
                            const zt_ckpt_tensor ***out);

/* Why tensor t, whose values gave the tally ty, does not verify: the
 * ZR_* reasons that apply (0: it verifies), and in why a phrase for
 * "tensor NAME ..." ("" when it verifies). */
enum { ZR_NO_SUM = 1, ZR_MISMATCH = 2, ZR_NONFINITE = 4 };
int zt_zreshard_verdict(const zt_ckpt_tensor *t, const zt_ckpt_tally *ty, char *why, size_t n);

/* Before export or convert reads groups 0..ngroups-1: tensors without a
 * checksum (all of a version 1 file) cannot be verified: ZT_EINPUT, or
 * with a->force one warning and ZT_OK. */
int zt_zreshard_need_checksums(const args *a, const zt_ckpt_file *cf, int ngroups, zt_err *e);

/* After export or convert read tensor t with tally ty: ZT_EINPUT naming
 * what fails, or with a->force a warning and ZT_OK. */
int zt_zreshard_accept(const args *a, const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                       const zt_ckpt_tally *ty, zt_err *e);

/* "zreshard CMD: warning: ..." on stderr. */
void zt_zreshard_warn(const args *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* PATH.tmp.PID, to write before renaming (caller frees). */
char *zt_zreshard_temp_name(const char *path);

/* Writes tensors ts[0..n) of cf (read in blocks, each verified as
 * zt_zreshard_accept says) as the safetensors file `path`, F32 or, with
 * a->bf16, BF16, under ztrain's names or names[i] (then transposed where
 * names[i].transpose: 2-D, [r, c] stored, [c, r] written), with the
 * metadata object meta. *data_bytes: the bytes after the header. On
 * failure nothing is left at path. */
typedef struct zt_zreshard_st_name {
  char name[300];
  int transpose;
} zt_zreshard_st_name;
int zt_zreshard_write_safetensors(const args *a, const zt_ckpt_file *cf,
                                  const zt_ckpt_tensor **ts, int n, const zt_zreshard_st_name *names,
                                  json_t *meta, const char *path, int64_t *data_bytes, zt_err *e);

/* zreshard export and convert. */
int zt_zreshard_export(const args *a, zt_err *e);
int zt_zreshard_convert(const args *a, zt_err *e);
/* export --format hf and import (zreshard_hf.c). */
int zt_zreshard_export_hf(const args *a, zt_err *e);
int zt_zreshard_import(const args *a, zt_err *e);

#endif
