--- perf_event.profile.naming: how a frame is named (not a public
-- interface): a Lua function as `name@chunk:line`, its name guessed from
-- the source line that defines it; a builtin or C function by the name
-- package.loaded's tables give it (`M.builtins`).
-- @module perf_event.profile.naming

local format, sub, find, gsub = string.format, string.sub, string.find, string.gsub
local sort = table.sort
local type, tostring, ipairs, pairs, rawget, require, next, pcall =
  type, tostring, ipairs, pairs, rawget, require, next, pcall
local io, debug, package, _VERSION, _G, print = io, debug, package, _VERSION, _G, print

local addr_of = require("perf_event.profile.raw").addr_of

local jit = rawget(_G, "jit")
local ffi, jutil
if jit then
  ffi = require("ffi")
  jutil = require("jit.util")
end

local M = {}

local src_lines = {}   -- path -> array of lines | false

-- (root: where another process's files are seen from here, its
-- /proc/PID/root and /proc/PID/cwd for absolute and relative paths)
local function source_line(source, line, root)
  if sub(source, 1, 1) ~= "@" then return nil end
  local path = sub(source, 2)
  if root then path = (sub(path, 1, 1) == "/" and root.abs or root.rel .. "/") .. path end
  local lines = src_lines[path]
  if lines == nil then
    lines = false
    local f = io.open(path, "r")
    if f then
      lines = {}
      for l in f:lines() do lines[#lines + 1] = l end
      f:close()
    end
    src_lines[path] = lines
  end
  return lines and lines[line]
end

-- "name", from the source text of the line that defines the function
local function guess_name(source, linedefined, root)
  if linedefined == 0 then return "main" end
  local l = source_line(source, linedefined, root)
  if l then
    local n = l:match("function%s+([%w_%.:]+)%s*%(")
      or l:match("([%w_%.%[%]\"']+)%s*=%s*function%s*%(")
    if n then return n end
  end
  return "anon"
end

-- the text between `[string "` and `"]` for a chunk loaded from string s,
-- as the running VM's short_src has it (LUA_IDSIZE 60): the first line, or
-- as much of it as fits, "..." marking a cut
local string_chunk
if jit then
  -- LuaJIT (lj_debug_shortname): up to the first control character, at
  -- most 48 bytes kept whole, else 45 and "..."
  string_chunk = function(s)
    local n = (s:find("[%z\1-\31]") or #s + 1) - 1
    if n > 48 then n = 48 end
    if n == #s then return s end
    return sub(s, 1, n < 45 and n or 45) .. "..."
  end
elseif _VERSION == "Lua 5.1" then
  -- 5.1 (luaO_chunkid): up to the first "\n" or "\r", at most 43 bytes
  string_chunk = function(s)
    local n = (s:find("[\r\n]") or #s + 1) - 1
    if n > 43 then n = 43 end
    if n == #s then return s end
    return sub(s, 1, n) .. "..."
  end
else
  -- 5.2-5.4 (luaO_chunkid): a one-line source under 45 bytes whole, else
  -- its first line (up to "\n"), at most 45 bytes, and "..."
  string_chunk = function(s)
    local nl = s:find("\n", 1, true)
    if #s < 45 and not nl then return s end
    local n = nl and nl - 1 or #s
    return sub(s, 1, n < 45 and n or 45) .. "..."
  end
end

-- the chunk as frames name it: a file's path ("@path"), a given name
-- ("=name"), a string chunk as Lua's short_src (`[string "first line..."]`);
-- "?" (not known) as is
local function chunk_name(source)
  local c = sub(source, 1, 1)
  if c == "@" or c == "=" then return sub(source, 2) end
  if source == "?" then return source end
  return '[string "' .. string_chunk(source) .. '"]'
end
M.chunk_name = chunk_name

--- A frame name made safe for one field of a folded line ("a;b;c N"):
-- each ";" (the separator) becomes ":" (as perf's stackcollapse does) and
-- each control character (a newline would end the line) a space.
-- @tparam string s @treturn string
function M.folded_frame(s)
  if not find(s, "[;%c]") then return s end
  return (gsub(gsub(s, ";", ":"), "%c", " "))
end

local infos = {}   -- "source:linedefined" -> { name, chunk, linedefined, lastlinedefined }

-- fi: a jit.util.funcinfo table (or a debug.getinfo one)
function M.proto_info(fi)
  local src = fi.source or "?"
  local key = src .. ":" .. tostring(fi.linedefined)
  local i = infos[key]
  if not i then
    i = { name = guess_name(src, fi.linedefined), chunk = chunk_name(src),
          linedefined = fi.linedefined, lastlinedefined = fi.lastlinedefined }
    infos[key] = i
  end
  return i
end

--- A function's name as the frames name it, from its source, the line
-- that defines it, and (another process's) root {abs=, rel=} to read it.
-- @treturn string
M.guess_name = guess_name

local function frame_name(info, line)
  return format("%s@%s:%d", info.name, info.chunk, line or info.linedefined)
end
M.frame_name = frame_name

-- the library tables named first, in this order; the other modules of
-- package.loaded follow sorted by name (and nginx's `ngx` when it is only
-- a global)
local LIBS = { "_G", "string", "table", "math", "io", "os", "coroutine", "debug", "package",
               "bit", "jit", "ffi", "jit.util", "jit.profile" }
local IS_LIB = {}
for _, m in ipairs(LIBS) do IS_LIB[m] = true end

-- a builtin's or C function's address as a frame holds it (LuaJIT: the
-- GCfunc, `%p`; PUC: lua_topointer, which tostring shows), and on LuaJIT
-- the lua_CFunction of a C function that is no builtin; nil for a Lua function
local c_addr
if jutil then
  c_addr = function(f)
    local fi = jutil.funcinfo(f)
    if not fi.addr then return nil end
    return addr_of(f), not fi.ffid and fi.addr or nil
  end
else
  local getinfo, pformat = debug.getinfo, pcall(format, "%p", print) and "%p"
  c_addr = function(f)
    local i = getinfo(f, "S")
    if not i or i.what ~= "C" then return nil end
    local h = (pformat and format(pformat, f) or tostring(f)):match("0x(%x+)")
    return h and tonumber(h, 16)
  end
end

-- The traversal of M.builtins over any reader of a Lua state's tables:
-- reader.fields(t) -> array of { name, "function" | "table", v } (t's string
-- keys; v: a function's address key, or a table as reader.fields takes it),
-- reader.loaded and reader.globals (package.loaded, _G; nil when missing).
-- Each function is named by the first path that reaches it: names[key] =
-- "lib.name" (`_G`'s without a prefix). Returns names.
function M.name_modules(reader)
  local names = {}
  local fields = reader.fields
  local function add(prefix, t, depth)
    if t == nil then return end
    local fs, subs = fields(t), {}
    sort(fs, function(a, b) return a[1] < b[1] end)
    for _, f in ipairs(fs) do
      local name, kind, v = f[1], f[2], f[3]
      if kind == "function" then
        if v ~= nil and not names[v] then names[v] = prefix and prefix .. "." .. name or name end
      elseif depth > 0 and #subs < 256 then
        subs[#subs + 1] = f
      end
    end
    for _, f in ipairs(subs) do
      if not IS_LIB[f[1]] and f[3] ~= t then add(prefix and prefix .. "." .. f[1] or f[1], f[3], depth - 1) end
    end
  end
  local loaded = {}
  for _, f in ipairs(reader.loaded ~= nil and fields(reader.loaded) or {}) do
    if f[2] == "table" then loaded[f[1]] = f[3] end
  end
  loaded._G = loaded._G or reader.globals
  local seen = {}
  for _, m in ipairs(LIBS) do
    if loaded[m] ~= nil then seen[m] = true add(m ~= "_G" and m or nil, loaded[m], 0) end
  end
  local rest = {}
  for m in pairs(loaded) do if not seen[m] then rest[#rest + 1] = m end end
  if loaded.ngx == nil and reader.globals ~= nil then
    for _, f in ipairs(fields(reader.globals)) do
      if f[1] == "ngx" and f[2] == "table" then loaded.ngx = f[3] rest[#rest + 1] = "ngx" end
    end
  end
  sort(rest)
  for _, name in ipairs(rest) do add(name, loaded[name], 1) end
  return names
end

--- Names of the builtins and C functions in package.loaded's tables, by the
-- function's address (LuaJIT: what `%p` gives, the GCfunc the frame holds;
-- PUC Lua: the address `tostring` shows), as `lib.name` (`_G`'s without a
-- prefix); a module's C functions the same way (`cjson.encode`), and those
-- of its tables one level down (`ngx.req.get_headers`; 256 tables a module
-- at most, a module holding data is not walked whole); on LuaJIT the cdata
-- metamethods as `cdata.__call`, .... `cfuncs` maps a C function's
-- lua_CFunction address to the same name (LuaJIT), for another closure of
-- it. The table keeps the functions, so no address in it is reused while it
-- lives.
-- @treturn table address -> name
function M.builtins()
  local keep, cfuncs, cf_of = {}, {}, {}
  local function fields(t)
    local out = {}
    if type(t) ~= "table" then return out end
    local k, v = next(t)
    while k ~= nil do   -- raw: no __pairs, no index metamethod of a module table
      if type(k) == "string" then
        if type(v) == "function" then
          local a, cf = c_addr(v)
          if a then
            out[#out + 1] = { k, "function", a }
            keep[#keep + 1] = v
            cf_of[a] = cf
          end
        elseif type(v) == "table" then
          out[#out + 1] = { k, "table", v }
        end
      end
      k, v = next(t, k)
    end
    return out
  end
  local names = M.name_modules({ fields = fields, loaded = package.loaded, globals = _G })
  if ffi then
    local meta = M.name_modules({ fields = fields, loaded = { cdata = debug.getmetatable(ffi.new("char[1]")) },
                                  globals = nil })
    for a, n in pairs(meta) do if not names[a] then names[a] = n end end
  end
  for a, n in pairs(names) do
    local cf = cf_of[a]
    if cf and not cfuncs[cf] then cfuncs[cf] = n end
  end
  names.functions, names.cfuncs = keep, cfuncs
  return names
end

return M
