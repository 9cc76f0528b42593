-- ztrain_schedule: the built-in pipeline schedules, written with the same
-- interface a user's own schedule has: a function
--   (stage, stages, microbatches, chunks) -> list of actions
-- where an action is {op = "F" | "B" | "W", mb = i, chunk = c} (0-based).
-- F is a micro-batch's forward through this stage's chunk c, B its
-- backward (with W: the input-gradient part only), W the weight-gradient
-- part of backward. Chunk c of stage s is virtual stage c * stages + s
-- (Megatron's interleaving). The C side checks every list and simulates
-- them together before anything runs (parallel/schedule.c).
local K = require "ztrain_check"
local _ENV = K.env -- the standard globals as they were before the script ran
local S = {}

local function act(list, op, mb, chunk)
  list[#list + 1] = { op = op, mb = mb, chunk = chunk or 0 }
end

-- costs = {F = ..., B = ..., W = ...}: relative times of the actions for
-- the simulation (and the zero-bubble planner), each finite and > 0
local cost = K.real(0, true)
local costs_spec = { F = { cost, default = 1.0 }, B = { cost, default = 1.0 }, W = { cost, default = 1.0 } }
local function costs_value(where)
  return function(v)
    local c, msg = K.check(v, costs_spec, where .. ".costs")
    if not c then return nil, nil, msg end
    return c
  end
end

-- The keys each builder takes.
local function spec_of(name)
  local where = "zt.schedule." .. name
  local spec = {
    chunks = { K.integer(1, K.INT_MAX), default = name == "interleaved" and 2 or 1 },
    costs = { costs_value(where) },
  }
  if name == "zero_bubble" then spec.max_deferred_w = { K.integer(0, K.INT_MAX) } end
  if name == "custom" then
    spec.fn = { function(v)
      if type(v) ~= "function" then return nil, "a function (stage, stages, microbatches, chunks) -> actions" end
      return v
    end, required = true }
    spec.name = { function(v)
      if type(v) ~= "string" or #v < 1 or #v > 31 then return nil, "a string of 1 to 31 characters" end
      return v
    end, default = "custom" }
  end
  return spec, where
end

-- A schedule object: the function plus what the C side needs to know.
local mt = { __name = "ztrain.schedule" }
local function make(name, fn, c, extra)
  local s = { name = name, fn = fn, chunks = c.chunks, costs = c.costs }
  for k, v in pairs(extra or {}) do s[k] = v end
  return setmetatable(s, mt)
end
S.mt = mt

-- The builder's checked arguments; an error points at the user's call.
local function args(name, t)
  local spec, where = spec_of(name)
  return K.checked(t == nil and {} or t, spec, where)
end

-- What C reads of a schedule object, checked again (a script may have
-- changed its fields since it was built): plain values, or nil and the
-- message.
function S._resolve(s)
  local name = rawget(s, "name")
  if type(name) ~= "string" or #name < 1 or #name > 31 then
    return nil, "schedule.name must be a string of 1 to 31 characters, got " .. K.describe(name)
  end
  local fn = rawget(s, "fn")
  if type(fn) ~= "function" then
    return nil, string.format("schedule %s: fn must be a function, got %s", name, K.describe(fn))
  end
  local chunks, what = K.integer(1, K.INT_MAX)(rawget(s, "chunks"))
  if not chunks then
    return nil, string.format("schedule %s: chunks must be %s, got %s", name, what,
                              K.describe(rawget(s, "chunks")))
  end
  local costs, msg
  if rawget(s, "costs") ~= nil then
    costs, msg = K.check(rawget(s, "costs"), costs_spec, "schedule " .. name .. ": costs")
    if not costs then return nil, msg end
  end
  return { name = name, fn = fn, chunks = chunks, costs = costs,
           min_multiple = rawget(s, "min_multiple") and true or false }
end

--- GPipe: every forward, then every backward (activations of all m
--- micro-batches live at once).
function S.gpipe(t)
  local s = make("gpipe", function(stage, stages, m)
    local l = {}
    for mb = 0, m - 1 do act(l, "F", mb) end
    for mb = 0, m - 1 do act(l, "B", mb) end
    return l
  end, args("gpipe", t))
  return s
end

--- 1F1B (PipeDream-Flush): stages - stage - 1 warm-up forwards, then one
--- forward and one backward in turn, then the remaining backwards; at most
--- `stages` micro-batches in flight.
function S.one_f_one_b(t)
  local s = make("one_f_one_b", function(stage, stages, m)
    local l = {}
    local warm = math.min(stages - stage - 1, m)
    for mb = 0, warm - 1 do act(l, "F", mb) end
    local f, b = warm, 0
    while f < m do
      act(l, "F", f); f = f + 1
      act(l, "B", b); b = b + 1
    end
    while b < m do act(l, "B", b); b = b + 1 end
    return l
  end, args("one_f_one_b", t))
  return s
end

--- Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): each rank holds
--- `chunks` model chunks; micro-batches go through in groups of `stages`.
--- Needs microbatches to be a multiple of stages.
function S.interleaved(t)
  local s = make("interleaved", function(stage, stages, m, v)
    local l = {}
    local total = m * v
    -- k-th forward (backward) of this stage: which chunk, which micro-batch
    local function fwd(k)
      local group, r = k // (stages * v), k % (stages * v)
      return group * stages + r % stages, r // stages
    end
    local function bwd(k)
      local mb, c = fwd(k)
      return mb, v - 1 - c
    end
    local warm = math.min((stages - stage - 1) * 2 + (v - 1) * stages, total)
    local f, b = 0, 0
    for _ = 1, warm do local mb, c = fwd(f); act(l, "F", mb, c); f = f + 1 end
    while f < total do
      local mb, c = fwd(f); act(l, "F", mb, c); f = f + 1
      mb, c = bwd(b); act(l, "B", mb, c); b = b + 1
    end
    while b < total do local mb, c = bwd(b); act(l, "B", mb, c); b = b + 1 end
    return l
  end, args("interleaved", t), { min_multiple = true })
  return s
end

-- Greedy list scheduling of all stages at once, with the costs the C
-- check will use: whenever a stage is free it runs, in this order of
-- preference, a B whose input has arrived, an F (if fewer than `limit(s)`
-- micro-batches hold activations on it and the input has arrived), or a
-- pending W. Returns each stage's list in execution order.
local function greedy(stages, m, cost, limit, wlag)
  local last = stages - 1
  local st = {}
  for s = 0, last do st[s] = { free = 0, nf = 0, nb = 0, nw = 0, held = 0, list = {} } end
  local fdone, bdone, ends = {}, {}, {}
  for s = 0, last do fdone[s], bdone[s] = {}, {} end
  local now, left = 0, 3 * m * stages
  while left > 0 do
    for s = 0, last do
      local x = st[s]
      if x.free <= now then
        local op, mb
        local bin = x.nb < x.nf and (s == last and fdone[s][x.nb] or bdone[s + 1] and bdone[s + 1][x.nb])
        if x.nb - x.nw > wlag(s) then
          op, mb = "W", x.nw -- too many W's held back: memory first
        elseif bin and bin <= now then
          op, mb = "B", x.nb
        elseif x.nf < m and x.held < limit(s) and (s == 0 or (fdone[s - 1][x.nf] or math.huge) <= now) then
          op, mb = "F", x.nf
        elseif x.nw < x.nb then
          op, mb = "W", x.nw
        end
        if op then
          local t1 = now + cost[op]
          act(x.list, op, mb)
          x.free, left = t1, left - 1
          ends[#ends + 1] = t1
          if op == "F" then fdone[s][mb], x.nf, x.held = t1, x.nf + 1, x.held + 1
          elseif op == "B" then bdone[s][mb], x.nb, x.held = t1, x.nb + 1, x.held - 1
          else x.nw = x.nw + 1 end
        end
      end
    end
    local nxt = math.huge
    for s = 0, last do if st[s].free > now then nxt = math.min(nxt, st[s].free) end end
    for _, t in ipairs(ends) do if t > now and t < nxt then nxt = t end end
    if nxt == math.huge then break end
    now = nxt
  end
  local out = {}
  for s = 0, last do out[s] = st[s].list end
  return out
end

--- Zero bubble (Qi et al. 2023): backward split into B (input gradient, on
--- the critical path) and W (weight gradient, which can wait), scheduled
--- greedily B first, then F (at most stages - stage micro-batches between
--- their F and B, as in 1F1B), then W. W's fill the waits of warm-up and
--- cool-down; `max_deferred_w` (default stages - stage) bounds how many a
--- stage holds back, and with it the activations kept alive until their W:
--- at most stages - stage + max_deferred_w micro-batches. With
--- max_deferred_w = microbatches the bubble reaches ZB-H1's
--- (p-1)(F+B-W) bound.
function S.zero_bubble(t)
  local c = args("zero_bubble", t)
  local costs, defer = c.costs or { F = 1, B = 1, W = 1 }, c.max_deferred_w
  local cache = {}
  local s = make("zero_bubble", function(stage, stages, m)
    local k = stages .. ":" .. m
    if not cache[k] then
      cache[k] = greedy(stages, m, costs, function(st) return stages - st end,
                        function(st) return defer or (stages - st) end)
    end
    return cache[k][stage]
  end, c)
  return s
end

--- A user's function with a name, chunks and costs, as a schedule object.
function S.custom(t)
  local c = args("custom", t)
  local s = make(c.name, c.fn, c)
  return s
end

return S
