/* scaler: see scaler.h. The update is DeepSpeed's DynamicLossScaler.
 * update_scale, step for step, so that a DeepSpeed user's settings behave
 * the same here. */
#include "src/train/scaler.h"

#include <math.h>

void zt_scaler_init(zt_scaler *s, const zt_scaler_cfg *cfg) {
  s->cfg = *cfg;
  s->scale = cfg->dynamic ? ldexp(1.0, cfg->initial_scale_power) : cfg->scale;
  s->iter = 0;
  s->last_overflow_iter = -1;
  s->hysteresis_left = cfg->hysteresis;
}

int zt_scaler_active(const zt_scaler *s) { return s->cfg.dynamic || s->scale != 1.0; }

int zt_scaler_update(zt_scaler *s, int overflow) {
  const zt_scaler_cfg *c = &s->cfg;
  int at_min = 0;
  if (!c->dynamic) {
    at_min = overflow; /* a static scale cannot go lower */
  } else if (overflow) {
    if (c->hysteresis == 1 || s->hysteresis_left <= 1) {
      at_min = s->scale <= c->min_loss_scale;
      s->scale = fmax(s->scale / 2, c->min_loss_scale);
    } else {
      s->hysteresis_left--;
    }
    s->last_overflow_iter = s->iter;
  } else {
    if (c->consecutive_hysteresis) s->hysteresis_left = c->hysteresis;
    if ((s->iter - s->last_overflow_iter) % c->loss_scale_window == 0) {
      if (!c->consecutive_hysteresis) s->hysteresis_left = c->hysteresis;
      s->scale *= 2;
    }
  }
  s->iter++;
  return at_min;
}
