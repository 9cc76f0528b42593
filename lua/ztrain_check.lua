-- ztrain_check: what the ztrain library's builders and its check of the
-- script's tables share (internal, not for scripts): value checkers that
-- say what they expected, table checks with "did you mean", and values
-- printed the way a person reads them (numbers in full, tables by their
-- contents, never a Lua address).

-- The library runs in an environment of its own, a copy of the standard
-- globals as they were when it loaded (before the script): a script may
-- well name its own globals `type`, `table` or `string`.
local G = _G
local pristine = {}
for k, v in G.pairs(G) do pristine[k] = v end
for _, lib in G.ipairs { "string", "math", "table", "debug" } do
  local copy = {}
  for k, v in G.pairs(G[lib]) do copy[k] = v end
  pristine[lib] = copy
end
local _ENV = pristine

local C = { env = pristine }

-- Where the user's code called into the library: the innermost function
-- on the stack, from `level` up (1: the caller of user_where), that is
-- neither the library's (its chunks are named "[ztrain]/...", also when
-- loaded from ZTRAIN_LUA_PATH) nor C (pcall, a metamethod's caller); "file:
-- line: " or "" when the library was called from C alone. Walked rather
-- than a fixed error() level, which names pcall or one of the library's
-- own lines when the call comes by another way.
function C.user_where(level)
  for l = (level or 1) + 1, math.huge do
    local info = debug.getinfo(l, "Sl")
    if not info then return "" end
    if info.what ~= "C" and info.currentline > 0 and info.source:sub(1, 10) ~= "=[ztrain]/" then
      return info.short_src .. ":" .. info.currentline .. ": "
    end
  end
end

-- error() at the user's line (user_where), for a message in their terms.
function C.raise(msg) error(C.user_where(2) .. msg, 0) end

C.INT_MAX = 2147483647                 -- most keys end up in a C int
C.FLT_MIN = 1.1754943508222875e-38     -- the smallest normal C float
C.FLT_MAX = 3.4028234663852886e38

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

-- keys of any types in a stable order (a message must not depend on
-- hashing); raw, so that a script's metamethods cannot fail in here
local function sorted_keys(t)
  local ks = {}
  for k in next, t do ks[#ks + 1] = k end
  table.sort(ks, function(a, b)
    if type(a) == type(b) and (type(a) == "string" or type(a) == "number") then return a < b end
    return type(a) < type(b)
  end)
  return ks
end
C.sorted_keys = sorted_keys

function C.nearest(key, known)
  local best, bestd
  for _, k in ipairs(known) do
    -- a shortened key ("bucket" for "bucket_bytes") counts as a near miss
    local d = (#key >= 3 and k:sub(1, #key) == key) and 1 or distance(key, k)
    if not bestd or d < bestd then best, bestd = k, d end
  end
  if best and bestd <= math.max(2, #key // 3) then return best end
end

-- A number as the user would write it: integers and integral floats in
-- full, other floats with the digits that give back the same value.
function C.number_text(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if math.type(v) == "integer" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 2 ^ 63 then return string.format("%.0f", v) end
  local s = string.format("%.14g", v)
  if tonumber(s) ~= v then s = string.format("%.17g", v) end
  return s
end

local describe

-- Objects the builders made (zt.gpt{...}, zt.lr.cosine{...}) show as the
-- call that made them; they register a function giving their fields here.
local objects = setmetatable({}, { __mode = "k" })
function C.register(obj, where, fields) objects[obj] = { where = where, fields = fields } end

local function table_text(t, depth)
  if depth > 2 then return "{...}" end
  local parts, n, seq = {}, 0, rawlen(t)
  for i = 1, seq do
    n = n + 1
    if n > 6 then parts[#parts + 1] = "..."; return "{" .. table.concat(parts, ", ") .. "}" end
    parts[#parts + 1] = describe(rawget(t, i), depth + 1)
  end
  for _, k in ipairs(sorted_keys(t)) do
    if not (math.type(k) == "integer" and k >= 1 and k <= seq) then
      n = n + 1
      if n > 6 then parts[#parts + 1] = "..."; break end
      local key = (type(k) == "string" and k:match("^[%a_][%w_]*$")) and k or "[" .. describe(k, depth + 1) .. "]"
      parts[#parts + 1] = key .. " = " .. describe(rawget(t, k), depth + 1)
    end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- A value for a message: what it is, never where it lives in memory.
function describe(v, depth)
  depth = depth or 0
  local tv = type(v)
  if tv == "string" then
    if #v > 60 then v = v:sub(1, 57) .. "..." end
    return string.format("%q", v)
  elseif tv == "number" then
    return C.number_text(v)
  elseif tv == "nil" or tv == "boolean" then
    return tostring(v)
  elseif tv == "table" then
    local o = objects[v]
    if o then return o.where .. table_text(o.fields(), depth) end
    return table_text(v, depth)
  end
  return "a " .. tv
end
C.describe = describe

function C.unknown_key_message(where, key, spec)
  local known = sorted_keys(spec)
  local near = type(key) == "string" and C.nearest(key, known)
  local shown = type(key) == "string" and key or describe(key)
  if near then
    return string.format("%s: unknown key '%s' (did you mean '%s'?)", where, shown, near)
  end
  return string.format("%s: unknown key '%s'; known keys: %s", where, shown, table.concat(known, ", "))
end

-- Value checkers: return the normalised value, or nil plus what was
-- expected (and, from a checker of a nested table, the whole message).

-- An integer in [min, max] (max: the C type it is stored in; default
-- int64, Lua's own). Integral floats count (32.0), fractions do not.
function C.integer(min, max)
  max = max or math.maxinteger
  local what = max == math.maxinteger and ("an integer >= " .. min)
               or string.format("an integer from %d to %d", min, max)
  local wide = string.format("an integer from %d to %d", min, max)
  return function(v)
    if type(v) ~= "number" then return nil, what end
    local i = math.tointeger(v)
    if i == nil and v == math.floor(v) and v == v then return nil, wide end -- integral, beyond int64
    if i == nil then return nil, what end
    if i < min then return nil, what end
    if i > max then return nil, wide end
    return i
  end
end

-- A finite number; `low` with `open` (> low) or not (>= low); with
-- `float`, one a C float holds without becoming 0 or infinity.
function C.real(low, open, float)
  local what = string.format("a finite number %s %s", open and ">" or ">=", C.number_text(low))
  if float then what = "a number from 1.2e-38 to 3.4e38 (a C float)" end
  return function(v)
    if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then return nil, what end
    if open and not (v > low) or not open and not (v >= low) then return nil, what end
    if float and (v < C.FLT_MIN or v > C.FLT_MAX) then return nil, what end
    return v + 0.0
  end
end

function C.boolean(v)
  if type(v) ~= "boolean" then return nil, "true or false" end
  return v
end

function C.str(v)
  if type(v) ~= "string" then return nil, "a string" end
  return v
end

function C.oneof(...)
  local choices = { ... }
  local quoted = {}
  for i, c in ipairs(choices) do quoted[i] = string.format("%q", c) end
  return function(v)
    for _, c in ipairs(choices) do if v == c then return v end end
    return nil, "one of " .. table.concat(quoted, ", ")
  end
end

-- One key's value against its spec entry {checker, default=, required=}:
-- the normalised value, or nil and the message.
function C.value(where, k, s, v)
  if v == nil then
    if s.required then return nil, string.format("%s: missing required key '%s'", where, k) end
    v = s.default -- defaults go through the checker too
    if v == nil then return nil end
  end
  local ok, expected, msg = s[1](v)
  if ok == nil then
    return nil, msg or string.format("%s.%s must be %s, got %s", where, k, expected, describe(v))
  end
  return ok
end

-- Table t against spec {key = {checker, default=, required=}}: a new
-- table of normalised values, or nil and the message.
function C.check(t, spec, where)
  if type(t) ~= "table" then
    return nil, string.format("%s must be a table, got %s", where, describe(t))
  end
  for _, k in ipairs(sorted_keys(t)) do
    if spec[k] == nil then return nil, C.unknown_key_message(where, k, spec) end
  end
  local out = {}
  for _, k in ipairs(sorted_keys(spec)) do
    local v, msg = C.value(where, k, spec[k], t[k])
    if msg then return nil, msg end
    out[k] = v
  end
  return out
end

-- C.check that raises at the user's line.
function C.checked(t, spec, where)
  local out, msg = C.check(t, spec, where)
  if not out then C.raise(msg) end
  return out
end

return C
