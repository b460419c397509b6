--- perf_event.cli: the `luaperf` command line tool (stat, list, record, dump).
-- `main(argv)` returns the process exit status; bin/luaperf calls it.
-- Reports go to stderr as perf's do; `record` writes folded stacks
-- (`comm;caller;callee N`, the flame-graph input) to a file or stdout, or
-- perf.data to a `.data` file (perf_event.perfdata).
-- @module perf_event.cli

local io, string = io, string
local tostring, type, pcall = tostring, type, pcall
local setmetatable, getmetatable = setmetatable, getmetatable
local format = string.format

local M = {}

local function pe() return require("perf_event") end
local Usage = require("perf_event.cli.common").Usage
-- the core loads with this module, as before the split: without it
-- bin/luaperf says "cannot load the perf_event module" before any command
require("perf_event.core")

-- one module per subcommand, loaded when it runs
local SUB = { stat = "perf_event.cli.stat", list = "perf_event.cli.list", record = "perf_event.cli.record",
              dump = "perf_event.cli.dump", top = "perf_event.cli.top" }

local USAGE = setmetatable({
  main = [[
usage: luaperf COMMAND [OPTIONS] [-- CMD ARGS...]

  stat     count events while CMD runs (or for a running process / every CPU)
  list     list the event names this machine offers
  record   sample CMD and write folded stacks (flame-graph input) or perf.data
  dump     print the Lua stacks of a running LuaJIT process, as they are now
  top      watch the hottest Lua functions of a running LuaJIT process, live

Run 'luaperf COMMAND --help' for the options of a command.
]],
}, { __index = function(_, cmd) return SUB[cmd] and require(SUB[cmd]).USAGE[cmd] end })

function M.stat(argv) return require(SUB.stat).stat(argv) end
function M.list(argv) return require(SUB.list).list(argv) end
function M.record(argv) return require(SUB.record).record(argv) end
function M.dump(argv) return require(SUB.dump).dump(argv) end
function M.top(argv) return require(SUB.top).top(argv) end
-- the reader of a process's perf map (luaperf record --lua -p)
function M.luamap(...) return require(SUB.record).luamap(...) end

-- ------------------------------------------------------------- main

function M.main(argv)
  local cmd = argv[1]
  local rest = {}
  for i = 2, #argv do rest[#rest + 1] = argv[i] end
  if cmd == nil or cmd == "-h" or cmd == "--help" or cmd == "help" then
    io.stdout:write(USAGE.main)
    return cmd == nil and 2 or 0
  end
  if cmd == "--version" then io.stdout:write(pe()._VERSION, "\n") return 0 end
  local fn = ({ stat = M.stat, list = M.list, record = M.record, dump = M.dump, top = M.top })[cmd]
  if not fn then
    io.stderr:write(format("luaperf: unknown command '%s'\n\n", tostring(cmd)), USAGE.main)
    return 2
  end
  local ok, res = pcall(fn, rest)
  if ok then return res end
  if type(res) == "table" and getmetatable(res) == Usage then
    io.stderr:write(format("luaperf %s: %s\n\n%s", res.cmd, res.msg, USAGE[res.cmd]))
    return 2
  end
  if type(res) == "table" and res.msg then
    io.stderr:write("luaperf ", cmd, ": ", tostring(res.msg), "\n")
    return 1
  end
  -- never a source position ("cli.lua:177: ") in front of a message
  io.stderr:write("luaperf ", cmd, ": ", (tostring(res):gsub("^[%w%._/%-]+:%d+: ", "")), "\n")
  return 1
end

return M
