/* format: the checkpoint format (version 2, docs/checkpoint-format.md) in
 * one place, for everything that writes or reads checkpoints: the trainer's
 * parallel writer (ckpt.c) and loader (ckpt_load.c), the serial reader of
 * tools (ckpt_file.c) and zreshard. It names the format and its version,
 * the tensor groups and their paths, the root attributes, the stored
 * element types; it writes a file's header, its groups and the master
 * weights' links; and it makes and parses the state record (data position,
 * skipped steps, the loss scaler). Serial HDF5 calls only; HDF5 handles are
 * passed as int64_t (hid_t) so that includers need not see hdf5.h. */
#ifndef ZT_CKPT_FORMAT_H
#define ZT_CKPT_FORMAT_H

#include <stdint.h>

#define ZT_CKPT_FORMAT "ztrain-checkpoint"
#define ZT_CKPT_VERSION 2

/* Root attributes and the script's dataset. */
#define ZT_CKPT_ATTR_FORMAT "format"
#define ZT_CKPT_ATTR_VERSION "format_version"
#define ZT_CKPT_ATTR_STEP "step"
#define ZT_CKPT_ATTR_PLAN "plan"
#define ZT_CKPT_ATTR_TOPOLOGY "topology"
#define ZT_CKPT_ATTR_STATE "state"
#define ZT_CKPT_ATTR_CHECKSUM "checksum" /* on each tensor */
#define ZT_CKPT_SCRIPT "/script"
/* The most bytes a string attribute or the script may hold, for every
 * reader alike (the trainer's loader and the tools). */
#define ZT_CKPT_MAX_TEXT (64 << 20)

/* The tensor groups, in file order. Training state `which` 0..2 (weights,
 * AdamW's two moments) is group `which`. */
typedef enum {
  ZT_CKPT_MODEL = 0,      /* /model: parameters (the fp32 masters) */
  ZT_CKPT_EXP_AVG = 1,    /* /optim/exp_avg: AdamW first moment */
  ZT_CKPT_EXP_AVG_SQ = 2, /* /optim/exp_avg_sq: AdamW second moment */
  ZT_CKPT_MASTER = 3,     /* /optim/master: fp32 master weights, hard links to /model */
  ZT_CKPT_NGROUPS = 4
} zt_ckpt_group;

/* "/model", "/optim/exp_avg", ... and "model", "exp_avg", ... by group. */
extern const char *const zt_ckpt_group_path[ZT_CKPT_NGROUPS];
extern const char *const zt_ckpt_group_name[ZT_CKPT_NGROUPS];

/* Element types a checkpoint may store. bf16 is an HDF5 floating-point
 * type of 16 bits (sign 15, exponent 7..14 with bias 127, mantissa 0..6),
 * so HDF5 tools and h5py's astype('f4') read its values. */
typedef enum { ZT_CKPT_F32 = 0, ZT_CKPT_BF16 = 1 } zt_ckpt_dtype;

/* A new HDF5 datatype id for bf16 as stored (the caller closes it with
 * H5Tclose); < 0 on failure. */
int64_t zt_ckpt_format_bf16_type(void);

/* Writes the root attributes (format, version, step, plan, topology and,
 * when not NULL, state) of a file being created. Nonzero on failure. In a
 * parallel file every rank calls it alike (HDF5 metadata is collective). */
int zt_ckpt_format_write_header(int64_t f, int64_t step, const char *plan,
                                const char *topology, const char *state);

/* Creates /model and, with optim, /optim and its three groups. */
int zt_ckpt_format_create_groups(int64_t f, int optim);

/* /optim/master/NAME as a hard link to /model/NAME: in the file the fp32
 * master weights are the parameters. */
int zt_ckpt_format_link_master(int64_t f, const char *name);

/* Writes tensor `name` of group g (its group exists) as a contiguous
 * little-endian float32 dataset of the given shape from the n row-major
 * values x, with its checksum attribute: the serial writer of tools that
 * make a checkpoint from other data (zreshard import). Nonzero on failure. */
int zt_ckpt_format_write_tensor(int64_t f, zt_ckpt_group g, const char *name, int ndim,
                                const int64_t *shape, const float *x);

/* The state record (the `state` attribute, JSON). */
typedef struct zt_ckpt_state_rec {
  int64_t epoch, next_sample, samples_per_epoch;
  uint64_t seed;
  double loss_scale;     /* of the next step; 1 without scaling */
  int64_t skipped_steps; /* steps skipped for non-finite values */
  int has_scaler;        /* a dynamic loss scaler's state follows */
  double scaler_scale;
  int64_t scaler_iter, scaler_last_overflow;
  int scaler_hysteresis;
} zt_ckpt_state_rec;

/* The record as JSON (malloc'ed; NULL when out of memory). */
char *zt_ckpt_format_state_json(const zt_ckpt_state_rec *r);

/* What the loader needs of a stored record: skipped_steps (0 when absent,
 * as in files that predate it) and a dynamic scaler's state (has_scaler 0
 * when absent). -1 when the text is not a JSON object or a value is of the
 * wrong type or out of range for a file at `step`: *bad names the key. */
int zt_ckpt_format_parse_state(const char *json, int64_t step, zt_ckpt_state_rec *r,
                               const char **bad);

#endif
