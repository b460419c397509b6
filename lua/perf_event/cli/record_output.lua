--- perf_event.cli.record_output: where `luaperf record`'s samples go:
-- folded stacks (the default), perf.data (perf_event.perfdata), pprof or
-- speedscope (perf_event.pprof's recorder): and the closing accounts:
-- the samples the kernel dropped, written as such in every format.
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.record_output

local io, string, table, math, os = io, string, table, math, os
local ipairs, tonumber, tostring = ipairs, tonumber, tostring
local format, concat = string.format, table.concat
local rename = os.rename

local C = require("perf_event.cli.common")
local exit_code = C.exit_code

local M = {}

--- Aggregates samples into folded stacks.
-- @tparam table sym a perf_event.symbols symbolizer
-- @treturn table with `add(rec)`, `lines()` and `samples`
function M.folder(sym, opts)
  opts = opts or {}
  local counts, order, fold = {}, {}, require("perf_event.profile.naming").folded_frame
  local f = { samples = 0 }
  local comm_of = { [0] = "swapper" }   -- the idle task, as perf names it
  local function comm(pid)
    local c = (sym.comms and sym.comms[pid]) or comm_of[pid]
    if not c then
      local h = io.open("/proc/" .. tostring(pid) .. "/comm", "r")
      c = h and h:read("*l")
      if h then h:close() end
      -- gone already: a child that forked without exec has its parent's name
      local parent = sym.parents and sym.parents[pid]
      if not c and parent and parent ~= pid then c = comm(parent) end
      c = c or tostring(pid)
      comm_of[pid] = c
    end
    return c
  end
  -- root: the event's name, first in the stack (record with several -e)
  function f.add(rec, root)
    local frames = rec.frames   -- named already (record --lua -p)
    if not frames and rec.callchain and #rec.callchain > 0 then
      frames = sym:callchain(rec.callchain, rec.pid)
    elseif not frames then
      frames = { sym:name(rec.ip, rec.pid) }
    end
    local parts = { root }
    if opts.comm ~= false then parts[#parts + 1] = comm(rec.pid) end
    for i = #frames, 1, -1 do parts[#parts + 1] = fold(frames[i]) end   -- no ";" or newline in a frame
    local key = concat(parts, ";")
    if not counts[key] then counts[key] = 0; order[#order + 1] = key end
    counts[key] = counts[key] + 1
    f.samples = f.samples + 1
  end
  function f.lines()
    local keys = {}
    for i, k in ipairs(order) do keys[i] = k end
    table.sort(keys)
    local out = {}
    for i, k in ipairs(keys) do out[i] = format("%s %d", k, counts[k]) end
    return out
  end
  f.counts = counts
  return f
end
--- Writes s to out and closes it (stdout: flushes it); a full disk or
-- /dev/full shows at the write or at the close.
-- @treturn boolean|nil true, or nil, msg
function M.write_out(out, s)
  local ok, err = out:write(s)
  if out == io.stdout then
    if ok then ok, err = out:flush() end
  else
    local cok, cerr = out:close()
    if ok and not cok then ok, err = cok, cerr end
  end
  if not ok then return nil, tostring(err) end
  return true
end

--- perf.data (-o FILE.data): the file created with one attr per event
-- (an existing non-empty FILE kept as FILE.old, as perf does).  Sets `s.pdata`.
-- @treturn nil|number an exit code when it failed (the events are closed)
function M.perfdata(s, argv)
  local pid, tgid, wide, path, to_data, per, evs, child = s.pid, s.tgid, s.wide, s.path, s.to_data, s.per, s.evs,
    s.child
  local err
  local pdata
  if to_data then
    local argv0 = { "luaperf", "record" }
    for _, a in ipairs(argv) do argv0[#argv0 + 1] = a end
    -- as perf: an existing, non-empty FILE is kept as FILE.old
    do
      local f = io.open(path, "rb")
      local size = f and f:seek("end")
      if f then f:close() end
      if size and size > 0 then rename(path, path .. ".old") end
    end
    local attrs = {}
    for i, e in ipairs(per) do attrs[i] = { ev = e.evs[1], evs = e.evs, name = e.name } end
    pdata, err = require("perf_event.perfdata").create(path, attrs,
                                                       { cmdline = argv0, pid = pid or tgid,
                                                         all = wide or nil })
    if not pdata then
      for _, e in ipairs(evs) do e:close() end
      if child then child:kill(9) end   -- still waiting to exec: never ran
      io.stderr:write("luaperf record: ", tostring(err), "\n")
      return 1
    end
  end
  s.pdata = pdata
end

--- The sinks of the samples: the symbolizer (with the target's maps), the
-- folded stacks, the pprof/speedscope collector, and for `--lua -p` the
-- target's perf_event.luamap file.  Sets `s.sym`, `s.folder`, `s.collector`,
-- `s.lmap`, `s.nlua` (samples in Lua code), `s.t_start`.
function M.sinks(s, luamap)
  local o, c, pid, tgid, per, specs, multi, period, as_profile = s.o, s.c, s.pid, s.tgid, s.per, s.specs, s.multi,
    s.period, s.as_profile
  local sym = require("perf_event.symbols").new()
  if pid or tgid then sym:load_maps(pid or tgid) end
  local folder = M.folder(sym)
  -- --pprof / --speedscope: the samples with their addresses and mappings
  local names = {}
  for i, e in ipairs(per) do names[i] = e.name end
  local collector = as_profile and require("perf_event.pprof").recorder(sym, {
    event = specs[1].name, events = multi and names or nil, period = period,
    comm = function(p) return sym.comms and sym.comms[p] end })
  local t_start = c.now()
  local lmap, nlua = o.lua and luamap(pid), 0
  if lmap and not lmap:refresh().found then
    io.stderr:write(format("luaperf record: %s does not exist: process %d was not started with "
      .. "perf_event.luamap (luajit -l perf_event.luamap, or require it), so its Lua code is not named; "
      .. "C frames only\n", lmap.path, pid))
  elseif lmap and lmap.stale then
    io.stderr:write(format("luaperf record: %s was left by an earlier process %d: not used; C frames only\n",
                           lmap.path, pid))
  end
  s.sym, s.folder, s.collector, s.lmap, s.nlua, s.t_start = sym, folder, collector, lmap, nlua, t_start
end

-- the lost samples of each event (its LOST records or its read_format LOST
-- count, the larger) into per[i].lost, the events closed; the total, and
-- the closing line's per-event part
local function count_lost(s)
  local per, pdata, evs, multi = s.per, s.pdata, s.evs, s.multi
  -- lost: what the LOST and LOST_SAMPLES records said, or the events'
  -- own count of dropped samples (read_format LOST), whichever is more
  -- (each event's own: its LOST_SAMPLES record carries its id)
  local lost = 0
  for i, e in ipairs(per) do
    local lost_records, lost_read = 0, 0
    for _, ev in ipairs(e.evs) do
      lost_records = lost_records + (tonumber((ev:lost())) or 0)
      local v = ev:read_raw()
      lost_read = lost_read + (tonumber(v and v.lost) or 0)
    end
    e.lost = math.max(lost_records, lost_read)
    lost = lost + e.lost
    if pdata and lost_read > 0 then pdata:lost_samples(lost_read, i) end
  end
  for _, ev in ipairs(evs) do ev:close() end
  -- several events: the closing line gives each one's samples and lost
  local each = ""
  if multi then
    local parts = {}
    for i, e in ipairs(per) do parts[i] = format("%s: %d samples, %d lost", e.name, e.samples, e.lost) end
    each = " (" .. concat(parts, "; ") .. ")"
  end
  return lost, each
end

local function write_perfdata(s, lost, each)
  local pdata, path, child, status, code = s.pdata, s.path, s.child, s.status, s.code
  local ok, werr = pdata:close()
  if not ok then
    io.stderr:write(format("luaperf record: failed to write perf data to %s: %s\n", path, tostring(werr)))
    return 1
  end
  io.stderr:write(format("[ luaperf record: %d samples written to %s (perf.data); %d lost%s ]\n",
                         pdata.samples, path, lost, each))
  if child and (status == "exited" or status == "signaled") then return exit_code(status, code) end
  return 0
end

local function write_profile(s, lost, each)
  local collector, per, multi, c, t_start, o = s.collector, s.per, s.multi, s.c, s.t_start, s.o
  local as_profile, out, path, child, status, code = s.as_profile, s.out, s.path, s.child, s.status, s.code
  local t = collector.table()
  t.duration_nanos = (c.now() - t_start) * 1e9
  -- the lost samples: a stack of one frame '[lost]' (its count, its
  -- share at the mean period) and a comment, as '[lost] N' in folded
  -- (several events: one such stack per event, its value at its index)
  if multi then
    for i, e in ipairs(per) do
      if e.lost > 0 then
        local values = {}
        for j = 1, #per do values[j] = 0 end
        values[i] = math.floor(e.lost * (tonumber(t.period) or 1))
        t.samples[#t.samples + 1] = { frames = { { name = "[lost]" } }, values = values }
        t.comments[#t.comments + 1] = format("%s: %d samples lost", e.name, e.lost)
      end
    end
  elseif lost > 0 then
    t.samples[#t.samples + 1] = { frames = { { name = "[lost]" } },
                                  values = { lost, math.floor(lost * (tonumber(t.period) or 1)) } }
    t.comments[#t.comments + 1] = format("%d samples lost", lost)
  end
  local bytes
  if as_profile == "pprof" then bytes = require("perf_event.pprof").encode(t)
  else
    local name = #o.cmd > 0 and concat(o.cmd, " ") or "luaperf record"
    local values
    if multi then
      values = {}
      for i = 1, #per do values[i] = i end
    end
    bytes = require("perf_event.speedscope").encode(t, { name = name, values = values })
  end
  local ok, werr = M.write_out(out, bytes)
  if not ok then
    io.stderr:write(format("luaperf record: failed to write %s: %s\n", path == "-" and "stdout" or path, werr))
    return 1
  end
  io.stderr:write(format("[ luaperf record: %d samples, %d stacks written to %s (%s); %d lost%s ]\n",
                         collector.samples, #t.samples, path == "-" and "stdout" or path, as_profile, lost, each))
  if child and (status == "exited" or status == "signaled") then return exit_code(status, code) end
  return 0
end

local function write_folded(s, lost, each)
  local folder, lmap, nlua, per, multi = s.folder, s.lmap, s.nlua, s.per, s.multi
  local out, path, child, status, code = s.out, s.path, s.child, s.status, s.code
  local lines = folder.lines()
  if lmap then
    io.stderr:write(format("luaperf record: %d of %d samples in Lua code (%d bytecode lines and %d traces "
                           .. "in %s)\n", nlua, folder.samples, lmap.nbc, lmap.ntraces, lmap.path))
  end
  -- the lost samples are a stack of their own, '[lost] N': a flame graph
  -- shows their share, and the file says how many there were
  if multi then
    for _, e in ipairs(per) do
      if e.lost > 0 then lines[#lines + 1] = format("%s;[lost] %d", e.name, e.lost) end
    end
  elseif lost > 0 then
    lines[#lines + 1] = format("[lost] %d", lost)
  end
  local ok, werr = M.write_out(out, #lines > 0 and concat(lines, "\n") .. "\n" or "")
  if not ok then
    io.stderr:write(format("luaperf record: failed to write %s: %s\n", path == "-" and "stdout" or path, werr))
    return 1
  end
  io.stderr:write(format("[ luaperf record: %d samples, %d stacks written to %s; %d lost%s ]\n", folder.samples,
                         #lines, path == "-" and "stdout" or path, lost, each))
  if child and (status == "exited" or status == "signaled") then return exit_code(status, code) end
  return 0
end

--- Counts the lost samples, closes the events and writes the output (a
-- closing line on stderr).
-- @treturn number the exit code: the command's, else 0 or 1
function M.finish(s)
  local lost, each = count_lost(s)
  if s.pdata then return write_perfdata(s, lost, each) end
  if s.collector then return write_profile(s, lost, each) end
  return write_folded(s, lost, each)
end

return M
