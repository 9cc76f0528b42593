-- The demo: a small GPT-2-style model learns the generated demo corpus
-- (examples/make_demo_data.py data) in 300 steps (timings: README.md).
--   build/ztrain examples/demo.lua
--   mpirun -np 2 build/ztrain examples/demo.lua   (or -np 4, with --oversubscribe
--   on two cores; as root see README.md)
local zt = require "ztrain"

model = zt.gpt { vocab = 256, seq = 128, dim = 128, layers = 4, heads = 4 }

train = {
  micro_batch = 4,
  global_batch = 16,   -- 4 micro-batches of accumulation on one process, 2 at
                       -- mpirun -np 2, 1 at -np 4: the same batch at 1, 2 and 4 ranks
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
