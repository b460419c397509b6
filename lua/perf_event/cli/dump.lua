--- perf_event.cli.dump: `luaperf dump --lua -p PID`, the Lua stack of each
-- LuaJIT VM of a running process at this instant (perf_event.remote).
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- @module perf_event.cli.dump

local io, string = io, string
local ipairs, tostring = ipairs, tostring
local format = string.format

local C = require("perf_event.cli.common")
local usage_error, parse_args = C.usage_error, C.parse_args

local M = {}

local USAGE = {
  dump = [[
usage: luaperf dump --lua -p PID[,PID...] [--children] [--nonblocking]

  -p, --pid PIDS    the processes to dump (LuaJIT 2.1 on x86-64: luajit,
                    nginx with lua-nginx-module, OpenResty)
      --lua         the Lua stacks (the only kind dump prints)
      --children    every descendant of each PID too (an nginx master's
                    workers)
      --nonblocking read the stacks while the threads run, without stopping
                    them (cheaper for the target; the leaf may be off)

Prints, for each LuaJIT VM in each process, the Lua stack of its running
coroutine at this instant, innermost last: Lua functions as name@chunk:line,
builtins and C functions by the names the process's package.loaded gives
them, compiled code from its trace's snapshot.  Nothing needs to be loaded
in the process.  Each thread is stopped for the moment of the read
(ptrace: run as the process's user or as root); --nonblocking does not stop
it.
]],
}
M.USAGE = USAGE

function M.dump(argv)
  local o = parse_args("dump", argv, { short = { h = "help", p = "pid" }, takes = { pid = true },
                                       flags = { help = true, lua = true, nonblocking = true,
                                                children = true } })
  if o.help then io.stdout:write(USAGE.dump) return 0 end
  if not o.lua then usage_error("dump", "--lua is required (dump prints Lua stacks)") end
  if not o.pid then usage_error("dump", "-p PID is required") end
  if #o.cmd > 0 then usage_error("dump", "dump takes no command: " .. o.cmd[1]) end
  local pids = C.pid_list("dump", o.pid)
  local R = require("perf_event.remote")
  if o.children then pids = R.with_children(pids) end
  local rc = 0
  for i, pid in ipairs(pids) do
    local d, why = R.dump(pid, { nonblocking = o.nonblocking })
    if i > 1 then io.stdout:write("\n") end
    if d then
      io.stdout:write(R.format(d))
    else
      io.stderr:write(format("luaperf dump: %s\n", tostring(why)))
      rc = 1
    end
  end
  return rc
end

return M
