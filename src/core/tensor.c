/* tensor: the mapping between a rank's local piece and the logical tensor.
 * Every reader and writer of sharded state (initialisation, checkpoints,
 * resharding) goes through these functions. */
#include "src/core/tensor.h"

const char *zt_dtype_name(zt_dtype t) {
  static const char *const names[ZT_DTYPE_COUNT] = {"f32",  "f64", "i32", "i64",
                                                    "u64",  "bf16", "f16", "u8"};
  return (unsigned)t < ZT_DTYPE_COUNT ? names[t] : "?";
}

static int whole(const zt_tensor_desc *t) {
  return t->shard.dim < 0 || t->shard.count <= 1;
}

/* TP ranks that hold the same piece of t. */
static int replicas(const zt_tensor_desc *t, int tp_size) {
  int count = whole(t) ? 1 : t->shard.count;
  return tp_size > count ? tp_size / count : 1;
}

int zt_shard_index_at(const zt_tensor_desc *t, int tp_rank, int tp_size) {
  return tp_rank / replicas(t, tp_size);
}

int zt_shard_counts_here(const zt_tensor_desc *t, int tp_rank, int tp_size) {
  return tp_rank % replicas(t, tp_size) == 0;
}

void zt_shard_local_shape(const zt_tensor_desc *t, int64_t shape[ZT_MAX_DIMS]) {
  for (int i = 0; i < ZT_MAX_DIMS; i++) shape[i] = i < t->ndim ? t->shape[i] : 1;
  if (!whole(t)) shape[t->shard.dim] /= t->shard.count;
}

/* Logical coordinate along the sharded dim of local coordinate x. */
static int64_t global_coord(const zt_tensor_desc *t, int64_t x) {
  const zt_shard *s = &t->shard;
  int g = s->groups > 0 ? s->groups : 1;
  int64_t part = t->shape[s->dim] / g, slice = part / s->count;
  return (x / slice) * part + (int64_t)s->index * slice + x % slice;
}

int64_t zt_shard_global_coord(const zt_tensor_desc *t, int64_t x) {
  return whole(t) ? x : global_coord(t, x);
}

int64_t zt_shard_global_index(const zt_tensor_desc *t, int64_t local) {
  if (whole(t)) return local;
  int64_t ls[ZT_MAX_DIMS], inner = 1;
  zt_shard_local_shape(t, ls);
  for (int i = t->shard.dim + 1; i < t->ndim; i++) inner *= t->shape[i];
  int64_t outer = local / (ls[t->shard.dim] * inner);
  int64_t x = local / inner % ls[t->shard.dim], in = local % inner;
  return (outer * t->shape[t->shard.dim] + global_coord(t, x)) * inner + in;
}

void zt_shard_runs(const zt_tensor_desc *t, void *ctx,
                   void (*fn)(void *ctx, int64_t local, int64_t global, int64_t n)) {
  if (whole(t)) {
    fn(ctx, 0, 0, zt_tensor_numel(t));
    return;
  }
  int64_t ls[ZT_MAX_DIMS], inner = 1, outer = 1;
  zt_shard_local_shape(t, ls);
  int d = t->shard.dim, g = t->shard.groups > 0 ? t->shard.groups : 1;
  for (int i = d + 1; i < t->ndim; i++) inner *= t->shape[i];
  for (int i = 0; i < d; i++) outer *= t->shape[i];
  int64_t slice = ls[d] / g; /* local rows per part: one run each */
  int64_t local = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int k = 0; k < g; k++, local += slice * inner)
      fn(ctx, local, (o * t->shape[d] + global_coord(t, k * slice)) * inner, slice * inner);
}
