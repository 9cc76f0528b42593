/* tensor: descriptors of logical tensors and of the piece a rank holds.
 * Every parameter and optimizer state has a global name and a global shape;
 * what a rank holds is a shard of it. All later sharding math (TP slices,
 * ZeRO flat ranges) extends zt_shard rather than inventing its own. */
#ifndef ZT_TENSOR_H
#define ZT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define ZT_MAX_DIMS 4
#define ZT_NAME_MAX 64

/* Element types. Tensors are float32 today; the others are what
 * collectives move (norms in double, flags and checksums in integers,
 * gradients in 16 bit where the precision policy says so: bf16 and fp16
 * held as bit patterns, see half.h; opaque bytes in U8). New types are
 * appended: the values index per-type tables (byte counts per dtype). */
typedef enum {
  ZT_F32 = 0,
  ZT_F64,
  ZT_I32,
  ZT_I64,
  ZT_U64,
  ZT_BF16,
  ZT_F16,
  ZT_U8,
  ZT_DTYPE_COUNT
} zt_dtype;

static inline size_t zt_dtype_size(zt_dtype t) {
  switch (t) {
    case ZT_U8: return 1;
    case ZT_BF16:
    case ZT_F16: return 2;
    case ZT_F32:
    case ZT_I32: return 4;
    case ZT_F64:
    case ZT_I64:
    case ZT_U64: return 8;
    case ZT_DTYPE_COUNT: break; /* no default: -Wswitch names a new type left out */
  }
  return 0;
}

/* "f32", "bf16", ...; "?" for a value outside the enum. */
const char *zt_dtype_name(zt_dtype t);

/* A TP shard: dimension `dim` of the logical tensor is cut into `groups`
 * equal parts (1 for a plain slice; 3 for gpt's fused q,k,v rows) and each
 * part into `count` equal slices; the rank holds slice `index` of every
 * part, concatenated in part order. count is the TP size, or a divisor of
 * it when there are fewer slices than ranks (llama's k and v with
 * tp > kv_heads): each slice is then replicated over tp/count consecutive
 * TP ranks. */
typedef struct zt_shard {
  int dim;    /* sliced dimension, -1 when the tensor is whole */
  int index;  /* this rank's slice */
  int count;  /* number of slices */
  int groups; /* parts of dim sliced separately (>= 1) */
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

/* The slice TP rank `tp_rank` of `tp_size` holds of a tensor cut like t:
 * tp_rank / (tp_size / count), since a slice is replicated over tp_size /
 * count consecutive ranks; 0 for a whole tensor (count 1). */
int zt_shard_index_at(const zt_tensor_desc *t, int tp_rank, int tp_size);

/* Whether TP rank `tp_rank` is the designated holder of its piece of t:
 * the first of the ranks holding the same piece. Whole tensors: rank 0
 * only; cut in tp_size slices: every rank; cut in count < tp_size slices:
 * every (tp_size/count)-th rank. Whatever sums over the TP group (gradient
 * norms, checkpoint assembly) counts each logical element once by taking
 * only designated pieces. */
int zt_shard_counts_here(const zt_tensor_desc *t, int tp_rank, int tp_size);

/* Logical coordinate along the cut dimension of local coordinate x along
 * it (x itself for a whole tensor). */
int64_t zt_shard_global_coord(const zt_tensor_desc *t, int64_t x);

/* Shape of the local piece (the logical shape when whole). */
void zt_shard_local_shape(const zt_tensor_desc *t, int64_t shape[ZT_MAX_DIMS]);

/* Row-major index in the logical tensor of element `local` of the local
 * piece: the one mapping every sharded reader and writer goes through. */
int64_t zt_shard_global_index(const zt_tensor_desc *t, int64_t local);

/* The local piece as runs of consecutive logical elements: calls
 * fn(ctx, local_offset, global_offset, length) for each, in local order. */
void zt_shard_runs(const zt_tensor_desc *t, void *ctx,
                   void (*fn)(void *ctx, int64_t local, int64_t global, int64_t n));

#endif
