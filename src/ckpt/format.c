/* format: see format.h. */
#include "src/ckpt/format.h"

#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "src/ckpt/ckpt.h"
#include "src/ckpt/h5util.h"

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "format passes a hid_t as an int64_t");

const char *const zt_ckpt_group_path[ZT_CKPT_NGROUPS] = {
    "/model", "/optim/exp_avg", "/optim/exp_avg_sq", "/optim/master"};
const char *const zt_ckpt_group_name[ZT_CKPT_NGROUPS] = {"model", "exp_avg", "exp_avg_sq",
                                                         "master"};

int64_t zt_ckpt_format_bf16_type(void) {
  /* float32 with the low 16 mantissa bits dropped: same sign, exponent and
   * bias, so HDF5 converts it to float32 exactly */
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  if (t < 0) return -1;
  if (H5Tset_fields(t, 15, 7, 8, 0, 7) < 0 || H5Tset_offset(t, 0) < 0 ||
      H5Tset_precision(t, 16) < 0 || H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 127) < 0) {
    H5Tclose(t);
    return -1;
  }
  return t;
}

int zt_ckpt_format_write_header(int64_t f, int64_t step, const char *plan,
                                const char *topology, const char *state) {
  long long version = ZT_CKPT_VERSION, at = step;
  return zt_h5_write_str_attr(f, ZT_CKPT_ATTR_FORMAT, ZT_CKPT_FORMAT) ||
         zt_h5_write_scalar_attr(f, ZT_CKPT_ATTR_VERSION, H5T_STD_I64LE, H5T_NATIVE_LLONG,
                                 &version) ||
         zt_h5_write_scalar_attr(f, ZT_CKPT_ATTR_STEP, H5T_STD_I64LE, H5T_NATIVE_LLONG, &at) ||
         zt_h5_write_str_attr(f, ZT_CKPT_ATTR_PLAN, plan ? plan : "{}") ||
         zt_h5_write_str_attr(f, ZT_CKPT_ATTR_TOPOLOGY, topology) ||
         (state && zt_h5_write_str_attr(f, ZT_CKPT_ATTR_STATE, state));
}

int zt_ckpt_format_create_groups(int64_t f, int optim) {
  const char *gs[] = {zt_ckpt_group_path[ZT_CKPT_MODEL], "/optim",
                      zt_ckpt_group_path[ZT_CKPT_EXP_AVG], zt_ckpt_group_path[ZT_CKPT_EXP_AVG_SQ],
                      zt_ckpt_group_path[ZT_CKPT_MASTER]};
  for (int i = 0; i < (optim ? 5 : 1); i++) {
    hid_t g = H5Gcreate2(f, gs[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0 || H5Gclose(g) < 0) return 1;
  }
  return 0;
}

int zt_ckpt_format_link_master(int64_t f, const char *name) {
  char from[512], to[512];
  snprintf(from, sizeof from, "%s/%s", zt_ckpt_group_path[ZT_CKPT_MODEL], name);
  snprintf(to, sizeof to, "%s/%s", zt_ckpt_group_path[ZT_CKPT_MASTER], name);
  return H5Lcreate_hard(f, from, f, to, H5P_DEFAULT, H5P_DEFAULT) < 0;
}

int zt_ckpt_format_write_tensor(int64_t f, zt_ckpt_group g, const char *name, int ndim,
                                const int64_t *shape, const float *x) {
  hsize_t dims[8];
  int64_t n = 1;
  if (ndim < 1 || ndim > 8) return 1;
  for (int d = 0; d < ndim; d++) dims[d] = (hsize_t)shape[d], n *= shape[d];
  char path[512];
  snprintf(path, sizeof path, "%s/%s", zt_ckpt_group_path[g], name);
  uint64_t sum = zt_ckpt_checksum(x, n, 0);
  hid_t space = H5Screate_simple(ndim, dims, NULL);
  hid_t ds = space < 0 ? -1
                       : H5Dcreate2(f, path, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                    H5P_DEFAULT);
  int bad = ds < 0 || H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) < 0 ||
            zt_h5_write_scalar_attr(ds, ZT_CKPT_ATTR_CHECKSUM, H5T_STD_U64LE, H5T_NATIVE_UINT64,
                                    &sum);
  if (ds >= 0 && H5Dclose(ds) < 0) bad = 1;
  if (space >= 0) H5Sclose(space);
  return bad;
}

char *zt_ckpt_format_state_json(const zt_ckpt_state_rec *r) {
  json_t *o = json_pack("{s:{s:I, s:I, s:I}, s:{s:I}, s:f, s:I}", "data", "epoch",
                        (json_int_t)r->epoch, "next_sample", (json_int_t)r->next_sample,
                        "samples_per_epoch", (json_int_t)r->samples_per_epoch, "rng", "seed",
                        (json_int_t)r->seed, "loss_scale", r->loss_scale, "skipped_steps",
                        (json_int_t)r->skipped_steps);
  if (o && r->has_scaler)
    json_object_set_new(o, "loss_scaler",
                        json_pack("{s:f, s:I, s:I, s:i}", "scale", r->scaler_scale, "iter",
                                  (json_int_t)r->scaler_iter, "last_overflow_iter",
                                  (json_int_t)r->scaler_last_overflow, "hysteresis",
                                  r->scaler_hysteresis));
  char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return txt;
}

/* The dynamic scaler's state: 0, or -1 when any part is missing or wrong. */
static int parse_scaler(json_t *v, zt_ckpt_state_rec *r) {
  json_t *scale = json_object_get(v, "scale"), *it = json_object_get(v, "iter");
  json_t *last = json_object_get(v, "last_overflow_iter"), *hy = json_object_get(v, "hysteresis");
  if (!json_is_number(scale) || !json_is_integer(it) || !json_is_integer(last) ||
      !json_is_integer(hy))
    return -1;
  r->scaler_scale = json_number_value(scale);
  r->scaler_iter = (int64_t)json_integer_value(it);
  r->scaler_last_overflow = (int64_t)json_integer_value(last);
  json_int_t h = json_integer_value(hy);
  r->scaler_hysteresis = h >= 1 && h <= INT32_MAX ? (int)h : 0;
  if (!(isfinite(r->scaler_scale) && r->scaler_scale > 0) || r->scaler_iter < 0 ||
      r->scaler_last_overflow < -1 || r->scaler_last_overflow >= r->scaler_iter ||
      r->scaler_hysteresis < 1)
    return -1;
  r->has_scaler = 1;
  return 0;
}

int zt_ckpt_format_parse_state(const char *json, int64_t step, zt_ckpt_state_rec *r,
                               const char **bad) {
  memset(r, 0, sizeof *r);
  r->loss_scale = 1;
  *bad = "state";
  json_t *o = json_loads(json, 0, NULL);
  int rc = json_is_object(o) ? 0 : -1;
  json_t *v = rc ? NULL : json_object_get(o, "skipped_steps");
  if (v) {
    r->skipped_steps = json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
    if (r->skipped_steps < 0 || r->skipped_steps > step) rc = -1, *bad = "skipped_steps";
  }
  v = rc ? NULL : json_object_get(o, "loss_scaler");
  if (v && parse_scaler(v, r)) rc = -1, *bad = "loss_scaler";
  json_decref(o);
  return rc;
}
