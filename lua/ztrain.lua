-- ztrain: the library a run script gets with `local zt = require "ztrain"`.
-- It builds model descriptions (zt.gpt, zt.llama) and LR schedules
-- (zt.lr.*), and checks the script's global tables (model, parallel, train,
-- data, checkpoint) before C reads them: unknown keys, wrong types and
-- missing values are reported here, with the nearest known key.
local M = {}

-- Levenshtein distance, for "did you mean" suggestions.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

local function nearest(key, known)
  local best, bestd
  for _, k in ipairs(known) do
    -- a shortened key ("bucket" for "bucket_bytes") counts as a near miss
    local d = (#key >= 3 and k:sub(1, #key) == key) and 1 or distance(key, k)
    if not bestd or d < bestd then best, bestd = k, d end
  end
  if best and bestd <= math.max(2, #key // 3) then return best end
end

local function unknown_key_message(where, key, spec)
  local known = sorted_keys(spec)
  local near = type(key) == "string" and nearest(key, known)
  if near then
    return string.format("%s: unknown key '%s' (did you mean '%s'?)", where, tostring(key), near)
  end
  return string.format("%s: unknown key '%s'; known keys: %s", where, tostring(key),
                       table.concat(known, ", "))
end

-- Value checkers: return the normalised value or nil plus what was expected.
local function integer(min)
  return function(v)
    if math.type(v) == "float" and v == math.floor(v) then v = math.tointeger(v) end
    local what = min and ("an integer >= " .. min) or "an integer"
    if math.type(v) ~= "integer" or (min and v < min) then return nil, what end
    return v
  end
end
local function number(positive)
  return function(v)
    if type(v) ~= "number" then return nil, "a number" end
    if positive and not (v > 0) then return nil, "a number > 0" end
    return v + 0.0
  end
end
local function nonneg(v)
  if type(v) ~= "number" or v < 0 then return nil, "a number >= 0" end
  return v + 0.0
end
local function boolean(v)
  if type(v) ~= "boolean" then return nil, "true or false" end
  return v
end
local function str(v)
  if type(v) ~= "string" then return nil, "a string" end
  return v
end
local function oneof(...)
  local choices = { ... }
  return function(v)
    for _, c in ipairs(choices) do if v == c then return v end end
    local quoted = {}
    for i, c in ipairs(choices) do quoted[i] = string.format("%q", c) end
    return nil, "one of " .. table.concat(quoted, ", ")
  end
end

local function describe(v)
  if type(v) == "string" then return string.format("%q", v) end
  return tostring(v) .. " (" .. type(v) .. ")"
end

-- Checks table t against spec {key = {check, default, required}}; level is
-- the error level that points at the user's line (0 for none).
local function check(t, spec, where, level)
  if type(t) ~= "table" then
    error(string.format("%s must be a table, got %s", where, type(t)), level)
  end
  for k in pairs(t) do
    if spec[k] == nil then error(unknown_key_message(where, k, spec), level) end
  end
  local out = {}
  for k, s in pairs(spec) do
    local v = t[k]
    if v == nil and s.required then
      error(string.format("%s: missing required key '%s'", where, k), level)
    end
    if v == nil then v = s.default end -- defaults go through the checker too
    if v ~= nil then
      local ok, expected = s[1](v)
      if ok == nil then
        error(string.format("%s.%s must be %s, got %s", where, k, expected, describe(v)), level)
      end
      out[k] = ok
    end
  end
  return out
end

local model_mt = { __name = "ztrain.model" }

M.schedule = require "ztrain_schedule"

local common_model = {
  vocab = { integer(1), required = true },
  seq = { integer(1), required = true },
  dim = { integer(1), required = true },
  layers = { integer(1), required = true },
  heads = { integer(1), required = true },
}

local function with(base, extra)
  local t = {}
  for k, v in pairs(base) do t[k] = v end
  for k, v in pairs(extra) do t[k] = v end
  return t
end

--- GPT-2: LayerNorm, learned positions, GELU MLP of width 4*dim, biases,
--- head tied to the token embedding unless tied = false.
function M.gpt(t)
  local c = check(t, with(common_model, { tied = { boolean, default = true } }), "zt.gpt", 2)
  c.kind, c.kv_heads, c.ffn_dim, c.norm_eps, c.rope_theta = "gpt", c.heads, 4 * c.dim, 1e-5, 0.0
  return setmetatable(c, model_mt)
end

--- LLaMA: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, no
--- biases, untied head. ffn_dim defaults to LLaMA's rule: 2/3 of 4*dim,
--- rounded up to a multiple of 256.
function M.llama(t)
  local c = check(t, with(common_model, {
    kv_heads = { integer(1) },
    ffn_dim = { integer(1) },
    norm_eps = { number(true), default = 1e-5 },
    rope_theta = { number(true), default = 10000.0 },
  }), "zt.llama", 2)
  c.kind, c.tied = "llama", false
  c.kv_heads = c.kv_heads or c.heads
  c.ffn_dim = c.ffn_dim or 256 * ((8 * c.dim // 3 + 255) // 256)
  return setmetatable(c, model_mt)
end

M.lr = {}
local lr_mt = { __name = "ztrain.lr" }

--- Linear warmup to `peak` over `warmup` steps, then cosine decay to
--- `final` at `decay_steps` (default: train.steps).
function M.lr.cosine(t)
  local c = check(t, {
    peak = { number(true), required = true },
    warmup = { integer(0), default = 0 },
    final = { nonneg, default = 0.0 },
    decay_steps = { integer(1) },
  }, "zt.lr.cosine", 2)
  c.kind = "cosine"
  return setmetatable(c, lr_mt)
end

--- A constant learning rate (the same as a plain number).
function M.lr.constant(t)
  local c = check(t, { value = { number(true), required = true } }, "zt.lr.constant", 2)
  c.kind = "constant"
  return setmetatable(c, lr_mt)
end

local function lr_value(v)
  if type(v) == "number" then
    if not (v > 0) then return nil, "a number > 0 or zt.lr.cosine{...}" end
    return setmetatable({ kind = "constant", value = v + 0.0 }, lr_mt)
  end
  if getmetatable(v) == lr_mt then return v end
  return nil, "a number or a schedule from zt.lr (zt.lr.cosine{...})"
end

local function betas(v)
  if type(v) ~= "table" or #v ~= 2 or type(v[1]) ~= "number" or type(v[2]) ~= "number"
      or not (v[1] >= 0 and v[1] < 1 and v[2] >= 0 and v[2] < 1) then
    return nil, "a pair {beta1, beta2} with both in [0, 1)"
  end
  return { v[1] + 0.0, v[2] + 0.0 }
end

local function dp_value(v)
  if v == "auto" then return v end
  return integer(1)(v)
end

-- parallel.zero: a stage number, or a table with the stage and its knobs
local zero_spec = {
  stage = { integer(0), default = 0 },
  bucket_bytes = { integer(1), default = 25 * 2 ^ 20 // 1 },
  overlap = { boolean, default = true },
}
local function zero_value(v)
  if math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v)) then
    v = { stage = math.tointeger(v) }
  end
  if type(v) ~= "table" then return nil, "a stage 0..3 or {stage = ..., bucket_bytes = ..., overlap = ...}" end
  local res = check(v, zero_spec, "parallel.zero", 0)
  if res.stage > 3 then return nil, "a stage 0, 1, 2 or 3 (got " .. res.stage .. ")" end
  return res
end

local specs = {
  parallel = {
    dp = { dp_value, default = "auto" },
    tp = { integer(1), default = 1 },
    pp = { integer(1), default = 1 },
    zero = { zero_value, default = 0 },
    order = { oneof("tp-dp-pp"), default = "tp-dp-pp" },
    timeout = { number(true), default = 1800.0 },
    sequence_parallel = { boolean, default = false },
    stages = { function(v)
      if type(v) ~= "table" then return nil, "a list of {first, last} block ranges" end
      for i, r in ipairs(v) do
        if type(r) ~= "table" or math.type(r[1]) ~= "integer" or math.type(r[2]) ~= "integer" then
          return nil, string.format("a list of {first, last} block ranges (entry %d is not)", i)
        end
      end
      return v
    end },
  },
  train = {
    micro_batch = { integer(1), default = 1 },
    global_batch = { integer(1) }, -- default: micro_batch * dp
    steps = { integer(0), required = true },
    lr = { lr_value, default = 3e-4 },
    weight_decay = { nonneg, default = 0.01 },
    betas = { betas, default = { 0.9, 0.999 } },
    eps = { number(true), default = 1e-8 },
    clip = { nonneg, default = 1.0 },
    seed = { integer(0), default = 1234 },
    log_every = { integer(0), default = 10 },
    eval_every = { integer(0), default = 0 },
    peak_gflops = { nonneg, default = 0.0 },
  },
  data = {
    train = { str, required = true },
    val = { str },
    dtype = { oneof("u16", "u32"), default = "u16" },
    shuffle = { boolean, default = true },
    val_batches = { integer(1), default = 4 },
  },
  checkpoint = {
    dir = { str, default = "checkpoints" },
    every = { integer(0), default = 0 },
    keep = { integer(1), default = 3 },
    async = { boolean, default = false },
  },
}

local optional = { parallel = true, checkpoint = true }
local globals = { "model", "parallel", "train", "data", "checkpoint", "schedule" }

-- Forward FLOPs per token of one block and of the head (backward costs
-- about twice either, so the ratio is what matters): the block's matmuls
-- (qkv, attention output, MLP) and attention scores and values over the
-- sequence; the head's logits. The embedding is a lookup: no compute.
local function costs(m)
  local C, hd = m.dim, m.dim // m.heads
  local qkv = (m.heads + 2 * m.kv_heads) * hd
  local mlp = m.kind == "llama" and 3 * m.ffn_dim or 2 * m.ffn_dim
  return 2 * C * (qkv + C + mlp) + 4 * m.seq * C, 2 * C * m.vocab
end

-- Contiguous split of `layers` blocks over V stages, each at least one
-- block, stage V also carrying `head` (in blocks): the largest stage cost
-- as small as it can be, and then, stage by stage from the first, each as
-- light as that allows (the first stage holds the embedding's parameters).
local function balanced(layers, V, head)
  local function cost(i, k) return k + (i == V and head or 0) end
  -- best[i][j]: the least largest cost of blocks j.. over stages i..V
  local best = {}
  for i = V, 1, -1 do
    best[i] = {}
    for j = 0, layers - 1 do
      local left = layers - j
      if i == V then
        best[i][j] = cost(i, left)
      else
        local b = math.huge
        for k = 1, left - (V - i) do b = math.min(b, math.max(cost(i, k), best[i + 1][j + k])) end
        best[i][j] = b
      end
    end
  end
  local size, j, target = {}, 0, best[1][0] + 1e-9
  for i = 1, V - 1 do
    local k = 1
    while math.max(cost(i, k), best[i + 1][j + k]) > target do k = k + 1 end
    size[i], j = k, j + k
  end
  size[V] = layers - j
  return size
end

-- Blocks of each virtual stage (pp * chunks of them, in pipeline order):
-- the user's list, checked to be an ordered cover of all blocks, or a
-- split balanced by compute (`balanced`: the last stage's head counts as
-- the blocks it costs); with interleaving an even split, which it needs.
local function partition(fail, model, pp, chunks, explicit)
  local layers = model.layers
  local V = pp * chunks
  local out = {}
  if explicit then
    if #explicit ~= V then
      fail(string.format("parallel.stages has %d entries; pp * chunks = %d * %d = %d stages need one each",
                         #explicit, pp, chunks, V))
    end
    local nxt = 0
    for i, r in ipairs(explicit) do
      local first, last = r[1], r[2]
      if last < first then
        fail(string.format("parallel.stages[%d] = {%d, %d} is empty: every stage needs at least one block",
                           i, first, last))
      end
      if first ~= nxt then
        fail(string.format("parallel.stages[%d] starts at block %d but block %d comes next: the stages "
                           .. "must cover blocks 0..%d in order, each once", i, first, nxt, layers - 1))
      end
      out[i] = { first, last }
      nxt = last + 1
    end
    if nxt ~= layers then
      fail(string.format("parallel.stages ends at block %d but the model has blocks 0..%d: every block "
                         .. "must be in a stage", nxt - 1, layers - 1))
    end
    return out
  end
  if layers < V then
    fail(string.format("parallel.pp = %d%s needs %d blocks but the model has %d; use pp <= %d%s",
                       pp, chunks > 1 and string.format(" with %d chunks", chunks) or "", V, layers,
                       layers // chunks,
                       chunks > 1 and string.format(" or chunks <= %d", layers // pp) or ""))
  end
  if chunks > 1 and layers % V ~= 0 then
    fail(string.format("interleaving %d chunks on %d stages needs layers divisible by %d; %d is not "
                       .. "(blocks per stage would be %.2f)", chunks, pp, V, layers, layers / V))
  end
  local size = {}
  if chunks > 1 then
    for i = 1, V do size[i] = layers // V end
  else
    local block, head = costs(model)
    size = balanced(layers, V, head / block)
  end
  local first = 0
  for i = 1, V do out[i] = { first, first + size[i] - 1 }; first = first + size[i] end
  return out
end

-- Called by C after the script and every -e statement have run: returns
-- the checked, normalised plan or raises an error naming what is wrong.
function M._plan(script)
  local function fail(msg) error(script .. ": " .. msg, 0) end
  local function guarded(f, ...)
    local ok, res = pcall(f, ...)
    if not ok then fail(res) end
    return res
  end
  for k, v in pairs(_G) do
    if type(k) == "string" and type(v) == "table" and package.loaded[k] == nil
        and not specs[k] and k ~= "model" then
      -- a typo of a table the script then lacks; a helper table whose name
      -- happens to be close to one it has is fine
      local near = nearest(k, globals)
      if near and (_G[near] == nil or next(_G[near]) == nil) then
        fail(string.format("unknown global table '%s' (did you mean '%s'?)", k, near))
      end
    end
  end
  if _G.model == nil then
    fail("no model: set `model = zt.gpt{...}` or `model = zt.llama{...}`")
  end
  if getmetatable(_G.model) ~= model_mt then
    fail("model must be built with zt.gpt{...} or zt.llama{...}")
  end
  local plan = { model = _G.model }
  local sched = _G.schedule
  if type(sched) == "function" then sched = M.schedule.custom { fn = sched } end
  if sched ~= nil and getmetatable(sched) ~= M.schedule.mt then
    fail("schedule must be zt.schedule.NAME{...} or a function (stage, stages, microbatches, chunks)")
  end
  for name, spec in pairs(specs) do
    local t = _G[name]
    if t == nil then
      if not optional[name] then fail(string.format("no '%s' table: it is required", name)) end
      t = {}
    end
    plan[name] = guarded(check, t, spec, name, 0)
  end
  plan.schedule = sched or M.schedule.one_f_one_b {}
  local chunks = plan.schedule.chunks
  if math.type(chunks) ~= "integer" or chunks < 1 then
    fail("schedule chunks must be an integer >= 1, got " .. tostring(chunks))
  end
  plan.parallel.stages = partition(fail, plan.model, plan.parallel.pp, chunks,
                                   plan.parallel.stages)
  local lr = plan.train.lr
  if lr.kind == "cosine" then
    lr.decay_steps = lr.decay_steps or math.max(plan.train.steps, 1)
  end
  return plan
end

-- Called by C once the number of micro-batches per step is known: each
-- stage's action list from the schedule's function, checked for shape;
-- the C side checks the lists against each other.
function M._schedule_lists(sched, stages, microbatches)
  local lists = {}
  for st = 0, stages - 1 do
    local ok, l = pcall(sched.fn, st, stages, microbatches, sched.chunks)
    if not ok then error(string.format("schedule %s, stage %d: %s", sched.name, st, l), 0) end
    if type(l) ~= "table" then
      error(string.format("schedule %s returned %s for stage %d, not a list of actions",
                          sched.name, type(l), st), 0)
    end
    for i, a in ipairs(l) do
      if type(a) ~= "table" or (a.op ~= "F" and a.op ~= "B" and a.op ~= "W")
          or math.type(a.mb) ~= "integer" or (a.chunk ~= nil and math.type(a.chunk) ~= "integer") then
        error(string.format("schedule %s, stage %d, step %d: an action is {op = \"F\"|\"B\"|\"W\", "
                            .. "mb = integer, chunk = integer}", sched.name, st, i - 1), 0)
      end
    end
    lists[st + 1] = l
  end
  return lists
end

return M
