/* ckpt_file: checkpoint files read on one process, for tools (zreshard)
 * and, later, the trainer's loader. Opening a file reads and checks its
 * whole structure once: format attributes, the run's record (plan, script,
 * topology, state) and every tensor of /model, /optim/exp_avg,
 * /optim/exp_avg_sq and /optim/master with its shape, element type,
 * chunking and checksum. Everything taken from the file is bounds-checked
 * before use (names, ranks, shapes, sizes, attribute types), so a damaged
 * or hostile file is refused with a message naming what is wrong; nothing
 * in a file is ever executed, and HDF5 is never asked to follow links,
 * external or virtual storage, or filter plugins into other files or code.
 * The record's JSON texts are checked against each other and against the
 * tensors by zt_ckpt_file_check_record (ckpt_record.c), which every tool
 * applies after opening. Formats read: version 1 (no checksums, no record
 * beyond the plan) and version 2 (docs/checkpoint-format.md). Serial HDF5
 * only: no MPI needed. */
#ifndef ZT_CKPT_FILE_H
#define ZT_CKPT_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "src/ckpt/format.h"
#include "src/core/err.h"
#include "src/core/tensor.h"
#include "src/model/model.h"

/* The groups (zt_ckpt_group, zt_ckpt_group_path) and stored element
 * types (zt_ckpt_dtype) are the format's: format.h. */

/* Limits on what a file may claim, far above any real checkpoint. */
#define ZT_CKPT_MAX_TENSORS (1 << 20) /* per group */
#define ZT_CKPT_MAX_NUMEL (INT64_C(1) << 40)
/* ZT_CKPT_MAX_TEXT (format.h): bytes of a string attribute or the script */

typedef struct zt_ckpt_tensor {
  char name[ZT_NAME_MAX]; /* logical name: printable ASCII, no spaces */
  zt_ckpt_group group;
  zt_ckpt_dtype dtype;
  int ndim; /* 1..ZT_MAX_DIMS */
  int64_t shape[ZT_MAX_DIMS];
  int64_t numel;
  int chunked;                 /* stored in chunks of `chunk` elements */
  int64_t chunk[ZT_MAX_DIMS];
  int has_checksum;
  uint64_t checksum;           /* stored checksum (valid if has_checksum) */
  int link;                    /* /optim/master only: a hard link to the
                                  /model tensor of the same name, so the
                                  same data (not listed a second time) */
} zt_ckpt_tensor;

typedef struct zt_ckpt_file {
  int64_t h5;   /* the open HDF5 file (hid_t) */
  char *path;
  int64_t version, step;
  /* The run's record as stored: NUL-terminated text, NULL when absent. */
  char *plan, *script, *topology, *state;
  int has_optim; /* the file has /optim */
  int present[ZT_CKPT_NGROUPS];          /* the group exists (may be empty) */
  int n[ZT_CKPT_NGROUPS];                /* tensors per group */
  zt_ckpt_tensor *tensors[ZT_CKPT_NGROUPS]; /* by name, per group */
} zt_ckpt_file;

/* The layout a file was written under (topology attribute, or the plan's
 * parallel section for version 1 files). */
typedef struct zt_ckpt_topology {
  int world, dp, tp, pp, zero;
  int from_plan; /* version 1: taken from the plan, not recorded */
} zt_ckpt_topology;

/* Opens `path` read-only and checks its structure. A missing file, one
 * that is not HDF5, truncated, not a ztrain checkpoint, of another format
 * version or with any malformed part: ZT_EINPUT with a message. The data
 * of tensors is not read (see zt_ckpt_file_tensor_tally). */
int zt_ckpt_file_open(zt_ckpt_file *cf, const char *path, zt_err *e);
void zt_ckpt_file_close(zt_ckpt_file *cf);

/* The tensor `name` of group g, or NULL. */
const zt_ckpt_tensor *zt_ckpt_file_find(const zt_ckpt_file *cf, zt_ckpt_group g,
                                        const char *name);

/* Reads the box start[d] .. start[d]+count[d]-1 of tensor t as float32,
 * row-major, into out (prod(count) floats); start/count NULL: the whole
 * tensor. bf16 is widened exactly. Any HDF5 failure: ZT_EINPUT ("damaged"). */
int zt_ckpt_file_read(const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                      const int64_t *start, const int64_t *count, float *out,
                      zt_err *e);

/* Elements read at once when streaming a tensor: 2^24 (64 MiB of
 * float32). Tests make it small to cut tiny tensors into many blocks. */
extern int64_t zt_ckpt_file_block_elems;

/* Reads tensor t in blocks of at most zt_ckpt_file_block_elems, in row-major order (so the
 * blocks' values, concatenated, are the flat tensor), calling fn with each
 * box (start, count), its n values and ctx; fn returns non-zero to stop,
 * and that status is returned. */
typedef int (*zt_ckpt_block_fn)(void *ctx, const zt_ckpt_tensor *t, const int64_t *start,
                                const int64_t *count, const float *x, int64_t n);
int zt_ckpt_file_each_block(const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                            zt_ckpt_block_fn fn, void *ctx, zt_err *e);

/* What one pass over a tensor's values finds: the checksum of the values
 * and how many are NaN or infinite. A diverged run writes such values
 * with checksums that match, so a checksum alone does not make a tensor
 * usable. */
typedef struct zt_ckpt_tally {
  uint64_t sum;
  int64_t nonfinite;
} zt_ckpt_tally;

/* Adds the box (start, count) of tensor t, whose n values row-major are x. */
void zt_ckpt_tally_box(zt_ckpt_tally *ty, const zt_ckpt_tensor *t, const int64_t *start,
                       const int64_t *count, const float *x, int64_t n);

/* Tallies all of tensor t from its data, read in blocks (bounded memory). */
int zt_ckpt_file_tensor_tally(const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                              zt_ckpt_tally *ty, zt_err *e);

/* Reads a root attribute of the open file: a string (fixed or variable
 * length, at most ZT_CKPT_MAX_TEXT bytes; *out malloc'ed, caller frees) or
 * a 64-bit integer. Absent: ZT_OK with *out NULL / *present 0. Present
 * but of another type or shape: ZT_EINPUT. */
int zt_ckpt_file_attr_str(const zt_ckpt_file *cf, const char *name, char **out, zt_err *e);
int zt_ckpt_file_attr_i64(const zt_ckpt_file *cf, const char *name, int64_t *v,
                          int *present, zt_err *e);

/* ---- the record (ckpt_record.c) ----
 * The plan, topology and state attributes are JSON that carries no
 * checksum; a tool trusts them only after zt_ckpt_file_check_record. */

/* The model the plan describes (its "model" section), every number
 * range-checked; no check of divisibility (zt_model_cfg_check does that). */
int zt_ckpt_file_model_cfg(const zt_ckpt_file *cf, zt_model_cfg *cfg, zt_err *e);

/* The layout that wrote the file. */
int zt_ckpt_file_topology(const zt_ckpt_file *cf, zt_ckpt_topology *t, zt_err *e);

/* Checks that group g holds exactly the tensors of the model table m
 * (names and logical shapes), naming the first that is missing, extra or
 * of another shape. */
int zt_ckpt_file_check_model(const zt_ckpt_file *cf, zt_ckpt_group g, const zt_model *m,
                             zt_err *e);

/* What a file says about itself, once checked as a whole. */
typedef struct zt_ckpt_record {
  zt_model_cfg cfg;      /* the plan's model */
  zt_model model;        /* its tensor table at tp = 1: names, shapes, order */
  zt_ckpt_topology topo; /* the layout that wrote the file */
  int have_topo;         /* 0 only for a version 1 file whose plan has no
                            parallel section */
} zt_ckpt_record;

/* The one check of a file's record that every reader of it applies
 * (zreshard's info, verify, export and convert alike): the plan is a JSON
 * object whose model section passes the model's own rules; every tensor
 * group present holds exactly that model's tensors with its shapes (no
 * extra, missing or misshapen name); the topology attribute (version 2
 * must have one; version 1 takes the plan's parallel section) is a JSON
 * object whose world is dp * tp * pp and whose layout the model can take;
 * the state attribute, when present, is a JSON object. ZT_EINPUT naming
 * the first problem. On success r->model is allocated
 * (zt_ckpt_record_free). */
int zt_ckpt_file_check_record(const zt_ckpt_file *cf, zt_ckpt_record *r, zt_err *e);
void zt_ckpt_record_free(zt_ckpt_record *r);

/* "[2, 3]" for a shape, cut to fit n bytes. */
void zt_ckpt_shape_str(char *buf, size_t n, int ndim, const int64_t *d);

/* Checksum contribution of a box (start, count) of tensor t whose values,
 * row-major, are x; adds the box's count of non-finite values to
 * *nonfinite (may be NULL) in the same pass. */
uint64_t zt_ckpt_file_box_checksum(const zt_ckpt_tensor *t, const int64_t *start,
                                   const int64_t *count, const float *x, uint64_t *nonfinite);


#endif
