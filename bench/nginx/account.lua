--- bench/nginx/account.lua: the always-on sampler's own account, for
-- bench/nginx/module.sh only (a location of the bench's server B, not of
-- doc/openresty.md's snippet).
--   /bench/account?arm=1  wraps the profile's drain with os.clock() (the
--                         worker's timer keeps calling it) and zeroes the figures
--   /bench/account        drains once more, then prints, since the arming:
--     samples drains drain_ns walks walk_ns walk reason maps_reads
-- (walks and walk_ns: the safe-point captures and their time, 0 when the
-- profile fell back to C leaf frames; reason: why it did, or nil).
local ngx = ngx  -- luacheck: read globals ngx
local require, tostring, rawget = require, tostring, rawget
local clock, format = os.clock, string.format

local M = {}

local acc   -- the figures since the arming

local function walks(p) return p.captures or 0, p.capture_total_ns or 0 end

function M.handler()
  local p = require("perf_event.openresty.sampler").profile()
  if not p then ngx.say("none") return end
  if ngx.var.arg_arm then
    local k, w = walks(p)
    acc = { cpu = 0, drains = 0, n0 = p.nsamples, k0 = k, w0 = w, m0 = p.maps_reads or 0 }
    if not rawget(p, "drain") then
      local orig = p.drain
      p.drain = function(self, ...)
        local c0 = clock()
        orig(self, ...)
        acc.cpu = acc.cpu + (clock() - c0)
        acc.drains = acc.drains + 1
        return self
      end
    end
    ngx.say("armed")
    return
  end
  if not acc then ngx.say("not armed") return end
  p:drain()
  local k, w = walks(p)
  ngx.say(format("%d %d %.0f %d %.0f %s %s %d", p.nsamples - acc.n0, acc.drains, acc.cpu * 1e9, k - acc.k0,
                 w - acc.w0, tostring(p.walk), (tostring(p.stacks_reason):gsub("%s", "_")),
                 (p.maps_reads or 0) - acc.m0))
end

return M
