/* tensor: descriptors of logical tensors and of the piece a rank holds.
 * Every parameter and optimizer state has a global name and a global shape;
 * what a rank holds is a shard of it. All later sharding math (TP slices,
 * ZeRO flat ranges) extends zt_shard rather than inventing its own. */
#ifndef ZT_TENSOR_H
#define ZT_TENSOR_H

#include <stdint.h>

#define ZT_MAX_DIMS 4
#define ZT_NAME_MAX 64

typedef enum { ZT_F32 = 0 } zt_dtype;

typedef struct zt_shard {
  int dim;   /* sliced dimension, -1 when the tensor is whole */
  int index; /* this rank's slice */
  int count; /* number of slices */
} zt_shard;

typedef struct zt_tensor_desc {
  char name[ZT_NAME_MAX]; /* e.g. "blocks.3.attn.qkv.weight" */
  zt_dtype dtype;
  int ndim;
  int64_t shape[ZT_MAX_DIMS]; /* logical (global) shape */
  zt_shard shard;
  int64_t offset; /* element offset of the local piece in its flat buffer */
  int64_t numel;  /* elements of the local piece */
} zt_tensor_desc;

static inline int64_t zt_tensor_numel(const zt_tensor_desc *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

#endif
