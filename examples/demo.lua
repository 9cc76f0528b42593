-- The demo: a small GPT-2-style model learns the generated demo corpus
-- (examples/make_demo_data.py data) in about 20 seconds on two cores.
--   build/ztrain examples/demo.lua
local zt = require "ztrain"

model = zt.gpt { vocab = 256, seq = 128, dim = 128, layers = 4, heads = 4 }

train = {
  micro_batch = 8,
  global_batch = 16,   -- 2 micro-batches of gradient accumulation
  steps = 300,
  lr = zt.lr.cosine { peak = 3e-3, warmup = 30, final = 3e-4 },
  weight_decay = 0.1,
  betas = { 0.9, 0.95 },
  clip = 1.0,
  log_every = 25,
  eval_every = 100,
}

data = {
  train = "data/demo_train.bin",
  val = "data/demo_val.bin",
  shuffle = true,
}

checkpoint = { dir = "checkpoints/demo" }
