--- Tiny file-system helpers: reading sysfs, tracefs and procfs files
-- through `io.open`, directory listings through the core's `readdir`, and
-- the one way to write a file at a predictable path (`own_file`). No
-- helper ever starts a process (a fork inside an nginx worker or any
-- measured program is noise at best).
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.fs

local native = require("perf_event.native")
local readdir = native.readdir

local open = io.open
local gsub, sub, find = string.gsub, string.sub, string.find
local sort, ipairs, select, tostring = table.sort, ipairs, select, tostring

local M = {}

--- Whole content of a file, or nil.
-- @tparam string path
-- @tparam[opt] boolean raw keep the trailing newline/whitespace
-- @treturn[1] string
-- @treturn[2] nil
function M.read(path, raw)
  local f = open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  if s == nil then return nil end
  if not raw then s = gsub(s, "%s+$", "") end
  return s
end

--- True if path exists and is readable (file or directory).
function M.exists(path)
  local f = open(path, "rb")
  if f then f:close() return true end
  return false
end

--- Names in a directory (no `.`/`..`); empty if it does not exist.
-- @tparam string dir
-- @tparam[opt] boolean readdir_order keep the directory's own order (else sorted)
-- @treturn table
function M.list(dir, readdir_order)
  local out = readdir(dir) or {}
  if not readdir_order then sort(out) end
  return out
end

--- Paths `a/b` of the directories two levels below dir, in readdir order
-- (the order perf expands globs in); symlinks to directories count.
-- @tparam string dir
-- @treturn table relative paths
function M.subdirs2(dir)
  local out = {}
  if sub(dir, -1) == "/" and #dir > 1 then dir = sub(dir, 1, -2) end
  for _, a in ipairs(readdir(dir, true) or {}) do
    for _, b in ipairs(readdir(dir .. "/" .. a, true) or {}) do
      out[#out + 1] = a .. "/" .. b
    end
  end
  return out
end

--- The mount points of a file-system type from /proc/mounts.
-- @tparam string fstype e.g. "tracefs"
-- @treturn table
function M.mounts(fstype)
  local s = M.read("/proc/mounts") or ""
  local out = {}
  for line in s:gmatch("[^\n]+") do
    local _, mnt, typ = line:match("^(%S+)%s+(%S+)%s+(%S+)")
    if typ == fstype and not find(mnt, "\\", 1, true) then out[#out + 1] = mnt end
  end
  return out
end

--- A file at a predictable path (`/tmp/perf-PID.map`), for writing:
-- opened without following a link, and refused unless it is a regular
-- file of this user with one link (none planted by someone else), before
-- anything is written. Writes append; `f:truncate()` empties it first.
-- @tparam string path
-- @treturn[1] table `f` with `f:head(n)` (its first n bytes), `f:write(...)`,
--   `f:flush()`, `f:truncate()`, `f:close()`
-- @treturn[2] nil
-- @treturn[2] string why not
function M.own_file(path)
  local P = native._private
  local fd, err = P.own_open(path)
  if not fd then return nil, err end
  local buf, n = {}, 0
  local f = {}
  function f.head(_, len) return P.own_head(fd, len) end
  function f.write(self, ...)
    for i = 1, select("#", ...) do n = n + 1 buf[n] = tostring((select(i, ...))) end
    if n > 256 then return self:flush() end
    return self
  end
  function f.flush(self)
    if n > 0 then
      local s = table.concat(buf, "", 1, n)
      buf, n = {}, 0
      local ok, werr = P.own_write(fd, s)
      if not ok then return nil, werr end
    end
    return self
  end
  function f.truncate(self)
    buf, n = {}, 0
    P.own_truncate(fd)
    return self
  end
  function f.close(self)
    if fd then self:flush() P.own_close(fd) fd = nil end
    return true
  end
  return f
end

return M
