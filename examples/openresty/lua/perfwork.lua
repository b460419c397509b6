--- perfwork: a Lua handler with a known hot function, for the profiler of
-- perfreq to find (spec/nginx_spec.lua drives load on it).
--   location = /lua-work { content_by_lua_block { require("perfwork").handler() } }
local ngx = ngx  -- luacheck: read globals ngx

local M = {}

-- the hot function: integer arithmetic in a loop, compiled by the JIT
local function checksum_loop(n, seed)
  local s = seed
  for i = 1, n do
    s = (s * 31 + i) % 1000003
  end
  return s
end

-- a cheap one, so that the handler is not only the loop
local function describe(n, s)
  return "n=" .. n .. " sum=" .. s
end

--- Content handler: ?n=N iterations of the loop (default 300000).
function M.handler()
  local n = math.min(tonumber(ngx.var.arg_n) or 300000, 1e8)
  ngx.say(describe(n, checksum_loop(n, 7)))
end

return M
