--- perf_event.cli.record: `luaperf record`, samples to folded stacks,
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- perf.data, pprof or speedscope; `record --lua` is in perf_event.cli.record_lua.
-- @module perf_event.cli.record

local io, string, table, math = io, string, table, math
local ipairs, pairs, tonumber, tostring, type = ipairs, pairs, tonumber, tostring, type
local format, concat = string.format, table.concat
local rename = os.rename

local C = require("perf_event.cli.common")
local pe, core = C.pe, C.core
local usage_error, parse_args, number_opt, exit_code = C.usage_error, C.parse_args, C.number_opt, C.exit_code

local M = {}

local USAGE = {
  record = [=[
usage: luaperf record [-e EVENT] [-F HZ | -c PERIOD] [-g | --call-graph fp|dwarf[,SIZE]]
                      [-p PID | -t TID | -a | -C CPUS] [-o FILE] [--folded] [-- CMD ARGS...]
                      [--pprof | --speedscope]
       luaperf record --lua [-e EVENT] [-F HZ | -c PERIOD] [-p PID] [-o FILE] [-- CMD ARGS...]

  -e, --event EVENT   what triggers a sample (default: cpu-clock); several
                      (-e A -e B, or -e A,B) are sampled side by side, each
                      kept apart in every output (below)
  -F, --freq HZ       samples per second (default 999); above the kernel's
                      perf_event_max_sample_rate lowered to it with a warning
  -c, --count PERIOD  one sample every PERIOD events instead of -F
  -g                  record call chains (frame pointers); without -g only the
                      sampled function is written
      --call-graph MODE  fp (as -g) or dwarf[,SIZE]: copy SIZE bytes (8192)
                      of user stack per sample and unwind it with the files'
                      call frame information (elfutils' libdw; code built
                      without frame pointers keeps its callers)
  -p, --pid PID       sample an existing process until it exits or Ctrl-C
                      (or as long as CMD runs)
  -t, --tid TID       sample one thread (not its children) until it exits or Ctrl-C
  -a, --all-cpus      sample every CPU (system wide) until Ctrl-C, or while CMD runs
  -C, --cpu CPUS      sample these CPUs only ('0-1,3'), system wide
  -m, --mmap-pages N  ring size per CPU: N pages (a power of two) or a size
                      (512K, 2M); default as perf's: perf_event_mlock_kb
                      (128 pages of 4 KiB; dwarf: 4 times that)
  -o, --output FILE   folded stacks go to FILE (default perf.folded; '-' = stdout);
                      a FILE ending in .data gets perf.data instead, which
                      'perf report -i FILE' and 'perf script -i FILE' read
      --folded        folded stacks even when FILE ends in .data
      --pprof         pprof's profile.proto, gzipped, to FILE (default perf.pb.gz):
                      'go tool pprof -top FILE', Pyroscope and Parca read it
      --speedscope    speedscope's JSON to FILE (default perf.speedscope.json):
                      open it at https://www.speedscope.app
      --lua           Lua frames, 'function@chunk:line' (doc/profiling.md):
                      with CMD, each Lua process of CMD profiles itself
                      (perf_event.autoprofile, loaded through LUA_INIT) and
                      its stacks, Lua callers included, are written when it
                      closes its Lua state or calls os.exit; with -p PID, a
                      LuaJIT process started with perf_event.luamap
                      (luajit -l perf_event.luamap app.lua) is sampled and
                      its JIT traces and interpreted lines are named from
                      /tmp/perf-PID.map: the Lua leaf and the C frames under
                      it, no Lua callers; folded output only (with CMD,
                      --pprof and --speedscope too)

Folded output: one line per distinct stack, root first: 'comm;main;caller;callee N';
with several events each stack is rooted at its event: 'EVENT;comm;main;... N'.
perf.data has one attr per event (its ids in each sample, as perf's); --pprof
one sample type per event, --speedscope one profile per event; the closing
line gives the samples and lost of each event.
Samples the kernel dropped (a full ring) are counted, never hidden: a
'[lost] N' line in folded output ('EVENT;[lost] N' with several events), a
LOST_SAMPLES record in perf.data ('perf report': Total Lost Samples) and
'; N lost' on the closing line.
User addresses are named from the ELF symbol tables (.symtab/.dynsym) of the
mapped files or of their separate debug files (/usr/lib/debug/.build-id,
.gnu_debuglink: install e.g. libc6-dbg), kernel ones from /proc/kallsyms; a
file's code without a symbol prints as [lib.so], others as [unknown]: one
frame per address, as perf (a stripped program: [prog];[prog];[prog]).
]=],
}

local SW = core().abi.sw
local record_lua = require("perf_event.cli.record_lua")
local record_lua_child = record_lua.record_lua_child
M.luamap = record_lua.luamap

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

local function time_of(r)
  local t = r.time
  if type(t) == "number" then return t end
  return tonumber(t) or 0
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

--- perf record's default ring: perf_event_mlock_kb (516 KiB unless
-- raised) less the user page, in pages, rounded down to a power of two
-- (128 pages of 4 KiB); `dwarf`: four times that, for the stack copies.
-- @tparam boolean dwarf
-- @treturn number data pages per ring
function M.default_pages(dwarf)
  local page = core()._private.page_size()
  local kb = pe().sysctl().mlock_kb or 516
  local n = math.floor((kb - page / 1024) * 1024 / page)
  local p = 1
  while p * 2 <= n do p = p * 2 end
  if p < 8 then p = 8 end
  return dwarf and p * 4 or p
end

--- `-m`: perf record's --mmap-pages value, a number of pages or a size
-- with a B, K, M or G suffix; rounded up to a power of two of pages (with
-- perf's warning).
-- @treturn number data pages per ring
function M.mmap_pages(v)
  local page = core()._private.page_size()
  local num, unit = tostring(v):match("^(%d+)([BbKkMmGg]?)$")
  local n = tonumber(num or "")
  if not n or n < 1 then
    usage_error("record", format("-m: a number of pages or a size (512K, 2M), got '%s'", tostring(v)))
  end
  local scale = ({ b = 1, k = 1024, m = 1024 ^ 2, g = 1024 ^ 3 })[unit:lower()]
  if scale then n = math.ceil(n * scale / page) end
  local p = 1
  while p < n do p = p * 2 end
  if p > 2 ^ 20 then usage_error("record", format("-m %s: at most 2^20 pages", tostring(v))) end
  if p ~= n then
    io.stderr:write(format("rounding mmap pages size to %d bytes (%d pages)\n", p * page, p))
  end
  return p
end

--- perf record's --call-graph value: "fp", "dwarf" or "dwarf,SIZE" (bytes
-- of user stack copied per sample; perf's default 8192, rounded up to 8,
-- at most 65528).
-- @treturn table|nil `{mode=, size=}` (nil for no value)
-- @treturn string|nil what is wrong with the value
function M.call_graph(v)
  if v == nil then return nil end
  local mode, rest = tostring(v):match("^(%a+)(.*)$")
  if mode == "fp" and rest == "" then return { mode = "fp" } end
  if mode == "dwarf" then
    if rest == "" then return { mode = "dwarf", size = 8192 } end
    local n = tonumber(rest:match("^,(%d+)$"))
    if n and n > 0 then
      n = math.ceil(n / 8) * 8
      if n <= 65528 then return { mode = "dwarf", size = n } end
    end
    return nil, format("--call-graph dwarf,SIZE: SIZE must be 1..65528 bytes, got '%s'", rest:sub(2))
  end
  return nil, format("--call-graph: 'fp' or 'dwarf[,SIZE]', got '%s'", tostring(v))
end

function M.record(argv)
  local o = parse_args("record", argv, {
    short = { e = "event", F = "freq", c = "count", g = "g", p = "pid", o = "output", h = "help",
              t = "tid", a = "all-cpus", C = "cpu", m = "mmap-pages" },
    takes = { event = true, freq = true, count = true, pid = true, output = true, tid = true, cpu = true,
              ["call-graph"] = true, ["mmap-pages"] = true },
    flags = { g = true, help = true, folded = true, ["all-cpus"] = true, pprof = true, speedscope = true,
              lua = true },
  })
  if o.help then io.stdout:write(USAGE.record) return 0 end
  if o.pprof and o.speedscope then usage_error("record", "--pprof and --speedscope exclude each other") end
  local as_profile = o.pprof and "pprof" or o.speedscope and "speedscope"
  if as_profile and o.folded then usage_error("record", "--folded and --" .. as_profile .. " exclude each other") end
  if o.lua then
    if o["all-cpus"] or o.cpu or o.tid then
      usage_error("record", "--lua profiles a command or a process (-p PID): not with -a, -C or -t")
    end
    if o.pid and (o.pprof or o.speedscope) then   -- the options of perf_event.pprof's writers
      usage_error("record", "--lua -p writes folded stacks: not with --pprof or --speedscope")
    end
    if o["call-graph"] and o["call-graph"] ~= "fp" then
      usage_error("record", "--lua names the Lua code itself: not with --call-graph " .. o["call-graph"])
    end
    if o.output and o.output:find("%.data$") and not o.folded then
      usage_error("record", "--lua writes folded stacks, not perf.data: -o " .. o.output .. " (add --folded)")
    end
  end
  if o.lua and (#o.events > 1 or tostring(o.events[1] or ""):find(",")) then
    usage_error("record", "--lua takes one -e EVENT")
  end
  if o.freq and o.count then usage_error("record", "-F and -c exclude each other") end
  local pid = o.pid and number_opt("record", o.pid, "-p PID")
  -- -t TID: one thread, no inherit; -a / -C CPUS: pid -1 on each CPU (as perf record)
  local tid = o.tid and number_opt("record", o.tid, "-t TID")
  local wide = o["all-cpus"] or o.cpu ~= nil
  local cpu_list = o.cpu and require("perf_event.pmu").parse_cpus(o.cpu)
  if cpu_list and #cpu_list == 0 then usage_error("record", "-C CPUS: no CPU in '" .. o.cpu .. "'") end
  if (pid and 1 or 0) + (tid and 1 or 0) + (wide and 1 or 0) > 1 then
    usage_error("record", "-p, -t and -a/-C exclude each other")
  end
  local tgid
  if tid then   -- the thread's process: its maps name the samples
    local f = io.open("/proc/" .. tid .. "/status", "r")
    tgid = f and tonumber(f:read("*a"):match("\nTgid:%s*(%d+)") or "")
    if f then f:close() end
  end
  if tid and not tgid then io.stderr:write("luaperf record: no thread ", tid, "\n") return 1 end
  local attach = pid or tid or wide
  if not attach and #o.cmd == 0 then
    usage_error("record", "nothing to sample: give a command after '--', -p PID, -t TID or -a")
  end
  local freq = o.freq and number_opt("record", o.freq, "-F HZ")
  local mmap_pages = o["mmap-pages"] and M.mmap_pages(o["mmap-pages"])
  local period = o.count and number_opt("record", o.count, "-c PERIOD")
  local c = core()
  local cg, cg_err = M.call_graph(o["call-graph"] or (o.g and "fp"))
  if cg_err then usage_error("record", cg_err) end
  if cg and cg.mode == "dwarf" and not c.unwind_available then
    io.stderr:write("luaperf was built without libdw: --call-graph dwarf is not available\n")
    return 1
  end
  if not period then
    -- above perf_event_max_sample_rate the kernel refuses the event: lower
    -- it, as perf does (the kernel's own limit, read now; the warning only
    -- for a rate the user asked for)
    local want = freq or 999
    local max = pe().sysctl().max_sample_rate
    if max and max > 0 and want > max then
      if freq then
        io.stderr:write(format("warning: Maximum frequency rate (%d Hz) exceeded, throttling from %d Hz to %d Hz.\n"
          .. "         The limit can be raised via /proc/sys/kernel/perf_event_max_sample_rate.\n"
          .. "         The kernel will lower it when luaperf's interrupts take too long.\n", max, freq, max))
      end
      want = max
    end
    freq = want
  end
  c.catch_signals()
  if o.lua and not pid then
    local path = o.output or as_profile == "pprof" and "perf.pb.gz"
                 or as_profile == "speedscope" and "perf.speedscope.json" or "perf.folded"
    local out, oerr = io.stdout, nil
    if path ~= "-" then out, oerr = io.open(path, "wb") end
    if not out then io.stderr:write("luaperf record: cannot write ", tostring(oerr), "\n") return 1 end
    if out ~= io.stdout then c._private.cloexec(out) end   -- not in CMD
    return record_lua_child(o, freq, period, out, path, as_profile)
  end

  -- every -e, each a list (-e A,B) as perf record takes them: each event
  -- is sampled on its own, its samples kept apart in every output
  local specs = {}
  local given = #o.events > 0 and o.events or { { type = "software", config = SW.cpu_clock, name = "cpu-clock" } }
  for _, spec in ipairs(given) do
    local list, serr = require("perf_event.stat").expand(spec, 1)
    if not list then io.stderr:write("luaperf record: ", tostring(serr), "\n") return 1 end
    for _, r in ipairs(list) do
      if r.tool or not r.attr then
        usage_error("record", format("'%s' is counted by luaperf stat, not sampled: not with record",
                                     tostring(r.name)))
      end
      specs[#specs + 1] = r
    end
  end
  local multi = #specs > 1
  local R = require("perf_event.resolve")
  -- with -c, no PERIOD: the kernel samples every event of a software event
  -- or tracepoint whose sample_type has PERIOD (perf_swevent_event), so
  -- the period would be ignored; perf leaves it out as well
  local sample_type = period and "ip|tid|time|cpu" or "ip|tid|time|period|cpu"
  if cg then sample_type = sample_type .. "|callchain" end
  if cg and cg.mode == "dwarf" then sample_type = sample_type .. "|regs_user|stack_user" end
  -- --lua -p: the interpreter's PC register and a little stack (LuaMap:frames)
  if o.lua then sample_type = sample_type .. (cg and "" or "|callchain") .. "|regs_user|stack_user" end
  -- perf.data for a .data file unless --folded (perf_event.perfdata); a
  -- tracepoint's fields go with it (RAW), as perf record samples them
  local path = o.output or (o.pprof and "perf.pb.gz") or (o.speedscope and "perf.speedscope.json") or "perf.folded"
  local to_data = path:find("%.data$") ~= nil and not o.folded and not as_profile
  -- each event's sample_type; several events: their ID in each sample and
  -- side-band record, and IDENTIFIER too when the sample_types differ, as
  -- perf 6.1 sets them (evlist__config), so perf tells the samples apart
  local sample_types, differ = {}, false
  for i, r in ipairs(specs) do
    local st = sample_type
    if to_data and tonumber(r.attr.type) == c.abi.type.tracepoint then st = st .. "|raw" end
    if multi then st = st .. "|id" end
    sample_types[i] = st
    if st ~= sample_types[1] then differ = true end
  end
  if differ then
    for i, st in ipairs(sample_types) do sample_types[i] = st .. "|identifier" end
  end

  -- the output is opened before anything runs: a bad path fails at once
  -- (perf.data: perfdata.create, below, before the command is started)
  local out, oerr = io.stdout, nil
  if path ~= "-" and not to_data then out, oerr = io.open(path, as_profile and "wb" or "w") end
  if not out then io.stderr:write("luaperf record: cannot write ", tostring(oerr), "\n") return 1 end
  if out ~= io.stdout then c._private.cloexec(out) end   -- CMD never gets luaperf's fds

  local child, err
  local target = pid or tid or -1
  if not attach then
    child, err = c.spawn(o.cmd, { stopped = true })
    if not child then io.stderr:write("luaperf record: ", err, "\n") return 127 end
    target = child:pid()
  end
  local evs = {}
  local cpus = cpu_list or require("perf_event.stat").online_cpus()
  -- -p: every thread of the process (as stat -p), each on every CPU (an
  -- inherited event is mapped per CPU); new threads are inherited.  -t: the
  -- thread; -a/-C: pid -1; a command: the child
  local tids = { target }
  if pid then
    tids = {}
    for _, name in ipairs(c.readdir("/proc/" .. pid .. "/task") or {}) do
      if name:match("^%d+$") then tids[#tids + 1] = tonumber(name) end
    end
    if #tids == 0 then io.stderr:write(format("luaperf record: no process %d\n", pid)) return 1 end
  end
  -- rings as perf sizes them: perf_event_mlock_kb less the user page, a
  -- power of two of pages (516 KiB -> 512 KiB per CPU); -m sets it.  A
  -- DWARF sample carries a stack copy (8 KiB by default): four times that
  local pages = mmap_pages or M.default_pages(cg and cg.mode == "dwarf")
  local PAGE = c._private.page_size()
  local slots = {}
  for i in ipairs(specs) do
    for _, t in ipairs(tids) do
      for _, cpu in ipairs(cpus) do slots[#slots + 1] = { tid = t, cpu = cpu, ei = i } end
    end
  end
  -- per event: its name, its events (one per thread and CPU), its counts
  local per = {}
  for i, r in ipairs(specs) do per[i] = { name = r.name, evs = {}, samples = 0, lost = 0 } end
  local ev_index = {}
  for _, slot in ipairs(slots) do
    local cpu, ei = slot.cpu, slot.ei
    local spec = specs[ei]
    local attr = {}
    for k, v in pairs(spec.attr) do attr[k] = v end
    attr.sample_type = sample_types[ei]
    if period then attr.sample_period = period
    else attr.freq = true; attr.sample_freq = freq or 999 end
    attr.disabled = child ~= nil
    attr.enable_on_exec = child ~= nil
    attr.inherit = not tid
    -- the side band (mmaps, comms, forks) from the first event only, as
    -- perf's tracking event: once, whatever the number of events
    local track = ei == 1
    attr.mmap2 = track
    attr.mmap = track
    attr.comm = track
    attr.comm_exec = track
    attr.task = track
    attr.sample_id_all = true
    -- woken when a quarter of the ring is written (perf: half, the
    -- kernel's default): the copy out (ring_take) starts early
    attr.watermark = true
    attr.read_format = "lost"   -- the samples the kernel dropped, exactly
    if cg and cg.mode == "dwarf" then
      -- the kernel's chain stops at user space; the user part is unwound
      -- from the registers and stack copy (core.unwind)
      attr.exclude_callchain_user = true
      attr.sample_regs_user = c.unwind_regs
      attr.sample_stack_user = cg.size
      -- perf.data: the non-executable mappings too (perf's mmap_data for
      -- dwarf), where .eh_frame_hdr lies: perf script unwinds with them
      if to_data and track then attr.mmap_data = true end
    end
    if o.lua then   -- user space only, as pe.profile
      attr.exclude_kernel, attr.exclude_callchain_kernel = true, true
      attr.sample_regs_user = require("perf_event.profile")._REGS_MASK
      attr.sample_stack_user = 256
    end
    -- perf's fallbacks (perf_event.resolve): user-space only on EACCES,
    -- no exclude_guest on EINVAL
    local r = { attr = attr, name = spec.name, explicit = spec.explicit, guest = spec.guest }
    local ev
    while true do
      attr.wakeup_watermark = math.floor(pages * PAGE / 4)
      ev, err = R.open(r, { pid = slot.tid, cpu = cpu, pages = pages })
      -- the mlock budget is tight (many threads of -p, a user's limit):
      -- smaller rings for this and the next events, down to 8 pages; a
      -- size given with -m is kept or refused, as perf does
      if ev or mmap_pages or pages <= 8 then break end
      pages = pages / 2
    end
    if not ev then
      for _, e in ipairs(evs) do e:close() end
      if child then child:kill(9) end
      if out ~= io.stdout then out:close() os.remove(path) end
      io.stderr:write("luaperf record: ", tostring(err), "\n")
      return 1
    end
    evs[#evs + 1] = ev
    ev_index[ev] = ei
    per[ei].evs[#per[ei].evs + 1] = ev
  end

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
  local seen_pid = {}
  local lmap, nlua = o.lua and M.luamap(pid), 0
  if lmap and not lmap:refresh().found then
    io.stderr:write(format("luaperf record: %s does not exist: process %d was not started with "
      .. "perf_event.luamap (luajit -l perf_event.luamap, or require it), so its Lua code is not named; "
      .. "C frames only\n", lmap.path, pid))
  elseif lmap and lmap.stale then
    io.stderr:write(format("luaperf record: %s was left by an earlier process %d: not used; C frames only\n",
                           lmap.path, pid))
  end
  -- The rings are copied out whole (ring_take: one memcpy per ring, the
  -- tail published at once) as soon as a quarter of one is written, and
  -- decoded afterwards, a round at a time: so a burst the decoding cannot
  -- follow still leaves room in the rings.  While it decodes, it takes the
  -- rings again each millisecond (checked every 64 records).
  local ring_take, chunk_record = c._private.ring_take, c._private.chunk_record
  local queue, qhead, qtail = {}, 1, 0   -- rounds taken, not yet decoded
  local queued, QUEUE_MAX = 0, 64 * 1024 * 1024   -- their bytes
  local now, last_take = c.now, 0
  local function take_all()
    last_take = now()
    local round
    for _, ev in ipairs(evs) do
      local chunk, why = ring_take(ev)
      if why then io.stderr:write("luaperf record: ", why, "\n") end
      if chunk then
        round = round or {}
        round[#round + 1] = { ev = ev, chunk = chunk }
        queued = queued + #chunk
      end
    end
    if round then qtail = qtail + 1; queue[qtail] = round end
  end
  local function tick(i)
    if i % 64 == 0 and now() - last_take >= 0.001 then take_all() end
  end
  local function process(round)
    local batch = {}
    for _, ch in ipairs(round) do
      local pos, chunk, ev = 1, ch.chunk, ch.ev
      queued = queued - #chunk
      while true do
        local at = pos
        local rec
        rec, pos = chunk_record(ev, chunk, pos)
        if not rec then break end
        rec.ev_index = ev_index[ev]
        if pdata then rec.raw_bytes = chunk:sub(at, pos - 1) end
        batch[#batch + 1] = rec
        tick(#batch)
      end
    end
    -- rings are per CPU: merge by time so mmaps precede the samples in them
    table.sort(batch, function(a, b) return time_of(a) < time_of(b) end)
    if pdata then
      for i, rec in ipairs(batch) do
        if rec.type == "sample" then per[rec.ev_index].samples = per[rec.ev_index].samples + 1 end
        pdata:add(rec.raw_bytes, rec)
        tick(i)
      end
      if #batch > 0 then pdata:round() end
      return
    end
    if lmap then lmap:refresh() end   -- the traces and functions made meanwhile
    for i, rec in ipairs(batch) do
      if rec.type == "sample" then
        if not seen_pid[rec.pid] and not sym.maps[rec.pid] then
          sym:load_maps(rec.pid)   -- started before we saw its mmaps
        end
        seen_pid[rec.pid] = true
        if cg and cg.mode == "dwarf" then rec.callchain = sym:unwind(rec) or rec.callchain end
        if lmap then
          local named
          rec.frames, named = lmap:frames(rec, sym)
          if named then nlua = nlua + 1 end
        end
        local ei = rec.ev_index
        per[ei].samples = per[ei].samples + 1
        folder.add(rec, multi and per[ei].name or nil)
        if collector then collector.add(rec, ei) end
      else
        sym:record(rec)
      end
      tick(i)
    end
  end
  -- everything in the rings now, and what was taken before
  local function drain()
    take_all()
    while qhead <= qtail do
      local round = queue[qhead]
      queue[qhead], qhead = nil, qhead + 1
      process(round)
    end
  end

  if child then
    local ok
    ok, err = child:start()
    if not ok then
      for _, e in ipairs(evs) do e:close() end
      io.stderr:write("luaperf record: ", err, "\n")
      return 127
    end
  elseif #o.cmd > 0 then
    child, err = c.spawn(o.cmd)
    if not child then io.stderr:write("luaperf record: ", err, "\n") return 127 end
  end

  -- as perf record's loop: sleep in poll(2) on the event fds (woken at
  -- the watermark), the command's or process's pidfd and the signalfd; a
  -- ring whose task is gone (POLLHUP) is polled no more, and when none is
  -- left (-p, -t: every thread exited) the recording ends
  local live = {}
  for i, ev in ipairs(evs) do live[i] = ev end
  local status, code
  local waited = child or pid or nil
  -- as perf on SIGINT/SIGTERM or a write error: a command still running
  -- gets SIGTERM (SIGKILL a second later), and what was recorded is written
  local function stop_child()
    if not child or child:wait(0) ~= false then return end
    child:kill(15)
    local st = child:wait(1000)
    if st == false or st == "signal" then child:kill(9) end
  end
  while true do
    local what, x = c.wait_events(live, 250, waited)
    if what == nil then io.stderr:write("luaperf record: ", tostring(x), "\n") break end
    -- a ring at its watermark is copied at once; the decoding waits for a
    -- quiet moment (250 ms without a wakeup) or 64 MiB of copies, so a
    -- burst finds the rings empty (symbol tables load on a first sample)
    take_all()
    if what == false or queued > QUEUE_MAX then drain() end
    if what == "signal" then stop_child() break end
    if what == "exited" then break end
    if pdata and pdata.err then stop_child() break end
    if x and what ~= "signal" then
      local gone = {}
      for _, i in ipairs(x) do gone[live[i]] = true end
      local keep = {}
      for _, ev in ipairs(live) do if not gone[ev] then keep[#keep + 1] = ev end end
      live = keep
      if #live == 0 and not wide then break end
    end
  end
  if child then status, code = child:wait() end
  for _, ev in ipairs(evs) do ev:disable() end
  drain()
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

  if pdata then
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
  if collector then
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

M.USAGE = USAGE

return M
