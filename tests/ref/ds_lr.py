#!/usr/bin/env python3
"""DeepSpeed 0.16's LR schedules, for checking ztrain's zt.lr.deepspeed.

Written from deepspeed/runtime/lr_schedules.py (v0.16.4): WarmupLR.get_lr
and _get_gamma, WarmupDecayLR._get_gamma, WarmupCosineLR.get_lr_ratio, with
warmup_num_steps = max(2, warmup_num_steps) and inverse_log_warm_up =
1.0 / math.log(warmup_num_steps) as their constructors set them. Update k
(0-based) runs at get_lr() with last_batch_iteration k - 1: the
constructors apply get_lr() at -1 before the first update, and the engine
(_take_model_step) calls step() after each applied one.

Usage: ds_lr.py N 'JSON params with "type"'  -> the LR of updates 0..N-1,
one per line (repr: every bit).
"""
import json
import math
import sys


def lr_at(p, k):
    i = k - 1  # last_batch_iteration
    w = max(2, p.get("warmup_num_steps", 1000))
    log = p.get("warmup_type", "log") == "log"
    inv = 1.0 / math.log(w)
    warm = (inv * math.log(i + 1) if log else i / w) if 0 <= i < w else None
    if p["type"] == "WarmupCosineLR":
        if i < 0:
            return 0.0
        if warm is not None:
            lo = p.get("warmup_min_ratio", 0.0)
            ratio = lo + warm * (1. - lo)
        else:
            cmin = p.get("cos_min_ratio", 0.0001)
            real_last, real_total = i - w + 1, p["total_num_steps"] - w
            ratio = (1 + math.cos(math.pi * real_last / real_total)) / 2
            ratio = max(0.0, cmin + (1. - cmin) * ratio)
        return p["lr"] * ratio
    lo, hi = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", 0.001)
    if i < 0:
        return lo
    if warm is not None:
        gamma = warm
    elif p["type"] == "WarmupLR":
        gamma = 1.0
    else:
        t = p["total_num_steps"]
        gamma = max(0.0, float(t - i) / float(max(1.0, t - w)))
    return lo + ((hi - lo) * gamma)


if __name__ == "__main__":
    params = json.loads(sys.argv[2])
    for k in range(int(sys.argv[1])):
        print(repr(lr_at(params, k)))
