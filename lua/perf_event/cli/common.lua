--- perf_event.cli.common: what luaperf's subcommands share: the argument
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- parser, usage errors (caught by perf_event.cli's main), numbers and
-- lists given as options, exit codes and the report's output file.
-- @module perf_event.cli.common

local io, string, math = io, string, math
local tonumber, tostring, error = tonumber, tostring, error
local setmetatable = setmetatable
local format = string.format

local M = {}

local function pe() return require("perf_event") end
local function core() return require("perf_event.core") end

-- ------------------------------------------------------------- arguments

local Usage = {}   -- error marker for usage mistakes

local function usage_error(cmd, msg)
  error(setmetatable({ msg = msg, cmd = cmd }, Usage), 0)
end

-- opts: { short = long, ... }, takes: { long = true } for options with a value
local function parse_args(cmd, argv, spec)
  local o = { events = {} }
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then i = i + 1 break end
    if a:sub(1, 1) ~= "-" or a == "-" then break end
    local name, val
    if a:sub(1, 2) == "--" then
      name, val = a:match("^%-%-([^=]+)=(.*)$")
      if not name then name = a:sub(3) end
    else
      name = spec.short[a:sub(2, 2)]
      if not name then usage_error(cmd, "unknown option " .. a) end
      if #a > 2 then val = a:sub(3) end
    end
    if not spec.takes[name] and not spec.flags[name] then
      usage_error(cmd, "unknown option " .. a)
    end
    if spec.takes[name] then
      if val == nil then
        i = i + 1
        val = argv[i]
        if val == nil then usage_error(cmd, "option " .. a .. " needs a value") end
      end
      if name == "event" then o.events[#o.events + 1] = val else o[name] = val end
    else
      if val ~= nil then usage_error(cmd, "option --" .. name .. " takes no value") end
      o[name] = true
    end
    i = i + 1
  end
  o.cmd = {}
  for j = i, #argv do o.cmd[#o.cmd + 1] = argv[j] end
  return o
end

local function number_opt(cmd, v, what, min)
  local n = tonumber(v)
  -- 2^53: the largest integer every Lua here holds exactly
  if not n or n ~= math.floor(n) or n < (min or 1) or n > 2 ^ 53 then
    usage_error(cmd, format("%s must be an integer from %d to 2^53, got '%s'", what, min or 1, tostring(v)))
  end
  return n
end

local function exit_code(status, code)
  if status == "exited" then return code end
  if status == "signaled" then return 128 + code end
  return 1
end

local function open_output(path)
  if not path or path == "" then return io.stderr end
  if path == "-" then return io.stdout end
  local f, err = io.open(path, "w")
  if not f then error({ msg = err }, 0) end
  core()._private.cloexec(f)   -- a command stat runs never inherits it
  return f
end

local function int_list(cmd, v, what)
  local out = {}
  for part in tostring(v):gmatch("[^,]+") do
    local x, y = part:match("^(%d+)%-(%d+)$")
    if x then
      for n = tonumber(x), tonumber(y) do out[#out + 1] = n end
    elseif part:match("^%d+$") then
      out[#out + 1] = tonumber(part)
    else
      usage_error(cmd, format("%s must be a list like 0,2-3, got '%s'", what, tostring(v)))
    end
  end
  if #out == 0 then usage_error(cmd, format("%s must not be empty", what)) end
  return out
end

-- -p PID[,PID...] of dump and top: process ids, each >= 1
local function pid_list(cmd, v)
  local pids = {}
  for p in tostring(v):gmatch("[^,]+") do
    local n = p:match("^%d+$") and tonumber(p)
    if not n or n < 1 then usage_error(cmd, format("-p takes process ids like 123,456, got '%s'", v)) end
    pids[#pids + 1] = n
  end
  return pids
end

M.pe, M.core, M.Usage, M.usage_error, M.parse_args = pe, core, Usage, usage_error, parse_args
M.number_opt, M.exit_code, M.open_output, M.int_list = number_opt, exit_code, open_output, int_list
M.pid_list = pid_list

return M
