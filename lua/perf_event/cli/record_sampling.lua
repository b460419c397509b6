--- perf_event.cli.record_sampling: how `luaperf record` samples: the
-- events it opens (each -e on every thread and CPU, with perf record's
-- sample_type, rings and fallbacks), the copy of the rings out and their
-- decoding, and the poll loop that runs until the command or the targets
-- end.  The settings come from perf_event.cli.record_args; the records go to
-- the sinks of perf_event.cli.record_output.
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.record_sampling

local io, string, table, math, os = io, string, table, math, os
local ipairs, pairs, tonumber, tostring, type = ipairs, pairs, tonumber, tostring, type
local format = string.format

local C = require("perf_event.cli.common")
local usage_error = C.usage_error

local M = {}

local function time_of(r)
  local t = r.time
  if type(t) == "number" then return t end
  return tonumber(t) or 0
end

--- The events of `-e` (default cpu-clock), each one's sample_type, the
-- output path and kind, and the output opened (a bad path fails at once).
-- Sets `s.specs`, `s.multi`, `s.path`, `s.to_data`, `s.sample_types`, `s.out`.
-- @treturn nil|number an exit code when it failed (the message is written)
function M.expand(s)
  local o, c, cg, period, as_profile = s.o, s.c, s.cg, s.period, s.as_profile
  local SW = c.abi.sw
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
  s.specs, s.multi, s.path, s.to_data, s.sample_types, s.out = specs, multi, path, to_data, sample_types, out
end

--- Starts the command (stopped before its exec) and opens the events: per
-- -e, one on each thread and CPU.  Sets `s.child`, `s.evs`, `s.per` (per
-- event: name, events, samples, lost) and `s.ev_index` (event -> its -e).
-- @treturn nil|number an exit code when it failed (everything opened is closed)
function M.open_events(s)
  local o, c, cg, pid, tid, attach = s.o, s.c, s.cg, s.pid, s.tid, s.attach
  local cpu_list, mmap_pages, period, freq = s.cpu_list, s.mmap_pages, s.period, s.freq
  local specs, sample_types, to_data, out, path = s.specs, s.sample_types, s.to_data, s.out, s.path
  local R = require("perf_event.resolve")
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
  local pages = mmap_pages or require("perf_event.cli.record_args").default_pages(cg and cg.mode == "dwarf")
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
  s.child, s.evs, s.per, s.ev_index = child, evs, per, ev_index
end

-- The reader of the rings: `take_all()` copies every ring out, `drain()`
-- takes them and decodes all that was taken into the sinks, `queued()` the
-- bytes taken and not yet decoded.
local function reader(s)
  local c, evs, ev_index, per, pdata, sym = s.c, s.evs, s.ev_index, s.per, s.pdata, s.sym
  local lmap, cg, folder, collector, multi = s.lmap, s.cg, s.folder, s.collector, s.multi
  local seen_pid = {}
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
          if named then s.nlua = s.nlua + 1 end
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
  return { take_all = take_all, drain = drain, queued = function() return queued end, QUEUE_MAX = QUEUE_MAX }
end

--- Runs the recording: starts the command (or waits on -p/-t/-a targets),
-- copies the rings as they fill and decodes them between bursts, until the
-- command or every target ends, or a signal; then the last records.  Sets
-- `s.status`, `s.code` (the command's end).
-- @treturn nil|number an exit code when the command could not start
function M.run(s)
  local o, c, evs, pid, wide, pdata = s.o, s.c, s.evs, s.pid, s.wide, s.pdata
  local child, err = s.child
  local rd = reader(s)
  local take_all, drain = rd.take_all, rd.drain
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
    if what == false or rd.queued() > rd.QUEUE_MAX then drain() end
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
  s.child, s.status, s.code = child, status, code
end

return M
