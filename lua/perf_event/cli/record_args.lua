--- perf_event.cli.record_args: `luaperf record`'s options, checked and
-- turned into what the recording needs (target, rate or period, ring size,
-- call-graph mode, output kind).
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.record_args

local io, string, math = io, string, math
local tonumber, tostring = tonumber, tostring
local format = string.format

local C = require("perf_event.cli.common")
local pe, core = C.pe, C.core
local usage_error, parse_args, number_opt, int_list = C.usage_error, C.parse_args, C.number_opt, C.int_list

local M = {}

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

--- Parses and checks `luaperf record`'s arguments (a usage error raises).
-- @treturn[1] table the recording's settings: `o` (the options), `pid`
-- (`pids`: with --lua, every process of -p),
-- `tid`, `tgid`, `wide`, `cpu_list`, `attach`, `freq`, `period`,
-- `mmap_pages`, `cg`, `as_profile`, `c` (the core); just `o` for `-h`
-- @treturn[2] nil
-- @treturn[2] number the exit code (the message is written)
function M.options(argv)
  local o = parse_args("record", argv, {
    short = { e = "event", F = "freq", c = "count", g = "g", p = "pid", o = "output", h = "help",
              t = "tid", a = "all-cpus", C = "cpu", m = "mmap-pages" },
    takes = { event = true, freq = true, count = true, pid = true, output = true, tid = true, cpu = true,
              ["call-graph"] = true, ["mmap-pages"] = true },
    flags = { g = true, help = true, folded = true, ["all-cpus"] = true, pprof = true, speedscope = true,
              lua = true, children = true },
  })
  if o.help then return { o = o } end
  if o.pprof and o.speedscope then usage_error("record", "--pprof and --speedscope exclude each other") end
  local as_profile = o.pprof and "pprof" or o.speedscope and "speedscope"
  if as_profile and o.folded then usage_error("record", "--folded and --" .. as_profile .. " exclude each other") end
  if o.lua then
    if o["all-cpus"] or o.cpu or o.tid then
      usage_error("record", "--lua profiles a command or a process (-p PID): not with -a, -C or -t")
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
  if o.children and not (o.lua and o.pid) then usage_error("record", "--children goes with --lua -p PID") end
  -- --lua -p takes several processes (PID,PID...); the others one
  local pids = o.lua and o.pid and int_list("record", o.pid, "-p PIDS")
  local pid = pids and pids[1] or o.pid and number_opt("record", o.pid, "-p PID")
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
  if tid and not tgid then io.stderr:write("luaperf record: no thread ", tid, "\n") return nil, 1 end
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
    return nil, 1
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
  return { o = o, pid = pid, pids = pids, tid = tid, tgid = tgid, wide = wide, cpu_list = cpu_list, attach = attach,
           freq = freq, period = period, mmap_pages = mmap_pages, cg = cg, as_profile = as_profile, c = c }
end

return M
