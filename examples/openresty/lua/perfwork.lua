--- perfwork: demo handlers with known hot Lua functions, for
-- perf_event.openresty's profiles to find (spec/nginx_spec.lua and
-- spec/fleet_spec.lua drive load on them).
--   location = /lua-work  { content_by_lua_block { require("perfwork").handler() } }
--   location = /fleet/hot { content_by_lua_block { require("perfwork").collatz() } }
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

-- pure Lua work the profiles name
local function collatz_steps(limit)
  local steps = 0
  for i = 1, limit do
    local x = i
    while x ~= 1 do
      if x % 2 == 0 then x = x / 2 else x = 3 * x + 1 end
      steps = steps + 1
    end
  end
  return steps
end

--- Content handler: the total Collatz steps of 1..?n (default 3000).
function M.collatz()
  local n = math.floor(tonumber(ngx.var.arg_n) or 3000)
  ngx.say(collatz_steps(math.max(1, math.min(n, 1000000))))
end

return M
