--- Tiny read-only file-system helpers for sysfs, tracefs and procfs.
-- Files through `io.open`, directory listings through the core's
-- `readdir`: no helper ever starts a process (a fork inside an nginx worker
-- or any measured program is noise at best).
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.fs

local readdir = require("perf_event.native").readdir

local open = io.open
local gsub, sub, find = string.gsub, string.sub, string.find
local sort, ipairs = table.sort, ipairs

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

return M
