"""What the equivalence checkers share, without torch: ztrain's checkpoint
reader and the metrics helpers.

equiv.py, pp_check.py and grid_check.py import this alone, so that a check
starts in a third of a second instead of loading torch (two seconds of CPU
each, which the suite paid once per compared run); ztorch and compare
re-export these names.
"""

import json
import math
from dataclasses import dataclass
from typing import Dict, Optional

import h5py
import numpy as np

CHECKPOINT_FORMAT = "ztrain-checkpoint"
CHECKPOINT_VERSIONS = (1, 2)


# --------------------------------------------------------------------------
# Checkpoint


@dataclass
class Checkpoint:
    plan: dict
    step: int
    model: Dict[str, np.ndarray]
    # None when the file has no /optim group (e.g. a freshly initialised model).
    exp_avg: Optional[Dict[str, np.ndarray]]
    exp_avg_sq: Optional[Dict[str, np.ndarray]]
    # Steps skipped for non-finite values before this one: the optimizer's
    # clock (AdamW's bias correction, the LR schedule) is step - skipped.
    skipped: int = 0
    # The dynamic loss scaler's state (state.loss_scaler), when it has one.
    loss_scaler: Optional[dict] = None


def _attr_str(value) -> str:
    # h5py returns variable-length strings as str, fixed-length ones as bytes.
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def _read_group(group: h5py.Group) -> Dict[str, np.ndarray]:
    # Names are flat ("blocks.0.attn.qkv.weight"), so a nested group means the
    # writer does not follow the format: refuse rather than guess a flattening.
    out = {}
    for name, obj in group.items():
        if not isinstance(obj, h5py.Dataset):
            raise ValueError(f"{obj.name}: expected a dataset, found a group")
        if obj.dtype != np.float32:
            raise ValueError(f"{obj.name}: dtype {obj.dtype}, expected float32")
        out[name] = obj[()]
    return out


def read_checkpoint(path: str) -> Checkpoint:
    with h5py.File(path, "r") as f:
        fmt = _attr_str(f.attrs.get("format", ""))
        if fmt != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: format attribute is {fmt!r}, expected {CHECKPOINT_FORMAT!r}")
        version = int(f.attrs.get("format_version", -1))
        if version not in CHECKPOINT_VERSIONS:
            raise ValueError(f"{path}: format_version {version}, expected one of {CHECKPOINT_VERSIONS}")
        if "plan" not in f.attrs or "step" not in f.attrs:
            raise ValueError(f"{path}: missing 'plan' or 'step' attribute")
        plan = json.loads(_attr_str(f.attrs["plan"]))
        step = int(f.attrs["step"])
        state = json.loads(_attr_str(f.attrs["state"])) if "state" in f.attrs else {}
        skipped = int(state.get("skipped_steps", 0))
        if "model" not in f:
            raise ValueError(f"{path}: no /model group")
        model = _read_group(f["model"])
        exp_avg = exp_avg_sq = None
        if "optim" in f:
            exp_avg = _read_group(f["optim/exp_avg"])
            exp_avg_sq = _read_group(f["optim/exp_avg_sq"])
    return Checkpoint(plan, step, model, exp_avg, exp_avg_sq, skipped, state.get("loss_scaler"))


# --------------------------------------------------------------------------
# Metrics and distances


class Failure(Exception):
    pass


def rel(a: float, b: float) -> float:
    """|a - b| / |b|, with 0/0 = 0; NaN propagates so that it fails checks."""
    diff = abs(a - b)
    return diff / abs(b) if b != 0 else (0.0 if diff == 0 else math.inf)


def read_metrics(path: str) -> list:
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise Failure(f"{path}:{lineno}: not JSON: {e}")
            # Validation-only lines carry "val_loss" and no training step.
            if "loss" in row:
                rows.append(row)
    return rows


def weight_distance(name: str, value, ref, dim: int) -> float:
    """Relative L2 distance ‖value − ref‖ / ‖ref‖ of one logical tensor.

    The key bias of gpt's attn.qkv.bias (rows dim..2*dim) has an identically
    zero gradient (it shifts every score of a query by the same amount, which
    softmax ignores), so its value is rounding noise that Adam normalises up
    to ~lr-sized steps: it cannot match and does not affect the model. Only
    the q and v rows of that tensor are compared.
    """
    value, ref = np.asarray(value, np.float64), np.asarray(ref, np.float64)
    if name.endswith("attn.qkv.bias"):
        keep = np.r_[0:dim, 2 * dim : 3 * dim]
        value, ref = value[keep], ref[keep]
    num, den = np.linalg.norm(value - ref), np.linalg.norm(ref)
    return num / den if den else (0.0 if num == 0 else math.inf)
