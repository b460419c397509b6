--- perf_event.profile.aggregate: a profile's stacks, stored or counted,
-- and what reads them (not a public interface, but for the methods init.lua
-- puts in the Profile class): `keep=false`'s per-stack counts (`_count`,
-- its bounded symbol memo), and `reset`, `aggregate`, `folded`,
-- `top`, `kinds`, which the exporters read.
-- @module perf_event.profile.aggregate

local table = table
local concat, sort = table.concat, table.sort
local pairs, ipairs, setmetatable, require = pairs, ipairs, setmetatable, require

local naming = require("perf_event.profile.naming")
local frame_name, folded_frame = naming.frame_name, naming.folded_frame

local M = {}
-- the Profile methods of this file (init.lua puts them in the class)
local Profile = {}
M.methods = Profile

-- a frame's text: a C frame's name, a Lua frame's name with the sampled
-- line (`lines`) or the line that defines the function
local function frame_text(f, lines)
  if f.c then return f.c end
  return frame_name(f.lua, lines and f.line or nil)
end

local info_ids, next_info_id = setmetatable({}, { __mode = "k" }), 0

local ckeys = setmetatable({}, { __mode = "k" })   -- frames -> their key, for frames counted again

-- folds one resolved sample (n of them, label lab) into self.counts: the
-- key tells apart what aggregate's options may keep apart (line, trace,
-- labels), and is cheap to build. Returns the entry, and true when it is new
function Profile:_count(frames, n, lab)
  n = n or 1
  if lab then
    -- a labelled sample's entry, remembered by frames and label
    local byf = self._ebf[frames]
    local e = byf and byf[lab]
    if e then e.count = e.count + n return e end
  end
  local k = ckeys[frames]
  local kk
  if k then
    kk = lab and k .. "|" .. lab.id or k
    local e = self.counts[kk]
    if e and not lab then e.count = e.count + n return e end
    if e then
      local byf = self._ebf[frames]
      if not byf then byf = {} self._ebf[frames] = byf end
      byf[lab] = e
      e.count = e.count + n
      return e
    end
  else
    local parts = {}
    for i = 1, #frames do
      local f = frames[i]
      if f.c then
        parts[i] = f.c
      else
        local id = info_ids[f.lua]
        if not id then next_info_id = next_info_id + 1; id = next_info_id; info_ids[f.lua] = id end
        parts[i] = (f.caller and "@" or "") .. id .. ":" .. (f.line or "") .. ":" .. (f.trace or "")
      end
    end
    k = concat(parts, ";", 1, #frames) .. "/" .. (frames.nleaf or "")
    ckeys[frames] = k
  end
  kk = kk or (lab and k .. "|" .. lab.id or k)
  local e = self.counts[kk]
  if e then e.count = e.count + n return e end
  e = { frames = frames, count = n, labels = lab, base = k, ck = kk }
  self.counts[kk] = e
  self.nstacks = self.nstacks + 1
  if lab then
    local byf = self._ebf[frames]
    if not byf then byf = {} self._ebf[frames] = byf end
    byf[lab] = e
  end
  return e, true
end

-- an aggregated profile sees the same C addresses again and again (a
-- lookup costs 3-6 us): its symbols answer through a bounded memo, made
-- anew when the maps are reread
function Profile:_memo_sym()
  local raw = self.sym_raw or self.sym
  self.sym_raw = raw
  local memo, n = {}, 0
  return {
    load_maps = function(_, pid) return raw:load_maps(pid) end,
    lookup = function(_, ip, pid)
      local e = memo[ip]
      if not e then
        if n >= 4096 then memo, n = {}, 0 end
        e = { raw:lookup(ip, pid) }
        memo[ip], n = e, n + 1
      end
      return e[1], e[2], e[3], e[4], e[5]
    end,
  }
end

-- calls fn(frames, count, label) for every stored stack: the samples, or
-- the per-stack counts of an aggregated profile (label: see labels.lua,
-- or nil)
local function each_stack(self, fn)
  if self.keep == false then
    for _, e in pairs(self.counts) do fn(e.frames, e.count, e.labels) end
  else
    local labs = self.labels or {}
    for i, frames in ipairs(self.samples) do fn(frames, 1, labs[i]) end
  end
end
M.each_stack = each_stack

--- Forgets the stored stacks (the samples, or the per-stack counts), so
-- that the next read covers what is sampled from now on; `nsamples` and
-- `lost` keep counting. @treturn table the profile
function Profile:reset()
  self.samples = {}
  if self.labels then self.labels = {} end
  if self._pend then self._pend, self._npend = {}, 0 end
  if self.keep == false then
    self.counts, self.nstacks = {}, 0
    self._ebf = setmetatable({}, { __mode = "k" })
  end
  return self
end

--- The samples grouped by stack, most first: the form the exporters
-- (folded text, pprof, speedscope) read.
-- @tparam[opt] table opts `lines=false` merges the lines of a function;
--   `traces=true` keeps stacks through different traces apart; `reset=true`
--   forgets the stored stacks once read (`p:reset()`); `labels=true` keeps
--   stacks of different labels apart, each entry with its `labels`
--   (`{vmstate=, route=}`: see `vmstates`; route when the request gave one)
-- @treturn table array of `{frames=, count=, key=}` (key: the folded text, each frame's name
--   with ";" made ":" and control characters spaces); `frames` is root first, each
--   frame either `{lua=info, line=n, trace=N}` (info: `name`, `chunk`,
--   `linedefined`, `lastlinedefined`) or `{c=name, addr=ip, module=path}`
--   (addr and module when known)
function Profile:aggregate(opts)
  opts = opts or {}
  local lines, labels = opts.lines ~= false, opts.labels
  local by, out = {}, {}
  each_stack(self, function(frames, count, lab)
    local parts = {}
    for i, f in ipairs(frames) do
      local t = frame_text(f, lines)
      if opts.traces and f.trace then t = t .. " [trace " .. f.trace .. "]" end
      parts[i] = folded_frame(t)   -- the key is the folded text: no ";" or newline in a frame
    end
    local k = concat(parts, ";")
    local bk = labels and lab and k .. "\0" .. (lab.vmstate or "") .. "\0" .. (lab.route or "") or k
    local e = by[bk]
    if not e then
      e = { frames = frames, count = 0, key = k, labels = labels and lab or nil }
      by[bk] = e
      out[#out + 1] = e
    end
    e.count = e.count + count
  end)
  if opts.reset then self:reset() end
  sort(out, function(a, b) if a.count ~= b.count then return a.count > b.count end return a.key < b.key end)
  return out
end

--- Folded stacks, root first, one "a;b;c N" line per distinct stack,
-- sorted by count (most first).
-- @tparam[opt] table opts `lines=false` names Lua frames by the line that
--   defines the function instead of the sampled line; `traces=true`
--   appends `[trace N]` to frames attributed through a trace; `reset=true`
--   as in aggregate
-- @treturn string
function Profile:folded(opts)
  local out = {}
  for i, e in ipairs(self:aggregate(opts)) do out[i] = e.key .. " " .. e.count end
  return concat(out, "\n") .. (#out > 0 and "\n" or "")
end

--- The hottest functions: each sample counts for its innermost Lua
-- function (C leaves under a known Lua caller count for the caller), or
-- for its C leaf when no Lua frame is known.
-- @tparam[opt] number n how many (all)
-- @tparam[opt] table opts `by="leaf"` counts the leaf frame instead;
--   `lines=true` keeps the sampled line in the name; `reset=true` as in
--   aggregate
-- @treturn table array of `{name=, count=, share=}` (share in percent),
--   most first
function Profile:top(n, opts)
  opts = opts or {}
  local counts, total = {}, 0
  each_stack(self, function(frames, count)
    local f = frames[#frames]
    if opts.by ~= "leaf" then
      for i = #frames, 1, -1 do if frames[i].lua then f = frames[i] break end end
    end
    local k = frame_text(f, opts.lines)
    counts[k] = (counts[k] or 0) + count
    total = total + count
  end)
  if opts.reset then self:reset() end
  local out = {}
  for k, c in pairs(counts) do out[#out + 1] = { name = k, count = c, share = 100 * c / total } end
  sort(out, function(a, b) if a.count ~= b.count then return a.count > b.count end return a.name < b.name end)
  if n and #out > n then for i = #out, n + 1, -1 do out[i] = nil end end
  return out
end

--- How many samples went each way: `trace`, `interp` (PC register),
-- `caller` (C leaf under a trace found on the stack), `c` (C leaf alone).
function Profile:kinds()
  local k = { trace = 0, interp = 0, caller = 0, c = 0 }
  each_stack(self, function(frames, count)
    local f = frames[#frames - (frames.nleaf or #frames) + 1]
    if f.trace and not f.caller then k.trace = k.trace + count
    elseif f.caller then k.caller = k.caller + count
    elseif f.lua then k.interp = k.interp + count
    else k.c = k.c + count end
  end)
  return k
end

return M
