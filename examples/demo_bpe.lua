-- The demo on subword tokens: demo.lua's model and run, on the demo corpus
-- cut by a BPE vocabulary of 512 trained on it (SentencePiece):
--   build/ztrain tokenize data/demo.txt data/bpe_train.bin --val data/bpe_val.bin --train-vocab 512
--   build/ztrain examples/demo_bpe.lua --save bpe.h5
--   build/ztrain sample examples/demo_bpe.lua --load bpe.h5 --prompt 'Ada sees'
-- The run records data.tokenizer, so sample and the Hugging Face export use it.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
dofile(here .. "demo.lua")

model.vocab = 512
data = {
  train = "data/bpe_train.bin",
  val = "data/bpe_val.bin",
  tokenizer = "data/tokenizer.model",
  shuffle = true,
}
checkpoint = { dir = "checkpoints/demo_bpe" }
