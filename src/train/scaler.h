/* scaler: the loss scale of 16-bit training, with DeepSpeed's dynamic
 * loss scaler's semantics and names (deepspeed/runtime/fp16/loss_scaler.py):
 * the loss gradient is multiplied by `scale` so that small gradients stay
 * representable in 16 bits; a step whose gradients overflow is skipped and
 * the scale halved (after `hysteresis` overflows), and after
 * `loss_scale_window` clean steps it doubles. A static scale never moves;
 * scale 1, static, is no scaling. Powers of two scale and unscale exactly,
 * so a run with a scaler and no overflow is bitwise the run without. */
#ifndef ZT_SCALER_H
#define ZT_SCALER_H

#include <stdint.h>

typedef struct zt_scaler_cfg {
  int dynamic;                /* 0: static `scale` */
  double scale;               /* static: the scale; dynamic: unused */
  int initial_scale_power;    /* dynamic: the first scale is 2^this */
  int64_t loss_scale_window;  /* clean steps after which the scale doubles */
  int hysteresis;             /* overflows (in a row, see below) before it halves */
  double min_loss_scale;      /* never below */
  int consecutive_hysteresis; /* a clean step restores the hysteresis */
} zt_scaler_cfg;

/* The state a checkpoint keeps. */
typedef struct zt_scaler {
  zt_scaler_cfg cfg;
  double scale;
  int64_t iter;               /* updates so far (DeepSpeed's cur_iter) */
  int64_t last_overflow_iter; /* -1: none yet */
  int hysteresis_left;        /* DeepSpeed's cur_hysteresis */
} zt_scaler;

void zt_scaler_init(zt_scaler *s, const zt_scaler_cfg *cfg);

/* Whether the scaler does anything (dynamic, or a static scale != 1). */
int zt_scaler_active(const zt_scaler *s);

/* After a step's gradients are known: `overflow` when they are not finite.
 * Returns 1 when the step overflowed with the scale already at its minimum
 * (it cannot go lower: the step is lost whatever the scale), else 0. */
int zt_scaler_update(zt_scaler *s, int overflow);

#endif
