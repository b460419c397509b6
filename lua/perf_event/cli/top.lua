--- perf_event.cli.top: `luaperf top --lua -p PID`, a live view of the
-- hottest Lua functions of running LuaJIT processes, refreshed each
-- second: the samples of `luaperf record --lua -p` (perf_event.cli.record_remote,
-- the BPF program), counted per function as the leaf (own) and anywhere in
-- the stack (total).
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.top

local io, string, table, os, math = io, string, table, os, math
local ipairs, pairs, tostring, tonumber = ipairs, pairs, tostring, tonumber
local format, concat = string.format, table.concat

local C = require("perf_event.cli.common")
local usage_error, parse_args, number_opt = C.usage_error, C.parse_args, C.number_opt

local M = {}

local USAGE = {
  top = [[
usage: luaperf top --lua -p PID[,PID...] [--children] [-F HZ] [-d SECONDS]

  -p, --pid PIDS      the processes to watch (LuaJIT 2.1 on x86-64: luajit,
                      nginx with lua-nginx-module, OpenResty)
      --lua           the Lua functions (the only kind top shows)
      --children      every descendant of each PID too, those forked later
                      included (an nginx master's workers)
  -F, --freq HZ       samples per second of CPU time (default 99)
  -d, --delay SECONDS the refresh interval (default 1)

Shows, refreshed every interval, the Lua functions of the processes' samples
in that interval: %Own, the share of samples where the function is the leaf,
and %Total, where it is anywhere in the stack; Own and Total count the
samples since the start.  Functions are named as `luaperf record --lua -p`
names them, by the line that defines them.  q quits (or Ctrl-C).  Needs root
(the stacks are read by a BPF program at each sample) and a core built with
libbpf.
]],
}
M.USAGE = USAGE

-- the view's lines: a header, then the functions by own share
local function render(st, rows, cols)
  local out = {}
  local n = st.n
  out[1] = format("luaperf top --lua -p %s: %d Hz, %d samples in the last %.1f s, %d in all; %d failed the "
                  .. "check%s", st.pids, st.freq, n, st.dt, st.all, st.failed, st.interactive and "; q quits" or "")
    :sub(1, cols)
  out[2] = ""
  out[3] = format("%6s %6s %8s %8s  %s", "%Own", "%Total", "Own", "Total", "Function")
  local fns = {}
  for name in pairs(st.total) do fns[#fns + 1] = name end
  table.sort(fns, function(a, b)
    local oa, ob = st.own[a] or 0, st.own[b] or 0
    if oa ~= ob then return oa > ob end
    local ta, tb = st.total[a] or 0, st.total[b] or 0
    if ta ~= tb then return ta > tb end
    local ca, cb = st.cum_own[a] or 0, st.cum_own[b] or 0
    if ca ~= cb then return ca > cb end
    return a < b
  end)
  for _, name in ipairs(fns) do
    if #out >= rows then break end
    local line = format("%5.1f%% %5.1f%% %8d %8d  %s", n > 0 and 100 * (st.own[name] or 0) / n or 0,
                        n > 0 and 100 * (st.total[name] or 0) / n or 0, st.cum_own[name] or 0,
                        st.cum_total[name] or 0, name)
    out[#out + 1] = line:sub(1, cols)
  end
  if #fns == 0 then out[#out + 1] = n == 0 and "(no samples in Lua code in this interval)" or "" end
  return out
end

function M.top(argv)
  local o = parse_args("top", argv, { short = { h = "help", p = "pid", F = "freq", d = "delay" },
                                      takes = { pid = true, freq = true, delay = true },
                                      flags = { help = true, lua = true, children = true } })
  if o.help then io.stdout:write(USAGE.top) return 0 end
  if not o.lua then usage_error("top", "--lua is required (top shows Lua functions)") end
  if not o.pid then usage_error("top", "-p PID is required") end
  if #o.cmd > 0 then usage_error("top", "top takes no command: " .. o.cmd[1]) end
  local pids = C.pid_list("top", o.pid)
  local freq = o.freq and number_opt("top", o.freq, "-F", 1) or 99
  local delay = tonumber(o.delay or 1)
  if not delay or delay < 0.1 or delay > 3600 then
    usage_error("top", format("-d must be a number of seconds from 0.1 to 3600, got '%s'", tostring(o.delay)))
  end
  local c = require("perf_event.core")
  local P = c._private
  local remote = require("perf_event.cli.record_remote")
  local s = { o = { events = {}, cmd = {}, children = o.children }, c = c, pids = pids, freq = math.floor(freq),
              cmdname = "top" }
  local ok, why = remote.available(c)
  if not ok then io.stderr:write("luaperf top: ", why, "\n") return 1 end
  c.catch_signals()
  local sess, rc = remote.start(s, { lines = false })
  if not sess then
    if sess == nil then io.stderr:write("luaperf top: ", tostring(rc), "\n") return 1 end
    return rc
  end
  local tty_in = P.tty_raw(true) and true or false
  local tty_out = P.tty_size() ~= nil
  local st = { pids = concat(pids, ","), freq = s.freq, n = 0, all = 0, failed = 0, dt = 0, own = {}, total = {},
               cum_own = {}, cum_total = {}, interactive = tty_in }
  local function count(_, names)
    local leaf = names[#names]
    st.n, st.all = st.n + 1, st.all + 1
    if leaf then
      st.own[leaf] = (st.own[leaf] or 0) + 1
      st.cum_own[leaf] = (st.cum_own[leaf] or 0) + 1
    end
    local seen = {}
    for _, name in ipairs(names) do
      if not seen[name] then
        seen[name] = true
        st.total[name] = (st.total[name] or 0) + 1
        st.cum_total[name] = (st.cum_total[name] or 0) + 1
      end
    end
  end
  local waited = #pids == 1 and not o.children and pids[1] or nil
  local result = 0
  local okrun, err = pcall(function()
    sess.enable()
    local last, last_scan = c.now(), os.time()
    while true do
      -- a key on a terminal (q quits; its end too), else the interval's wait
      local what = c.wait_events({}, tty_in and 0 or 100, waited)
      if what == "signal" or what == "exited" then break end
      if tty_in then
        local key = P.tty_key(100)
        if key == false or key and key:find("[qQ]") then break end
      end
      sess.take(count)
      if o.children and os.time() ~= last_scan then sess.rescan() last_scan = os.time() end
      local now = c.now()
      if now - last >= delay then
        st.dt, st.failed = now - last, sess.failed
        local rows, cols = P.tty_size()
        local lines = render(st, rows and rows - 1 or 40, cols or 200)
        if tty_out then
          io.stdout:write("\27[H\27[2J", concat(lines, "\n"), "\n")
        else
          io.stdout:write(concat(lines, "\n"), "\n\n")
        end
        io.stdout:flush()
        st.n, st.own, st.total, last = 0, {}, {}, now
      end
    end
  end)
  sess.stop(count)
  if tty_in then P.tty_raw(false) end
  if not okrun then io.stderr:write("luaperf top: ", tostring(err), "\n") result = 1 end
  io.stderr:write(format("[ luaperf top: %d samples; %d failed the check%s%s ]\n", st.all, sess.failed,
                         sess.reasons(), sess.dropped > 0 and format("; %d lost (ring full)", sess.dropped) or ""))
  return result
end

return M
