"""Hugging Face transformers against ztrain, for tests/cli/hf.sh. Runs in
the venv of tests/ref/venv.sh (transformers from PyPI on Debian's torch).

  hf_check.py logits CKPT DIR TOKENS STEP GB   compare logits and loss
      of batch STEP: transformers' from_pretrained(DIR) against ztorch.py's
      model loaded from the ztrain checkpoint CKPT (proven equal to
      ztrain by the other tests); prints HF's mean loss on the batch.
  hf_check.py random KIND DIR SEED TOKENS STEP GB   a random
      GPT2LMHeadModel or LlamaForCausalLM (every weight, biases and norms
      too, random), saved with save_pretrained as safetensors (llama in
      shards of 50 KB, with model.safetensors.index.json); prints its
      mean loss on batch STEP (as `loss` does).
  hf_check.py loss DIR TOKENS STEP GB           HF's mean loss on batch STEP.

Batch STEP is ztrain's global batch STEP with data.shuffle = false:
samples STEP*GB .. STEP*GB+GB-1 of the token file (ztorch.TokenData).
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ztorch  # noqa: E402

from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM)

torch.set_num_threads(1)


def load_hf(d):
    kind = json.load(open(os.path.join(d, "config.json")))["model_type"]
    cls = GPT2LMHeadModel if kind == "gpt2" else LlamaForCausalLM
    m = cls.from_pretrained(d, torch_dtype=torch.float32)
    m.eval()
    return m


def batch(tokens, seq, step, gb):
    data = ztorch.TokenData(tokens, "u16", seq)
    x, y = next(data.micro_batches(step, gb, gb))
    return x, y


def hf_loss(m, x, y):
    with torch.no_grad():
        logits = m(x).logits
    return logits, torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).double(), y.reshape(-1)).item()


def cmd_logits(ckpt, d, tokens, step, gb):
    ck = ztorch.read_checkpoint(ckpt)
    ref = ztorch.build_model(ck.plan["model"])
    ztorch.load_weights(ref, ck.model)
    ref.eval()
    m = load_hf(d)
    x, y = batch(tokens, ck.plan["model"]["seq"], step, gb)
    with torch.no_grad():
        want = ref(x)
    got, loss = hf_loss(m, x, y)
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    print(f"logits {tuple(got.shape)}: max |hf - ztorch| = {err:.3g}, max |logit| = {scale:.3g}")
    if not err <= 1e-5 * scale:
        sys.exit(f"FAIL: logits differ by {err:.3g}, more than 1e-5 relative to {scale:.3g}")
    print(f"hf_loss {loss:.9g}")


def cmd_random(kind, d, seed, tokens, step, gb):
    torch.manual_seed(seed)
    if kind == "gpt":
        cfg = GPT2Config(vocab_size=256, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        m = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(vocab_size=256, max_position_embeddings=16, hidden_size=32,
                          intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0)
        m = LlamaForCausalLM(cfg)
    # every tensor random, so that a bias or norm mapped wrongly shows
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.ndim == 1 else 0.02))
    # llama in shards (model.safetensors.index.json), gpt in one file
    m.save_pretrained(d, safe_serialization=True,
                      max_shard_size="50KB" if kind == "llama" else "10GB")
    m.eval()
    x, y = batch(tokens, 16, step, gb)
    print(f"hf_loss {hf_loss(m, x, y)[1]:.9g}")


def cmd_loss(d, tokens, step, gb):
    m = load_hf(d)
    seq = m.config.max_position_embeddings
    x, y = batch(tokens, seq, step, gb)
    _, loss = hf_loss(m, x, y)
    print(f"hf_loss {loss:.9g}")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "logits":
        cmd_logits(a[1], a[2], a[3], int(a[4]), int(a[5]))
    elif a[0] == "random":
        cmd_random(a[1], a[2], int(a[3]), a[4], int(a[5]), int(a[6]))
    elif a[0] == "loss":
        cmd_loss(a[1], a[2], int(a[3]), int(a[4]))
    else:
        sys.exit(__doc__)
