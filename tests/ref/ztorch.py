"""PyTorch reference for ztrain: model, checkpoint reader, data order, LR
schedule and one optimizer step, all with ztrain's exact semantics.

Everything here is deliberately plain (no fused kernels, no autocast) so
that it is easy to audit against the C implementation. The model runs in
fp32 (Transformer.forward), or under ztrain's 16-bit policy
(train.precision "bf16" or "fp16": Transformer.forward16 with a
MixedPrecision, which writes out every point where ztrain rounds; see the
section "Mixed precision" below).
Used by tests/ref/compare.py and tests/bench/torch_bench.py.
"""

import json
import math
import struct
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# The checkpoint reader needs no torch: it lives in zcheck (which the
# equivalence checkers import alone, without torch's second of start-up).
from zcheck import (CHECKPOINT_FORMAT, CHECKPOINT_VERSIONS, Checkpoint,  # noqa: F401
                    _attr_str, _read_group, read_checkpoint)

TOKEN_MAGIC = b"ZTRAINTK"
TOKEN_HEADER = struct.Struct("<8sIIQII")  # magic, version, token_bytes, count, vocab, reserved
assert TOKEN_HEADER.size == 32


# --------------------------------------------------------------------------
# Model


@dataclass
class ModelConfig:
    kind: str
    vocab: int
    seq: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn_dim: int
    norm_eps: float
    rope_theta: float
    tied: bool

    @staticmethod
    def from_plan(m: dict) -> "ModelConfig":
        kind = m["kind"]
        if kind not in ("gpt", "llama"):
            raise ValueError(f"unknown model kind {kind!r}")
        cfg = ModelConfig(
            kind=kind,
            vocab=int(m["vocab"]),
            seq=int(m["seq"]),
            dim=int(m["dim"]),
            layers=int(m["layers"]),
            heads=int(m["heads"]),
            kv_heads=int(m.get("kv_heads") or m["heads"]),
            # The gpt MLP width is fixed at 4C by the format, whatever the plan says.
            ffn_dim=4 * int(m["dim"]) if kind == "gpt" else int(m["ffn_dim"]),
            norm_eps=float(m["norm_eps"]),
            rope_theta=float(m.get("rope_theta") or 10000.0),
            tied=bool(m.get("tied", False)),
        )
        if kind == "llama" and cfg.tied:
            raise ValueError("llama's head is never tied")
        if cfg.dim % cfg.heads or cfg.heads % cfg.kv_heads:
            raise ValueError(f"dim {cfg.dim}, heads {cfg.heads}, kv_heads {cfg.kv_heads} do not divide")
        if kind == "gpt" and cfg.kv_heads != cfg.heads:
            raise ValueError("gpt has no grouped-query attention: kv_heads must equal heads")
        if kind == "llama" and (cfg.dim // cfg.heads) % 2:
            raise ValueError("rotary embedding needs an even head dim")
        return cfg


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def causal_attention(q, k, v):
    """q, k, v: [B, H, T, hd] -> [B, H, T, hd]."""
    T, hd = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(-1) @ v


def rotary_tables(seq: int, head_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    # Angles are computed in float64 and rounded once: pos * freq reaches
    # hundreds of radians, where an fp32 angle alone would be off by ~1e-5.
    half = head_dim // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / head_dim)
    angle = torch.arange(seq, dtype=torch.float64)[:, None] * freq[None, :]
    cos = torch.cat([angle.cos(), angle.cos()], -1).float()
    sin = torch.cat([angle.sin(), angle.sin()], -1).float()
    return cos, sin  # [T, head_dim]


def apply_rotary(x, cos, sin):
    """Rotate-half rotary embedding; x: [B, heads, T, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    T = x.shape[-2]
    return x * cos[:T] + rotated * sin[:T]


# --------------------------------------------------------------------------
# Mixed precision
#
# ztrain's 16-bit policy (train.precision = "bf16" or "fp16") on its CPU
# backend, written out rounding point by rounding point. r(.) below is one
# rounding to nearest even to the 16-bit type; "computed in fp32" means from
# the 16-bit values, in float32.
#
# Weights: fp32 masters (the checkpoint's, AdamW's); the model computes with
# w16 = r(master), made before each step's passes. d/d(master) is the
# gradient with respect to w16, in fp32, unrounded (_RoundWeight).
#
# Forward, each activation stored in 16 bit, i.e. rounded once by the op
# that writes it (_Round):
#   embedding  x0 = r(wte16[tok] + wpe16[pos])        (llama: wte16[tok])
#   per block  ln1 = r(norm(x))
#              qkv = r(ln1 @ Wqkv^T); gpt: qkv = r(qkv + b)  (two roundings)
#              llama: q, k = r(rope(q)), r(rope(k))   (in place; v as is)
#              att = r(attention(q, k, v))            (fp32 inside, softmax too)
#              mid = r(x + att @ Wout^T)              (residual in the GEMM's sum)
#              gpt: mid = r(mid + b_out)
#              ln2 = r(norm(mid))
#              gpt:   fc = r(ln2 @ Wfc^T), fc = r(fc + b_fc), act = r(gelu(fc))
#              llama: act = r(silu(r(ln2 @ Wg^T)) * r(ln2 @ Wu^T))
#              out = r(mid + act @ Wdown^T); gpt: out = r(out + b_down)
#   head       lnf = r(norm(x)); logits = r(lnf @ Whead^T)
#   loss       cross-entropy in fp32 from the 16-bit logits
#
# Backward: every activation gradient is 16 bit. _Round's backward rounds
# the gradient arriving at each activation above once, after autograd has
# summed (in fp32) what its consumers sent it. That gives these points:
#   dlogits = r((softmax - onehot) * scale / tokens)
#   d(any GEMM input) = r(dY @ W), with dY already rounded (the GEMM's
#     output was an activation); llama's q/k/v and gate/up read one input,
#     their three (two) products summed in fp32 and rounded once, as
#     ztrain's one GEMM over the fused rows does
#   dfc = r(gelu'(fc) * dact); llama: dgate, dup rounded each
#   attention (_Attention16, FlashAttention-2's backward as ztrain has it):
#     dO rounded on arrival, D = rowsum(dO * O) with O the stored 16-bit
#     output, dQ, dK, dV in fp32 (dK, dV summed over the query heads of a
#     kv head), rounded where qkv (llama: the rope output, then the GEMM
#     output again after rope's backward) is stored
#   residual stream: d(mid) = r(d(out) + norm2'(dln2)) and
#     d(x) = r(d(mid) + norm1'(dln1)): the incoming 16-bit residual
#     gradient plus the norm's fp32 input gradient, rounded once (ztrain
#     accumulates the norm backward into the 16-bit dres in place)
#   a bias's add rounds its output's gradient again: a no-op (already 16 bit)
# Weight gradients (GEMMs, norms, biases, embeddings) are fp32 from the
# 16-bit operands, never rounded, accumulated over micro-batches in fp32;
# clipping and AdamW run in fp32 on the masters.
#
# Where ztrain's kernels differ by construction, the comparison is a
# tolerance, not bitwise: every fp32 computation in between (GEMM blocking
# and summation order, layernorm's and softmax's reductions, exp/tanh,
# attention's online softmax and P recomputed from lse) differs in its last
# bits, which moves a few activations across a 16-bit rounding boundary.
# Rounding points may also sit slightly apart: ztrain's norm backward adds
# into the residual gradient element by element where autograd sums the
# two contributions first (the same single rounding here, but any kernel
# that rounded the norm's part before adding would differ by one ulp).
#
# fp16 adds the loss scale: the loss gradient is multiplied by it (so
# every 16-bit gradient holds scaled values), the fp32 weight gradients are
# divided by it before clipping, and LossScaler decides overflows as ztrain
# does (the global sum of squares of the scaled gradients not finite).

HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _Round(torch.autograd.Function):
    """An activation stored in 16 bit: rounded on the way forward, and its
    gradient rounded on the way back (by mp.round_grad, which also notes
    the largest gradient it rounded)."""

    @staticmethod
    def forward(ctx, x, mp):
        ctx.mp = mp
        return x.to(mp.dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return ctx.mp.round_grad(g), None


class _RoundWeight(torch.autograd.Function):
    """The 16-bit compute copy of a master weight; the gradient reaches the
    master unrounded (straight through)."""

    @staticmethod
    def forward(ctx, w, mp):
        ctx.master = w.dtype
        return w.to(mp.dtype).to(mp.compute)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.master), None


def _matmul(a, b, parts: int):
    """a @ b; with parts > 1, the reduction (a's last dimension) cut in that
    many near-equal pieces whose products are summed after, first to last:
    the same values, another reduction order (used only to measure what
    such an order changes)."""
    if parts <= 1:
        return a @ b
    cuts = [a.shape[-1] * i // parts for i in range(parts + 1)]
    out = a[..., cuts[0] : cuts[1]] @ b[..., cuts[0] : cuts[1], :]
    for lo, hi in zip(cuts[1:-1], cuts[2:]):
        out = out + a[..., lo:hi] @ b[..., lo:hi, :]
    return out


class _SplitLinear(torch.autograd.Function):
    """x @ w^T whose three GEMMs (forward, input and weight gradient) all
    take the split reduction order of _matmul."""

    @staticmethod
    def forward(ctx, x, w, parts):
        ctx.parts = parts
        ctx.save_for_backward(x, w)
        return _matmul(x, w.t(), parts)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        dx = _matmul(g, w, ctx.parts)
        dw = _matmul(g.reshape(-1, g.shape[-1]).t(), x.reshape(-1, x.shape[-1]), ctx.parts)
        return dx, dw, None


class _Attention16(torch.autograd.Function):
    """Causal attention on 16-bit q, k, v [B, H, T, hd] (k, v already
    repeated per query head), computed in fp32, the output rounded once.
    Backward as FlashAttention-2's (ztrain's attn_bwd): the incoming dO is
    16 bit, D = rowsum(dO * O) uses the stored (rounded) O, and dQ, dK, dV
    leave in fp32 for the caller's rounding point."""

    @staticmethod
    def forward(ctx, q, k, v, mp):
        T, hd = q.shape[-2], q.shape[-1]
        scale = 1.0 / math.sqrt(hd)
        scores = _matmul(q, k.transpose(-2, -1), mp.split) * scale
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        p = scores.masked_fill(future, float("-inf")).softmax(-1)
        o = _matmul(p, v, mp.split).to(mp.dtype).to(q.dtype)
        ctx.mp, ctx.scale = mp, scale
        ctx.save_for_backward(q, k, v, p, o)
        return o

    @staticmethod
    def backward(ctx, g):
        q, k, v, p, o = ctx.saved_tensors
        mp = ctx.mp
        do = mp.round_grad(g)
        d = (do * o).sum(-1, keepdim=True)
        dv = _matmul(p.transpose(-2, -1), do, mp.split)
        ds = p * (_matmul(do, v.transpose(-2, -1), mp.split) - d) * ctx.scale
        dq = _matmul(ds, k, mp.split)
        dk = _matmul(ds.transpose(-2, -1), q, mp.split)
        return dq, dk, dv, None


class MixedPrecision:
    """train.precision "bf16" or "fp16" for Transformer.forward16.

    split_gemms and reverse_micro_batches change only reduction orders (every
    GEMM's and attention product's reduction cut in that many pieces; the
    micro-batches' weight gradients accumulated last to first), compute =
    float64 the precision of what happens between rounding points: they
    exist to measure how far two equally valid computations drift apart,
    which is what the test's tolerance is derived from (docs/testing.md)."""

    def __init__(self, precision: str, split_gemms: int = 1,
                 reverse_micro_batches: bool = False, compute: torch.dtype = torch.float32):
        if precision not in HALF_DTYPES:
            raise ValueError(f"precision {precision!r}: expected one of {sorted(HALF_DTYPES)}")
        self.name = precision
        self.dtype = HALF_DTYPES[precision]
        self.split = split_gemms
        self.reverse_micro_batches = reverse_micro_batches
        # What the ops compute in between rounding points: float32 as ztrain;
        # float64 (nearly exact) only to measure what float32's own errors
        # change. Weight gradients reach the fp32 masters as float32 either way.
        self.compute = compute
        # Largest finite |gradient| met at a rounding point in the last
        # step's backward passes, before rounding (for fp16: how close a
        # step came to overflowing, or how far past it the first overflow was).
        self.grad_max = 0.0

    @staticmethod
    def from_plan(train_plan: dict) -> Optional["MixedPrecision"]:
        """None for fp32 (the plain model)."""
        precision = train_plan.get("precision", "fp32")
        return None if precision == "fp32" else MixedPrecision(precision)

    def round_grad(self, g):
        a = g.abs()
        a = a[torch.isfinite(a)]
        if a.numel():
            self.grad_max = max(self.grad_max, a.max().item())
        return g.to(self.dtype).to(g.dtype)

    def r(self, x):
        return _Round.apply(x, self)

    def w(self, p):
        return _RoundWeight.apply(p, self)

    def mm(self, x, w):
        """x @ w^T in fp32, unrounded."""
        return _SplitLinear.apply(x, w, self.split) if self.split > 1 else x @ w.t()

    def linear(self, x, lin: nn.Linear, res=None):
        """r(res + x @ W^T), then r(. + b) as a separate op."""
        y = self.mm(x, self.w(lin.weight))
        y = self.r(y if res is None else res + y)
        return y if lin.bias is None else self.r(y + self.w(lin.bias))

    def norm(self, x, m: nn.Module):
        if isinstance(m, nn.LayerNorm):
            y = F.layer_norm(x, m.normalized_shape, self.w(m.weight), self.w(m.bias), m.eps)
        else:
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps) * self.w(m.weight)
        return self.r(y)

    def attention(self, q, k, v):
        return _Attention16.apply(q, k, v, self)


class GPTAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)

    def forward16(self, x, mp: MixedPrecision):
        """The attention output before the out projection (which the block
        fuses with the residual)."""
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in mp.linear(x, self.qkv).split(C, -1))
        return mp.attention(q, k, v).transpose(1, 2).reshape(B, T, C)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        hd = cfg.dim // cfg.heads
        self.q = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.out = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)
        cos, sin = rotary_tables(cfg.seq, hd, cfg.rope_theta)
        # Buffers, not parameters: they must not show up in the checkpoint name list.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q = self.q(x).view(B, T, self.heads, hd).transpose(1, 2)
        k = self.k(x).view(B, T, self.kv_heads, hd).transpose(1, 2)
        v = self.v(x).view(B, T, self.kv_heads, hd).transpose(1, 2)
        q, k = apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin)
        # repeat_interleave maps query head h to kv head h // (H / KVH).
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)

    def forward16(self, x, mp: MixedPrecision):
        """As GPTAttention.forward16; rope rounds q and k once more."""
        B, T, C = x.shape
        hd = C // self.heads
        q = mp.linear(x, self.q).view(B, T, self.heads, hd).transpose(1, 2)
        k = mp.linear(x, self.k).view(B, T, self.kv_heads, hd).transpose(1, 2)
        v = mp.linear(x, self.v).view(B, T, self.kv_heads, hd).transpose(1, 2)
        q, k = mp.r(apply_rotary(q, self.cos, self.sin)), mp.r(apply_rotary(k, self.cos, self.sin))
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return mp.attention(q, k, v).transpose(1, 2).reshape(B, T, C)


class GeluMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.dim, cfg.ffn_dim)
        self.down = nn.Linear(cfg.ffn_dim, cfg.dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))

    def forward16(self, x, mp: MixedPrecision):
        """The activation before the down projection (fused with the residual)."""
        return mp.r(F.gelu(mp.linear(x, self.up), approximate="tanh"))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))

    def forward16(self, x, mp: MixedPrecision):
        return mp.r(F.silu(mp.linear(x, self.gate)) * mp.linear(x, self.up))


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.kind == "gpt":
        return nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
    return RMSNorm(cfg.dim, cfg.norm_eps)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        gpt = cfg.kind == "gpt"
        self.norm1 = make_norm(cfg)
        self.attn = GPTAttention(cfg) if gpt else LlamaAttention(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp = GeluMLP(cfg) if gpt else SwiGLU(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward16(self, x, mp: MixedPrecision):
        x = mp.linear(self.attn.forward16(mp.norm(x, self.norm1), mp), self.attn.out, res=x)
        return mp.linear(self.mlp.forward16(mp.norm(x, self.norm2), mp), self.mlp.down, res=x)


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tokens = nn.Parameter(torch.empty(cfg.vocab, cfg.dim))
        self.positions = nn.Parameter(torch.empty(cfg.seq, cfg.dim)) if cfg.kind == "gpt" else None

    def forward(self, idx):
        x = F.embedding(idx, self.tokens)
        if self.positions is not None:
            x = x + self.positions[: idx.shape[1]]
        return x

    def forward16(self, idx, mp: MixedPrecision):
        x = F.embedding(idx, mp.w(self.tokens))
        if self.positions is not None:
            x = x + mp.w(self.positions)[: idx.shape[1]]
        return mp.r(x)


class Transformer(nn.Module):
    """Module attribute names are chosen so that named_parameters() yields
    exactly the ztrain checkpoint names."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.final_norm = make_norm(cfg)
        self.head = None if cfg.tied else nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        x = self.final_norm(x)
        return self.head(x) if self.head is not None else x @ self.embed.tokens.t()

    def forward16(self, idx, mp: MixedPrecision):
        """The logits (16-bit values in a float32 tensor) under ztrain's
        16-bit policy: see "Mixed precision" above."""
        x = self.embed.forward16(idx, mp)
        for block in self.blocks:
            x = block.forward16(x, mp)
        x = mp.norm(x, self.final_norm)
        head = self.head.weight if self.head is not None else self.embed.tokens
        return mp.r(mp.mm(x, mp.w(head)))


def build_model(model_plan: dict) -> Transformer:
    return Transformer(ModelConfig.from_plan(model_plan))


def init_weights(model: nn.Module, std: float = 0.02, seed: int = 0) -> None:
    """Random init for benchmarks and self-tests: matrices ~ N(0, std),
    norm scales 1, biases 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:
                p.zero_()
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, RMSNorm)):
                m.weight.fill_(1.0)


def name_mismatches(model: nn.Module, tensors: Dict[str, np.ndarray]) -> list:
    """Every way in which a checkpoint tensor set differs from the model's
    parameters (missing, unexpected, wrong shape); empty if they agree."""
    params = dict(model.named_parameters())
    problems = [f"missing from checkpoint: {n}" for n in params if n not in tensors]
    problems += [f"not a model parameter: {n}" for n in tensors if n not in params]
    problems += [
        f"shape of {n}: checkpoint {list(tensors[n].shape)}, model {list(p.shape)}"
        for n, p in params.items()
        if n in tensors and tuple(tensors[n].shape) != tuple(p.shape)
    ]
    return problems


def load_weights(model: nn.Module, tensors: Dict[str, np.ndarray]) -> None:
    problems = name_mismatches(model, tensors)
    if problems:
        raise ValueError("checkpoint does not match the model:\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(tensors[name]))


# --------------------------------------------------------------------------
# Data


class TokenData:
    """A ztrain token file, read in ztrain's unshuffled sample order."""

    def __init__(self, path: str, dtype: str, seq: int):
        with open(path, "rb") as f:
            head = f.read(TOKEN_HEADER.size)
        if head[:8] == TOKEN_MAGIC:
            if len(head) < TOKEN_HEADER.size:
                raise ValueError(f"{path}: truncated header")
            _, version, token_bytes, count, _vocab, _ = TOKEN_HEADER.unpack(head)
            if version != 1:
                raise ValueError(f"{path}: token file version {version}, expected 1")
            offset = TOKEN_HEADER.size
        else:
            token_bytes = {"u16": 2, "u32": 4}[dtype]
            offset, count = 0, None
        np_dtype = {2: "<u2", 4: "<u4"}.get(token_bytes)
        if np_dtype is None:
            raise ValueError(f"{path}: token_bytes {token_bytes}, expected 2 or 4")
        tokens = np.memmap(path, dtype=np_dtype, mode="r", offset=offset)
        if count is not None:
            if count > tokens.shape[0]:
                raise ValueError(f"{path}: header says {count} tokens, file holds {tokens.shape[0]}")
            tokens = tokens[:count]
        self.tokens = tokens
        self.seq = seq
        self.samples = (tokens.shape[0] - 1) // seq
        if self.samples < 1:
            raise ValueError(f"{path}: {tokens.shape[0]} tokens is less than one sample of {seq}")

    def sample(self, i: int) -> np.ndarray:
        """Sample i as seq+1 tokens: inputs are [:-1], targets [1:]."""
        start = i * self.seq
        return np.asarray(self.tokens[start : start + self.seq + 1], dtype=np.int64)

    def micro_batches(self, step: int, global_batch: int, micro_batch: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Global batch `step`, as consecutive micro-batches of inputs, targets [B, T]."""
        ids = [(step * global_batch + j) % self.samples for j in range(global_batch)]
        for a in range(0, global_batch, micro_batch):
            rows = torch.from_numpy(np.stack([self.sample(i) for i in ids[a : a + micro_batch]]))
            yield rows[:, :-1], rows[:, 1:]


# --------------------------------------------------------------------------
# Training


def lr_at(lr_plan: dict, step: int) -> float:
    """Learning rate of optimizer step `step` (0-based)."""
    if lr_plan["kind"] == "constant":
        return float(lr_plan["value"])
    if lr_plan["kind"] == "deepspeed":  # DeepSpeed's schedules: ds_lr.py, beside this file
        import os, sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from ds_lr import lr_at as ds_lr_at
        return ds_lr_at(lr_plan, step)
    if lr_plan["kind"] != "cosine":
        raise ValueError(f"unknown lr schedule {lr_plan['kind']!r}")
    peak, final = float(lr_plan["peak"]), float(lr_plan["final"])
    warmup, decay = int(lr_plan["warmup"]), int(lr_plan["decay_steps"])
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, decay - warmup))
    return final + 0.5 * (peak - final) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, train_plan: dict) -> torch.optim.AdamW:
    # Weight decay only for matrices (and embeddings); norms and biases are exempt.
    params = list(model.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    b1, b2 = train_plan["betas"]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": float(train_plan["weight_decay"])},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=0.0,  # set per step from the schedule
        betas=(float(b1), float(b2)),
        eps=float(train_plan["eps"]),
    )


def load_optimizer_state(opt: torch.optim.AdamW, model: nn.Module, ckpt: Checkpoint) -> None:
    """Resume AdamW moments from a checkpoint taken after ckpt.step steps."""
    if ckpt.exp_avg is None or ckpt.exp_avg_sq is None:
        raise ValueError(f"checkpoint at step {ckpt.step} has no /optim state to resume from")
    for group_name, tensors in (("exp_avg", ckpt.exp_avg), ("exp_avg_sq", ckpt.exp_avg_sq)):
        problems = name_mismatches(model, tensors)
        if problems:
            raise ValueError(f"/optim/{group_name} does not match the model:\n  " + "\n  ".join(problems))
    for name, p in model.named_parameters():
        opt.state[p] = {
            "step": torch.tensor(float(ckpt.step - ckpt.skipped)),
            "exp_avg": torch.from_numpy(ckpt.exp_avg[name].copy()),
            "exp_avg_sq": torch.from_numpy(ckpt.exp_avg_sq[name].copy()),
        }


class LossScaler:
    """train.loss_scale: a static scale (a number in the plan), or DeepSpeed's
    DynamicLossScaler (a table), with the update rule of its update_scale as
    ztrain's src/train/scaler.c has it. `state` is a checkpoint's
    state.loss_scaler, to go on from."""

    def __init__(self, spec=None, state: Optional[dict] = None):
        self.dynamic = isinstance(spec, dict)
        if not self.dynamic:
            self.scale = 1.0 if spec is None else float(spec)
            return
        self.window = int(spec["loss_scale_window"])
        self.hysteresis = int(spec["hysteresis"])
        self.min_scale = float(spec["min_loss_scale"])
        self.consecutive = bool(spec["consecutive_hysteresis"])
        if state is not None:
            self.scale, self.iter = float(state["scale"]), int(state["iter"])
            self.last_overflow, self.left = int(state["last_overflow_iter"]), int(state["hysteresis"])
        else:
            self.scale, self.iter = 2.0 ** int(spec["initial_scale_power"]), 0
            self.last_overflow, self.left = -1, self.hysteresis

    def update(self, overflow: bool) -> None:
        if not self.dynamic:
            return
        if overflow:
            if self.hysteresis == 1 or self.left <= 1:
                self.scale = max(self.scale / 2, self.min_scale)
            else:
                self.left -= 1
            self.last_overflow = self.iter
        else:
            if self.consecutive:
                self.left = self.hysteresis
            if (self.iter - self.last_overflow) % self.window == 0:
                if not self.consecutive:
                    self.left = self.hysteresis
                self.scale *= 2
        self.iter += 1


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    # With a loss scaler: the scale the step ran with, and whether its
    # update was skipped (overflow or a non-finite loss).
    loss_scale: float = 1.0
    skipped: bool = False


def train_step(model: Transformer, opt: torch.optim.AdamW, data: TokenData, train_plan: dict, step: int,
               skipped: int = 0, mp: Optional[MixedPrecision] = None,
               scaler: Optional[LossScaler] = None) -> StepResult:
    """Optimizer step `step` (0-based, the global batch) exactly as ztrain does it,
    after `skipped` skipped steps (the LR schedule counts applied updates).
    mp: the 16-bit policy (None: fp32). scaler: loss scaling and ztrain's
    skip of a step whose gradients or loss are not finite (the caller counts
    a skipped step into `skipped` for the next ones); None: neither."""
    G, B = int(train_plan["global_batch"]), int(train_plan["micro_batch"])
    if G % B:
        raise ValueError(f"global_batch {G} is not a multiple of micro_batch {B}")
    # Normalising every micro-batch by the global token count makes the
    # accumulated gradient that of the mean loss over the whole global batch.
    norm = 1.0 / (G * data.seq)
    scale = 1.0 if scaler is None else scaler.scale
    batches = data.micro_batches(step, G, B)
    if mp is not None:
        mp.grad_max = 0.0
        if mp.reverse_micro_batches:
            batches = reversed(list(batches))
    loss_total = 0.0
    for inputs, targets in batches:
        logits = model(inputs) if mp is None else model.forward16(inputs, mp)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") * norm
        (loss if scale == 1.0 else loss * scale).backward()
        loss_total += loss.item()

    params = [p for p in model.parameters() if p.grad is not None]
    if scaler is not None:
        # ztrain's test: the global sum of squares (in double) of the
        # scaled gradients is not finite
        sumsq = sum(p.grad.double().pow(2).sum().item() for p in params)
        overflow = not math.isfinite(sumsq)
        scaler.update(overflow)
        if overflow or not math.isfinite(loss_total):
            opt.zero_grad(set_to_none=True)
            # the LR reported is the next applied update's, as ztrain's
            return StepResult(loss_total, math.sqrt(sumsq) / scale, lr_at(train_plan["lr"], step - skipped),
                              scale, True)
        if scale != 1.0:
            for p in params:
                p.grad.div_(scale)  # exact for a power of two
    clip = float(train_plan.get("clip") or 0.0)
    # clip_grad_norm_ defines the reported norm; with max_norm = inf its
    # scale factor clamps to exactly 1.0, i.e. no clipping.
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf).item()

    lr = lr_at(train_plan["lr"], step - skipped)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    opt.zero_grad(set_to_none=True)
    return StepResult(loss_total, grad_norm, lr, scale)
