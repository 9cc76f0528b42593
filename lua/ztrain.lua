-- ztrain: the library a run script gets with `local zt = require "ztrain"`.
-- It builds model descriptions (zt.gpt, zt.llama) and LR schedules
-- (zt.lr.*), and checks the script's global tables (model, parallel, train,
-- data, checkpoint) before C reads them: unknown keys, wrong types, values
-- outside what C stores them in and missing values are reported here, in
-- the user's terms (the key, its value, what it must be), with the nearest
-- known key. Whatever a script does to these objects, a library error never
-- surfaces as an internal file:line.
local K = require "ztrain_check"
local _ENV = K.env -- the standard globals as they were before the script ran
local M = {}

local integer, real, boolean, str, oneof = K.integer, K.real, K.boolean, K.str, K.oneof
local describe, INT_MAX = K.describe, K.INT_MAX

-- Builder objects (a model, an LR schedule) are proxies: the checked
-- arguments live in `state`, reads see them with their defaults and what
-- they imply, and an assignment (`-e 'model.heads = 8'`) is checked on the
-- spot, so a bad one is reported at the user's line.
local state = setmetatable({}, { __mode = "k" })

-- The object's values: its arguments, defaults and derived values (a
-- derive function may refuse a combination and return its message).
local function resolve(p)
  local s = state[p]
  local out, msg = K.check(s.args, s.spec, s.where)
  if not out then return nil, msg end
  if s.derive then msg = s.derive(out) end
  if msg then return nil, msg end
  return out
end

local function object_mt(name)
  local mt = { __name = name }
  mt.__index = function(p, k)
    local v = resolve(p)
    return v and v[k]
  end
  mt.__newindex = function(p, k, v)
    local s = state[p]
    local spec = s.spec[k]
    if spec == nil then K.raise(K.unknown_key_message(s.where, k, s.spec)) end
    local nv, msg = K.value(s.where, k, spec, v)
    if msg then K.raise(msg) end
    local old = s.args[k]
    if v == nil then nv = nil end -- back to the default, which follows the other keys
    s.args[k] = nv
    local _, dmsg = resolve(p)
    if dmsg then
      s.args[k] = old
      K.raise(dmsg)
    end
    s.at = K.user_where() -- C's checks of the value name this line
  end
  mt.__pairs = function(p) return next, resolve(p) or {}, nil end
  return mt
end

-- A new object from the user's table t.
local function object(mt, where, spec, t, derive)
  local args = K.checked(t, spec, where)
  -- keep only what the user gave: defaults and derived values follow later changes
  for k in pairs(args) do if t[k] == nil then args[k] = nil end end
  local p = setmetatable({}, mt)
  -- at: the user's line that built it or last set one of its keys
  state[p] = { where = where, spec = spec, args = args, derive = derive, at = K.user_where() }
  K.register(p, where, function() return args end)
  local _, msg = resolve(p)
  if msg then K.raise(msg) end
  return p
end

local model_mt = object_mt("ztrain.model")

M.schedule = require "ztrain_schedule"

-- The Slurm job this run belongs to (nil outside one), for naming run
-- directories: zt.slurm.job_id stays the same when Slurm requeues the job,
-- restart_count counts the requeues. Only job-wide values: every rank
-- reads the same script and must build the same plan.
local function slurm_job()
  local id = os.getenv("SLURM_JOB_ID")
  if not id or id == "" then return nil end
  local function int(name) return math.tointeger(tonumber(os.getenv(name) or "")) end
  return { job_id = id, job_name = os.getenv("SLURM_JOB_NAME"),
           restart_count = int("SLURM_RESTART_COUNT") or 0,
           nnodes = int("SLURM_JOB_NUM_NODES") or int("SLURM_NNODES"),
           ntasks = int("SLURM_NTASKS") }
end
M.slurm = slurm_job()

local common_model = {
  vocab = { integer(1, INT_MAX), required = true },
  seq = { integer(1, INT_MAX), required = true },
  dim = { integer(1, INT_MAX), required = true },
  layers = { integer(1, INT_MAX), required = true },
  heads = { integer(1, INT_MAX), required = true },
}

local function with(base, extra)
  local t = {}
  for k, v in pairs(base) do t[k] = v end
  for k, v in pairs(extra) do t[k] = v end
  return t
end

-- The widest rows a layer has (qkv: up to 3*dim; the MLP's first layer)
-- are C ints in the model and the kernels.
local function widths_fit(where, c, mlp_rows, mlp_what)
  if 3 * c.dim > INT_MAX then
    return string.format("%s: dim = %d is too large: the fused q, k, v rows (3*dim = %d) must fit a C int "
                         .. "(at most %d)", where, c.dim, 3 * c.dim, INT_MAX)
  end
  if mlp_rows > INT_MAX then
    return string.format("%s: %s = %d is too large: it must fit a C int (at most %d)",
                         where, mlp_what, mlp_rows, INT_MAX)
  end
end

local gpt_spec = with(common_model, { tied = { boolean, default = true } })
local function gpt_derive(c)
  c.kind, c.kv_heads, c.ffn_dim, c.norm_eps, c.rope_theta = "gpt", c.heads, 4 * c.dim, 1e-5, 0.0
  return widths_fit("zt.gpt", c, c.ffn_dim, "the MLP width 4*dim")
end

--- GPT-2: LayerNorm, learned positions, GELU MLP of width 4*dim, biases,
--- head tied to the token embedding unless tied = false.
function M.gpt(t)
  local m = object(model_mt, "zt.gpt", gpt_spec, t, gpt_derive)
  return m
end

local llama_spec = with(common_model, {
  kv_heads = { integer(1, INT_MAX) },
  ffn_dim = { integer(1, INT_MAX) },
  norm_eps = { real(0, true, true), default = 1e-5 },
  rope_theta = { real(0, true, true), default = 10000.0 },
})
local function llama_derive(c)
  c.kind, c.tied = "llama", false
  c.kv_heads = c.kv_heads or c.heads
  local given = c.ffn_dim
  c.ffn_dim = c.ffn_dim or 256 * ((8 * c.dim // 3 + 255) // 256)
  return widths_fit("zt.llama", c, 2 * c.ffn_dim,
                    given and "2*ffn_dim (gate and up)" or "2*ffn_dim (gate and up; ffn_dim from dim)")
end

--- LLaMA: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, no
--- biases, untied head. ffn_dim defaults to LLaMA's rule: 2/3 of 4*dim,
--- rounded up to a multiple of 256.
function M.llama(t)
  local m = object(model_mt, "zt.llama", llama_spec, t, llama_derive)
  return m
end

M.lr = {}
local lr_mt = object_mt("ztrain.lr")

local cosine_spec = {
  peak = { real(0, true), required = true },
  warmup = { integer(0), default = 0 },
  final = { real(0, false), default = 0.0 },
  decay_steps = { integer(1) },
}

--- Linear warmup to `peak` over `warmup` steps, then cosine decay to
--- `final` at `decay_steps` (default: train.steps).
function M.lr.cosine(t)
  local s = object(lr_mt, "zt.lr.cosine", cosine_spec, t, function(c) c.kind = "cosine" end)
  return s
end

--- A constant learning rate (the same as a plain number).
function M.lr.constant(t)
  local s = object(lr_mt, "zt.lr.constant", { value = { real(0, true), required = true } }, t,
                   function(c) c.kind = "constant" end)
  return s
end

-- DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (0.16), exactly
-- (C: zt_lr_at). Each type takes only its own keys; one left out is
-- DeepSpeed's default, total_num_steps train.steps.
local ds_keys = {
  WarmupLR = { warmup_min_lr = 0.0, warmup_max_lr = 0.001 },
  WarmupDecayLR = { warmup_min_lr = 0.0, warmup_max_lr = 0.001, total_num_steps = false },
  WarmupCosineLR = { lr = false, warmup_min_ratio = 0.0, cos_min_ratio = 0.0001, total_num_steps = false },
}
local deepspeed_spec = {
  type = { oneof("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"), required = true },
  warmup_type = { oneof("log", "linear"), default = "log" },
  -- DeepSpeed runs max(2, warmup_num_steps); a negative count is a mistake
  warmup_num_steps = { integer(0, INT_MAX), default = 1000 },
  warmup_min_lr = { real(0, false) },
  warmup_max_lr = { real(0, false) },
  total_num_steps = { integer(1, INT_MAX) },
  lr = { real(0, true) }, -- WarmupCosineLR's base: the optimizer's lr
  warmup_min_ratio = { real(0, false) },
  cos_min_ratio = { real(0, false) },
}
local function deepspeed_derive(c)
  local own = ds_keys[c.type]
  for k in pairs(deepspeed_spec) do
    if c[k] ~= nil and own[k] == nil and k ~= "type" and k ~= "warmup_type" and k ~= "warmup_num_steps" then
      return string.format("zt.lr.deepspeed: %s is not a key of type \"%s\"", k, c.type)
    end
  end
  for k, d in pairs(own) do
    if c[k] == nil and d then c[k] = d end
  end
  if c.type == "WarmupCosineLR" and c.lr == nil then
    return "zt.lr.deepspeed: type \"WarmupCosineLR\" needs lr, the optimizer's learning rate its ratios scale"
  end
  c.kind = "deepspeed"
end

--- DeepSpeed's LR schedules: zt.lr.deepspeed{type = "WarmupLR" |
--- "WarmupDecayLR" | "WarmupCosineLR", ...} with DeepSpeed's parameters.
function M.lr.deepspeed(t)
  local s = object(lr_mt, "zt.lr.deepspeed", deepspeed_spec, t, deepspeed_derive)
  return s
end

-- --ds-config's "auto" learning rates: the script's train.lr, a number.
function M.lr._auto(v)
  if v == nil then return 3e-4 end -- train.lr's default
  if type(v) ~= "number" then
    K.raise("--ds-config: the scheduler's \"auto\" learning rate is the script's train.lr, which must be "
            .. "a number here, got " .. describe(v))
  end
  return v
end

local positive = real(0, true)
local function lr_value(v)
  if type(v) == "number" then
    if not positive(v) then return nil, "a finite number > 0 or zt.lr.cosine{...} / zt.lr.deepspeed{...}" end
    return { kind = "constant", value = v + 0.0 }
  end
  if getmetatable(v) == lr_mt then
    local c, msg = resolve(v)
    if not c then return nil, nil, msg end
    return c
  end
  return nil, "a number or a schedule from zt.lr (zt.lr.cosine{...}, zt.lr.deepspeed{...})"
end

local function betas(v)
  local unit = function(b) return type(b) == "number" and b >= 0 and b < 1 end -- nan fails both
  if type(v) ~= "table" or getmetatable(v) ~= nil or rawlen(v) ~= 2 or not unit(v[1]) or not unit(v[2]) then
    return nil, "a pair {beta1, beta2} with both in [0, 1)"
  end
  for k in next, v do
    if k ~= 1 and k ~= 2 then return nil, "a pair {beta1, beta2} with both in [0, 1)" end
  end
  return { v[1] + 0.0, v[2] + 0.0 }
end

local function dp_value(v)
  if v == "auto" then return v end
  local n = integer(1, INT_MAX)(v)
  if n == nil then return nil, "\"auto\" or an integer from 1 to " .. INT_MAX end
  return n
end

-- parallel.zero: a stage number, or a table with the stage and its knobs
local zero_spec = {
  stage = { integer(0, 3), default = 0 },
  bucket_bytes = { integer(1), default = 25 * 2 ^ 20 // 1 },
  overlap = { boolean, default = true },
}
local function zero_value(v)
  if type(v) == "number" then
    local stage = integer(0, 3)(v)
    if stage == nil then
      return nil, "a stage 0, 1, 2 or 3, or {stage = ..., bucket_bytes = ..., overlap = ...}"
    end
    v = { stage = stage }
  end
  if type(v) ~= "table" then return nil, "a stage 0..3 or {stage = ..., bucket_bytes = ..., overlap = ...}" end
  local res, msg = K.check(v, zero_spec, "parallel.zero")
  if not res then return nil, nil, msg end
  return res
end

-- parallel.stages: {first, last} block ranges, as C ints; a plain copy
local block = integer(0, INT_MAX)
local function stages_value(v)
  local what = "a list of {first, last} block ranges"
  if type(v) ~= "table" then return nil, what end
  local out, n = {}, rawlen(v)
  for k in next, v do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      return nil, string.format("%s (key %s is not a list index)", what, describe(k))
    end
  end
  for i = 1, n do
    local r = v[i]
    if type(r) ~= "table" or rawlen(r) ~= 2 or not block(r[1]) or not block(r[2]) then
      return nil, nil, string.format("parallel.stages must be %s, each two integers from 0 to %d; "
                                     .. "entry %d is %s", what, INT_MAX, i, describe(r))
    end
    out[i] = { block(r[1]), block(r[2]) }
  end
  return out
end

-- train.recompute: "none", "full" or a function of a block, resolved
-- per block once the pipeline's stages are known (resolve_recompute)
local function recompute_value(v)
  if v == "none" or v == "full" or type(v) == "function" then return v end
  return nil, '"none", "full" or a function(block) returning true or false'
end

-- train.loss_scale: a static scale (1: none), or dynamic loss scaling with
-- DeepSpeed's keys and defaults ("dynamic" = all defaults)
local loss_scale_spec = {
  initial_scale_power = { integer(0, 100), default = 16 },
  loss_scale_window = { integer(1, INT_MAX), default = 1000 },
  hysteresis = { integer(1, INT_MAX), default = 2 },
  min_loss_scale = { real(0, true, true), default = 1.0 },
  consecutive_hysteresis = { boolean, default = false },
}
local loss_scale_what = 'a number > 0 (a static scale), "dynamic" or {initial_scale_power = ..., '
  .. 'loss_scale_window = ..., hysteresis = ..., min_loss_scale = ..., consecutive_hysteresis = ...}'
local function loss_scale_value(v)
  if type(v) == "number" then
    local s = real(0, true, true)(v)
    if s == nil then return nil, loss_scale_what end
    return { dynamic = false, scale = s }
  end
  if v == "dynamic" then v = {} end
  if type(v) ~= "table" then return nil, loss_scale_what end
  local res, msg = K.check(v, loss_scale_spec, "train.loss_scale")
  if not res then return nil, nil, msg end
  res.dynamic = true
  return res
end

-- data.train, data.val: a path (a token file or a Megatron-LM dataset
-- prefix; globs allowed), a list of them (one stream, back to back), or a
-- blend {{weight, path-or-list}, ...}. Normalised to {blend = bool, parts =
-- {{weight = w, paths = {...}}, ...}}; C expands the globs.
local source_what = 'a path, a list of paths {"a.bin", "dir/*.bin"} or a blend {{0.7, "a"}, {0.3, "b"}}'
local function path_list(v, where)
  if type(v) == "string" then return { v } end
  if type(v) ~= "table" or rawlen(v) == 0 then
    return nil, string.format("%s must be a path or a non-empty list of paths, got %s", where, describe(v))
  end
  local out = {}
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > rawlen(v) then
      return nil, string.format("%s must be a list of paths, but has the key %s", where, describe(k))
    end
  end
  for i = 1, rawlen(v) do
    if type(v[i]) ~= "string" then
      return nil, string.format("%s[%d] must be a path string, got %s", where, i, describe(v[i]))
    end
    out[i] = v[i]
  end
  return out
end
local function data_source(key)
  local where = "data." .. key
  return function(v)
    if type(v) == "string" then return { blend = false, parts = { { weight = 1.0, paths = { v } } } } end
    if type(v) ~= "table" or rawlen(v) == 0 then return nil, source_what end
    if type(v[1]) ~= "table" then -- a list of paths
      local paths, msg = path_list(v, where)
      if not paths then return nil, nil, msg end
      return { blend = false, parts = { { weight = 1.0, paths = paths } } }
    end
    local parts, sum = {}, 0.0
    for k in pairs(v) do
      if math.type(k) ~= "integer" or k < 1 or k > rawlen(v) then
        return nil, nil, string.format("%s: a blend is a list {{weight, path}, ...}, but it has the key %s",
                                       where, describe(k))
      end
    end
    for i = 1, rawlen(v) do
      local e, at = v[i], string.format("%s[%d]", where, i)
      if type(e) ~= "table" or rawlen(e) ~= 2 or type(e[1]) ~= "number" then
        return nil, nil, string.format("%s must be {weight, path} (a blend entry), got %s", at, describe(e))
      end
      local w = e[1]
      if w ~= w or w == math.huge or w == -math.huge or w < 0 then
        return nil, nil, string.format("%s: the weight must be a finite number >= 0, got %s", at,
                                       K.number_text(w))
      end
      local paths, msg = path_list(e[2], at .. "[2]")
      if not paths then return nil, nil, msg end
      parts[i] = { weight = w + 0.0, paths = paths }
      sum = sum + w
    end
    if not (sum > 0) or sum == math.huge then
      return nil, nil, string.format("%s: the blend weights sum to %s; they must sum to a positive "
                                     .. "number (e.g. {{0.7, \"a\"}, {0.3, \"b\"}})", where, K.number_text(sum))
    end
    return { blend = true, parts = parts }
  end
end

local specs = {
  parallel = {
    dp = { dp_value, default = "auto" },
    tp = { integer(1, INT_MAX), default = 1 },
    pp = { integer(1, INT_MAX), default = 1 },
    zero = { zero_value, default = 0 },
    order = { oneof("tp-dp-pp"), default = "tp-dp-pp" },
    timeout = { real(0, true), default = 1800.0 },
    strict = { boolean, default = false },
    sequence_parallel = { boolean, default = false },
    device = { oneof("auto", "cpu", "cuda"), default = "auto" },
    stages = { stages_value },
  },
  train = {
    micro_batch = { integer(1, INT_MAX), default = 1 },
    global_batch = { integer(1, INT_MAX) }, -- default: micro_batch * dp
    steps = { integer(0), required = true },
    lr = { lr_value, default = 3e-4 },
    weight_decay = { real(0, false), default = 0.01 },
    betas = { betas, default = { 0.9, 0.999 } },
    eps = { real(0, true), default = 1e-8 },
    clip = { real(0, false), default = 1.0 },
    seed = { integer(0), default = 1234 },
    log_every = { integer(0, INT_MAX), default = 10 },
    eval_every = { integer(0, INT_MAX), default = 0 },
    peak_gflops = { real(0, false), default = 0.0 },
    max_bad_steps = { integer(1, INT_MAX), default = 5 },
    recompute = { recompute_value, default = "none" },
    loss_scale = { loss_scale_value }, -- default: "dynamic" in fp16, else 1
    precision = { oneof("fp32", "bf16", "fp16"), default = "fp32" },
    grad_reduce_dtype = { oneof("fp32", "bf16", "fp16"), default = "fp32" },
  },
  data = {
    train = { data_source("train"), required = true },
    val = { data_source("val") },
    dtype = { oneof("u16", "u32"), default = "u16" },
    shuffle = { boolean, default = true },
    val_batches = { integer(1, INT_MAX), default = 4 },
    tokenizer = { str, default = "byte" },
  },
  checkpoint = {
    dir = { str, default = "checkpoints" },
    every = { integer(0, INT_MAX), default = 0 },
    keep = { integer(1, INT_MAX), default = 3 },
    async = { boolean, default = false },
  },
}

local optional = { parallel = true, checkpoint = true }
local globals = { "model", "parallel", "train", "data", "checkpoint", "schedule", "offload" }

-- offload: a function (group) -> "device" | "cpu" | "nvme", or a table
-- {dir =, place = function}, or the sugar {dir =, master = "cpu", ...}
-- placing every group of a kind alike. C calls the function once per state
-- group at plan time (src/config/offload_plan.c) and checks its answers.
local placement = oneof("device", "cpu", "nvme")
local function policy_fn(v)
  if type(v) ~= "function" then return nil, "a function (group) returning \"device\", \"cpu\" or \"nvme\"" end
  return v
end
local offload_spec = {
  dir = { str }, place = { policy_fn },
  params = { placement }, grads = { placement }, master = { placement }, moments = { placement },
}
local function resolve_offload(fail, o)
  if o == nil then return nil end
  if type(o) == "function" then return { place = o } end
  if type(o) ~= "table" then
    fail("offload must be a function (group) returning \"device\", \"cpu\" or \"nvme\", or a table "
         .. "{dir = ..., place = function(group) ... end} or {dir = ..., master = \"cpu\", moments = ...}, got "
         .. describe(o))
  end
  local c, msg = K.check(o, offload_spec, "offload")
  if not c then fail(msg) end
  local kinds = { params = c.params, grads = c.grads, master = c.master, moments = c.moments }
  if c.place and next(kinds) then
    fail("offload: give either place = function(group) ... end or placements per kind "
         .. "(params, grads, master, moments), not both")
  end
  local place = c.place or function(group) return kinds[group.kind] or "device" end
  return { dir = c.dir, place = place }
end

-- Forward FLOPs per token of one block and of the head (backward costs
-- about twice either, so the ratio is what matters): the block's matmuls
-- (qkv, attention output, MLP) and attention scores and values over the
-- sequence; the head's logits. The embedding is a lookup: no compute.
-- In floats: the counts of a large model pass 2^63.
local function costs(m)
  local C, hd = m.dim + 0.0, m.dim // m.heads
  local qkv = (m.heads + 2 * m.kv_heads) * hd
  local mlp = m.kind == "llama" and 3 * m.ffn_dim or 2 * m.ffn_dim
  return 2 * C * (qkv + C + mlp) + 4 * m.seq * C, 2 * C * m.vocab
end

-- Contiguous split of `layers` blocks over V stages, each at least one
-- block, stage V also carrying `head` (in blocks): the largest stage cost
-- as small as it can be, and then, stage by stage from the first, each as
-- light as that allows (the first stage holds the embedding's parameters).
local function balanced(layers, V, head)
  if V == 1 then return { layers } end
  local function cost(i, k) return k + (i == V and head or 0) end
  -- best[i][j]: the least largest cost of blocks j.. over stages i..V
  local best = {}
  for i = V, 1, -1 do
    best[i] = {}
    for j = 0, layers - 1 do
      local left = layers - j
      if i == V then
        best[i][j] = cost(i, left)
      elseif left >= V - i + 1 then
        -- max(cost(i, k), best[i+1][j+k]) over k = 1 .. left-(V-i): the
        -- first term grows with k, the second does not, so the least is
        -- where they cross (a binary search, not a scan: layers may be many)
        local nxt, lo, hi = best[i + 1], 1, left - (V - i)
        while lo < hi do
          local mid = (lo + hi) // 2
          if cost(i, mid) >= nxt[j + mid] then hi = mid else lo = mid + 1 end
        end
        local b = math.max(cost(i, lo), nxt[j + lo])
        if lo > 1 then b = math.min(b, math.max(cost(i, lo - 1), nxt[j + lo - 1])) end
        best[i][j] = b
      else
        best[i][j] = math.huge -- fewer blocks than stages: never chosen
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
    local blk, head = costs(model)
    size = balanced(layers, V, head / blk)
  end
  local first = 0
  for i = 1, V do out[i] = { first, first + size[i] - 1 }; first = first + size[i] end
  return out
end

-- train.recompute as one boolean per block (a list indexed from 1 for
-- block 0). The function form is called once per block with {index (from
-- 0, as in parallel.stages), layers, stage, chunk}; what it raises is
-- reported at the user's line, what it returns must be a boolean.
local function resolve_recompute(fail, rc, layers, stages, pp)
  local out = {}
  for v, r in ipairs(stages) do
    for l = r[1], r[2] do
      local on = rc == "full"
      if type(rc) == "function" then
        local ok, res = pcall(rc, { index = l, layers = layers, stage = (v - 1) % pp,
                                    chunk = (v - 1) // pp })
        if not ok then
          fail(string.format("train.recompute failed for block %d: %s", l, tostring(res)))
        end
        if type(res) ~= "boolean" then
          fail(string.format("train.recompute must return true or false for each block; for "
                             .. "block %d it returned %s", l, describe(res)))
        end
        on = res
      end
      out[l + 1] = on
    end
  end
  return out
end

-- Called by C after the script and every -e statement have run: returns
-- the checked, normalised plan (plain tables, nothing a script can still
-- change) or raises an error naming what is wrong.
function M._plan(script)
  local function fail(msg) error(script .. ": " .. msg, 0) end
  -- A global table ztrain does not read is a misspelt one (`datta = {...}`,
  -- `chekpoint = {...}`) that would be ignored in silence, its settings
  -- never applied. A script's own tables are local; global functions,
  -- numbers and strings stay allowed, and so do the library's modules and
  -- the objects its builders make (`base = zt.gpt{...}; model = base`).
  local modules, unknown = {}, {}
  for _, v in next, package.loaded do modules[v] = true end
  for k, v in next, _G do
    if type(k) == "string" and type(v) == "table" and not modules[v] and not specs[k]
        and k ~= "model" and k ~= "schedule" and k ~= "offload" and k ~= "zt" and getmetatable(v) ~= model_mt
        and getmetatable(v) ~= lr_mt and getmetatable(v) ~= M.schedule.mt then
      unknown[#unknown + 1] = k
    end
  end
  if #unknown > 0 then
    table.sort(unknown)
    local k = unknown[1]
    local near = K.nearest(k, globals)
    fail(string.format("unknown global table '%s'%s; ztrain reads only %s; a table of your "
                       .. "own must be local (local %s = {...})%s", k,
                       near and string.format(" (did you mean '%s'?)", near) or "",
                       table.concat(globals, ", "), k,
                       #unknown > 1 and " (also unknown: " .. table.concat(unknown, ", ", 2) .. ")" or ""))
  end
  if _G.model == nil then
    fail("no model: set `model = zt.gpt{...}` or `model = zt.llama{...}`")
  end
  if getmetatable(_G.model) ~= model_mt or not state[_G.model] then
    fail("model must be built with zt.gpt{...} or zt.llama{...}, got " .. describe(_G.model))
  end
  local model, msg = resolve(_G.model)
  if not model then fail(msg) end
  model.at = state[_G.model].at -- for C's checks of the shape: the user's line
  local plan = { model = model }
  local sched = _G.schedule
  if type(sched) == "function" then sched = M.schedule.custom { fn = sched } end
  if sched ~= nil and getmetatable(sched) ~= M.schedule.mt then
    fail("schedule must be zt.schedule.NAME{...} or a function (stage, stages, microbatches, chunks), got "
         .. describe(sched))
  end
  for _, name in ipairs(K.sorted_keys(specs)) do
    local t = _G[name]
    if t == nil then
      if not optional[name] then fail(string.format("no '%s' table: it is required", name)) end
      t = {}
    end
    local c, cmsg = K.check(t, specs[name], name)
    if not c then fail(cmsg) end
    plan[name] = c
  end
  plan.offload = resolve_offload(fail, _G.offload)
  local s, smsg = M.schedule._resolve(sched or M.schedule.one_f_one_b {})
  if not s then fail(smsg) end
  plan.schedule = s
  plan.parallel.stages = partition(fail, plan.model, plan.parallel.pp, s.chunks, plan.parallel.stages)
  if plan.train.loss_scale == nil then
    plan.train.loss_scale = loss_scale_value(plan.train.precision == "fp16" and "dynamic" or 1.0)
  end
  plan.train.recompute = resolve_recompute(fail, plan.train.recompute, plan.model.layers,
                                           plan.parallel.stages, plan.parallel.pp)
  local lr = plan.train.lr
  if lr.kind == "cosine" then
    lr.decay_steps = lr.decay_steps or math.max(plan.train.steps, 1)
  elseif lr.kind == "deepspeed" then
    if lr.type ~= "WarmupLR" then lr.total_num_steps = lr.total_num_steps or math.max(plan.train.steps, 1) end
    -- DeepSpeed only warns; its WarmupCosineLR divides by total - warmup
    local w = math.max(2, lr.warmup_num_steps)
    if lr.type == "WarmupDecayLR" and lr.total_num_steps < w
        or lr.type == "WarmupCosineLR" and lr.total_num_steps <= w then
      fail(string.format("train.lr: zt.lr.deepspeed %s: total_num_steps = %d must be %s warmup_num_steps "
                         .. "(%d, at least 2 as DeepSpeed runs it)", lr.type, lr.total_num_steps,
                         lr.type == "WarmupDecayLR" and ">=" or ">", w))
    end
  end
  return plan
end

-- Called by C once the number of micro-batches per step is known: each
-- stage's action list from the schedule's function, checked for shape and
-- copied into plain tables (C reads them without running any more of the
-- script); the C side checks the lists against each other.
local action_index = integer(0, INT_MAX)
function M._schedule_lists(sched, stages, microbatches)
  local lists = {}
  for st = 0, stages - 1 do
    local ok, l = pcall(sched.fn, st, stages, microbatches, sched.chunks)
    if not ok then
      error(string.format("schedule %s, stage %d: %s", sched.name, st,
                          type(l) == "string" and l or "error value " .. describe(l)), 0)
    end
    if type(l) ~= "table" then
      error(string.format("schedule %s returned %s for stage %d, not a list of actions",
                          sched.name, describe(l), st), 0)
    end
    local out = {}
    for i = 1, rawlen(l) do
      local a = l[i]
      local op, mb, chunk
      if type(a) == "table" then
        op, mb = a.op, action_index(a.mb)
        chunk = a.chunk == nil and 0 or action_index(a.chunk)
      end
      if (op ~= "F" and op ~= "B" and op ~= "W") or not mb or not chunk then
        error(string.format("schedule %s, stage %d, step %d: an action is {op = \"F\"|\"B\"|\"W\", "
                            .. "mb = integer >= 0, chunk = integer >= 0}, got %s", sched.name, st, i - 1,
                            describe(a)), 0)
      end
      out[i] = { op = op, mb = mb, chunk = chunk }
    end
    lists[st + 1] = out
  end
  return lists
end

return M
