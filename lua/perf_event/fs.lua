--- Tiny read-only file-system helpers for sysfs, tracefs and procfs.
-- Pure Lua: files through `io.open`, directory listings through one
-- `ls`/`find` child (the binding has no readdir of its own).
-- @module perf_event.fs

local open, popen = io.open, io.popen
local gsub, sub, find = string.gsub, string.sub, string.find
local sort, ipairs = table.sort, ipairs

local M = {}

local function quote(path)
  return "'" .. gsub(path, "'", "'\\''") .. "'"
end

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

local function lines_of(cmd, unsorted)
  local p = popen(cmd, "r")
  if not p then return {} end
  local out = {}
  for line in p:lines() do
    if line ~= "" then out[#out + 1] = line end
  end
  p:close()
  if not unsorted then sort(out) end
  return out
end

--- Names in a directory (no `.`/`..`); empty if it does not exist.
-- @tparam string dir
-- @tparam[opt] boolean readdir_order keep the directory's own order (else sorted)
-- @treturn table
function M.list(dir, readdir_order)
  return lines_of("ls -1A" .. (readdir_order and "U" or "") .. " -- " .. quote(dir) .. " 2>/dev/null",
    readdir_order)
end

--- Paths `a/b` of the directories two levels below dir, in readdir order
-- (the order perf expands globs in).
-- @tparam string dir
-- @treturn table relative paths
function M.subdirs2(dir)
  local out = lines_of("find -L " .. quote(dir) .. " -mindepth 2 -maxdepth 2 -type d 2>/dev/null", true)
  local n = #dir + 2
  for i, p in ipairs(out) do
    if sub(dir, -1) == "/" then out[i] = sub(p, n - 1) else out[i] = sub(p, n) end
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
