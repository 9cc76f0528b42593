/* zreshard_export: `zreshard export`, the weights (/model) as one
 * safetensors file. The file's record has been checked (zt_zreshard_open),
 * so the header names exactly the plan's model's tensors, in the model's
 * order; each tensor's checksum and finiteness are checked as it is
 * copied, and a tensor that fails stops the export (nothing is left
 * behind) unless --force. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/ckpt/ckpt_file.h"
#include "src/ckpt/h5util.h"
#include "src/cli/zreshard.h"
#include "src/core/half.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors and checkpoint checksums are defined on little-endian bytes"
#endif

typedef struct {
  FILE *f;
  int bf16;
  uint16_t *half; /* bf16 staging for one block */
  int64_t half_n;
  zt_ckpt_tally tally; /* of the values read */
  int write_errno;
} export_ctx;

/* Writes n values (as bf16 when asked). */
static int write_values(export_ctx *c, const float *x, int64_t n) {
  const void *data = x;
  size_t size = sizeof *x;
  if (c->bf16) {
    if (n > c->half_n) {
      uint16_t *h = realloc(c->half, (size_t)n * sizeof *h);
      if (!h) return c->write_errno = ENOMEM, ZT_ERUNTIME;
      c->half = h;
      c->half_n = n;
    }
    zt_bf16_from_f32_n(c->half, x, (size_t)n);
    data = c->half;
    size = sizeof *c->half;
  }
  if (fwrite(data, size, (size_t)n, c->f) != (size_t)n) {
    c->write_errno = errno ? errno : EIO;
    return ZT_ERUNTIME;
  }
  return ZT_OK;
}

static int export_block(void *ctx, const zt_ckpt_tensor *t, const int64_t *start,
                        const int64_t *count, const float *x, int64_t n) {
  export_ctx *c = ctx;
  zt_ckpt_tally_box(&c->tally, t, start, count, x, n);
  return write_values(c, x, n);
}

/* A 2-D tensor transposed ([r, c] stored, [c, r] written): read whole. */
static int export_transposed(export_ctx *c, const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                             zt_err *e) {
  int64_t r = t->shape[0], k = t->shape[1], zero[ZT_MAX_DIMS] = {0};
  float *x = malloc((size_t)t->numel * sizeof *x), *y = malloc((size_t)t->numel * sizeof *y);
  int rc = x && y ? zt_ckpt_file_read(cf, t, NULL, NULL, x, e)
                  : zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (!rc) {
    zt_ckpt_tally_box(&c->tally, t, zero, t->shape, x, t->numel);
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < k; j++) y[j * r + i] = x[i * k + j];
    rc = write_values(c, y, t->numel);
  }
  free(x);
  free(y);
  return rc;
}

int zt_zreshard_write_safetensors(const args *a, const zt_ckpt_file *cf,
                                  const zt_ckpt_tensor **ts, int n, const zt_zreshard_st_name *names,
                                  json_t *meta, const char *path, int64_t *data_bytes, zt_err *e) {
  /* the header: {"__metadata__": {...}, name: {dtype, shape, data_offsets},
   * ...}, offsets relative to the data that follows it */
  json_t *h = json_object();
  json_object_set(h, "__metadata__", meta);
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    int tr = names && names[i].transpose;
    json_t *shape = json_array();
    for (int d = 0; d < ts[i]->ndim; d++)
      json_array_append_new(shape, json_integer(ts[i]->shape[tr ? ts[i]->ndim - 1 - d : d]));
    int64_t bytes = ts[i]->numel * (a->bf16 ? 2 : 4);
    json_object_set_new(h, names ? names[i].name : ts[i]->name,
                        json_pack("{s:s, s:o, s:[I, I]}", "dtype", a->bf16 ? "BF16" : "F32",
                                  "shape", shape, "data_offsets", (json_int_t)off,
                                  (json_int_t)(off + bytes)));
    off += bytes;
  }
  *data_bytes = off;
  char *header = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(h);
  int rc = header ? ZT_OK : zt_err_set(e, ZT_ERUNTIME, "out of memory");
  export_ctx c = {.bf16 = a->bf16};
  if (!rc && !(c.f = fopen(path, "wb")))
    rc = zt_err_set(e, ZT_ERUNTIME, "cannot create %s: %s", path, strerror(errno));
  if (!rc) {
    /* 8-byte little-endian length of the header, which is padded with
     * spaces so that the data starts 8-aligned */
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    if (fwrite(lb, 1, 8, c.f) != 8 || fwrite(header, 1, len, c.f) != len ||
        fwrite("       ", 1, padded - len, c.f) != padded - len)
      c.write_errno = errno ? errno : EIO;
  }
  for (int i = 0; i < n && !rc && !c.write_errno; i++) {
    c.tally = (zt_ckpt_tally){0};
    rc = names && names[i].transpose ? export_transposed(&c, cf, ts[i], e)
                                     : zt_ckpt_file_each_block(cf, ts[i], export_block, &c, e);
    if (rc == ZT_ERUNTIME && c.write_errno) rc = ZT_OK; /* reported below */
    else if (!rc) rc = zt_zreshard_accept(a, cf, ts[i], &c.tally, e);
  }
  if (c.f && (fflush(c.f) || fsync(fileno(c.f))) && !c.write_errno) c.write_errno = errno;
  if (c.f && fclose(c.f) && !c.write_errno) c.write_errno = errno;
  if (!rc && c.write_errno)
    rc = zt_err_set(e, ZT_ERUNTIME, "writing %s failed: %s", path, strerror(c.write_errno));
  if (rc && c.f) unlink(path);
  free(c.half);
  free(header);
  return rc;
}

/* The metadata of ztrain's own export: the record, and that the names
 * are ztrain's. */
static json_t *ztrain_metadata(const zt_ckpt_file *cf) {
  json_t *meta = json_object();
  char num[32];
  json_object_set_new(meta, "format", json_string("pt"));
  snprintf(num, sizeof num, "%lld", (long long)cf->step);
  json_object_set_new(meta, "ztrain_step", json_string(num));
  snprintf(num, sizeof num, "%lld", (long long)cf->version);
  json_object_set_new(meta, "ztrain_format_version", json_string(num));
  json_object_set_new(meta, "ztrain_names", json_string("ztrain logical tensor names "
                                                        "(docs/checkpoint-format.md)"));
  json_t *plan = cf->plan ? json_loads(cf->plan, 0, NULL) : NULL;
  json_t *model = json_object_get(plan, "model");
  if (json_is_object(model)) {
    char *s = json_dumps(model, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s) json_object_set_new(meta, "ztrain_model", json_string(s));
    free(s);
    json_t *tied = json_object_get(model, "tied");
    if (json_is_boolean(tied))
      json_object_set_new(meta, "ztrain_tied", json_string(json_is_true(tied) ? "true" : "false"));
  }
  json_decref(plan);
  return meta;
}

int zt_zreshard_export(const args *a, zt_err *e) {
  zt_ckpt_file cf;
  zt_ckpt_record rec;
  int rc = zt_fs_check_writable("-o", a->out, e);
  if (!rc) rc = zt_zreshard_open(a->ckpt, &cf, &rec, e);
  if (rc) return rc;
  rc = zt_zreshard_need_checksums(a, &cf, 1, e);
  const zt_ckpt_tensor **ts = NULL;
  int n = rc ? 0 : zt_zreshard_group_order(&cf, ZT_CKPT_MODEL, &rec.model, &ts);
  if (!rc && n < 0) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  char *tmp = rc ? NULL : zt_zreshard_temp_name(a->out);
  if (!rc && !tmp) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  json_t *meta = rc ? NULL : ztrain_metadata(&cf);
  int64_t data_bytes = 0;
  if (!rc) rc = zt_zreshard_write_safetensors(a, &cf, ts, n, NULL, meta, tmp, &data_bytes, e);
  if (!rc) rc = zt_fs_publish(tmp, a->out, e);
  if (rc && tmp) unlink(tmp);
  if (!rc)
    printf("wrote %s: safetensors, %d tensors of /model as %s, %lld bytes of data, step %lld\n",
           a->out, n, a->bf16 ? "BF16" : "F32", (long long)data_bytes, (long long)cf.step);
  json_decref(meta);
  free(tmp);
  free(ts);
  zt_zreshard_close(&cf, &rec);
  return rc;
}
