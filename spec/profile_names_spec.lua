-- Frame names safe in every output: a chunk loaded from a string is named
-- as the VM's own short_src names it (`[string "first line..."]`, LUA_IDSIZE
-- 60), not by its whole source, and no frame of a folded line holds the
-- separator ";" or a control character (doc/profiling.md, "Frame names").
-- The expected names are the VM's debug.getinfo(f).short_src and, for the
-- cases below, written out per VM.
local pe = require("perf_event")
local naming = require("perf_event.profile.naming")

local jit = rawget(_G, "jit")
local load = rawget(_G, "loadstring") or load
local VM = jit and "luajit" or _VERSION == "Lua 5.1" and "5.1" or "5.4"

-- each source defines its hot function on line 2 and returns it
local LONG = "local cfg = { mode = 'fast', level = 3, name = 'a long first line' }"
local SOURCES = {
  multi = "-- template one\nlocal function f(n)\n  local s = 0\n  for i = 1, n do s = (s * 7 + i) % 65521 end\n"
    .. "  return s\nend\nreturn f\n",
  semi = "local a = 1; local b = 2\nlocal function f(n)\n  local s = a\n"
    .. "  for i = 1, n do s = (s * 5 + i + b) % 65521 end\n  return s\nend\nreturn f\n",
  long = LONG .. "\nlocal function f(n)\n  local s = 0\n  for i = 1, n do s = (s * 3 + i) % 65521 end\n"
    .. "  return s\nend\nreturn f\n",
}
-- the same body under a given name, and under a file name
local BODY = "\nlocal function f(n)\n  local s = 0\n  for i = 1, n do s = (s * 11 + i) % 65521 end\n"
  .. "  return s\nend\nreturn f\n"

-- the folded frame of each hot function (lines=false: the line that defines it)
local LONG_CUT = { luajit = LONG:sub(1, 45), ["5.1"] = LONG:sub(1, 43), ["5.4"] = LONG:sub(1, 45) }
local WANT = {
  multi = 'anon@[string "-- template one..."]:2',
  semi = 'anon@[string "local a = 1: local b = 2..."]:2',
  long = 'anon@[string "' .. LONG_CUT[VM] .. '..."]:2',
  named = "anon@tmpl one two:2",
  file = "anon@/nonexistent/dir/x:y.lua:2",
}

local function build()
  local fns = {}
  for k, src in pairs(SOURCES) do fns[k] = assert(load(src))() end
  fns.named = assert(load(BODY, "=tmpl one\ntwo"))()
  fns.file = assert(load(BODY, "@/nonexistent/dir/x;y.lua"))()
  return fns
end

describe("frame names of string chunks", function()
  it("the chunk is named as the VM's short_src names it", function()
    local fns = build()
    for _, k in ipairs({ "multi", "semi", "long" }) do
      local info = debug.getinfo(fns[k], "S")
      local frame = naming.frame_name(naming.proto_info(info))
      assert.equal("anon@" .. info.short_src .. ":2", frame)
      assert.equal(WANT[k], naming.folded_frame(frame))
    end
    -- a given name and a file name are kept whole (the file's path), the
    -- folded writer then makes them safe
    assert.equal("anon@tmpl one\ntwo:2", naming.frame_name(naming.proto_info(debug.getinfo(fns.named, "S"))))
    assert.equal(WANT.file, naming.folded_frame(naming.frame_name(naming.proto_info(debug.getinfo(fns.file, "S")))))
  end)

  it("every line of p:folded() is one stack and its count; the frames read as expected", function()
    local fns = build()
    local p = assert(pe.profile.start({ event = "task-clock", freq = 999 }))
    local ok, err = pcall(function()
      for _ = 1, 3 do
        for _, k in ipairs({ "multi", "semi", "long", "named", "file" }) do
          local c0 = os.clock()
          while os.clock() - c0 < 0.05 do fns[k](20000) end
        end
      end
    end)
    p:stop()
    assert(ok, err)
    local text = p:folded({ lines = false })
    local seen, total = {}, 0
    for line in text:gmatch("([^\n]*)\n") do
      assert.is_truthy(line:match("^[^\n]+ %d+$"), line)
      local stack, n = line:match("^(.*) (%d+)$")
      total = total + tonumber(n)
      for frame in (stack .. ";"):gmatch("([^;]*);") do
        assert.is_nil(frame:find("%c"), frame)
        for k, want in pairs(WANT) do
          if frame == want then seen[k] = (seen[k] or 0) + tonumber(n) end
        end
      end
    end
    assert.equal(p.nsamples, total)
    -- 0.15 s of CPU each at 999 Hz: about 150 samples a function
    for k in pairs(WANT) do
      assert.is_true((seen[k] or 0) >= 30, ("%s: %d samples of %s in\n%s"):format(k, seen[k] or 0, WANT[k], text))
    end
  end)

  it("luaperf's folded writer makes each frame safe too", function()
    local folder = require("perf_event.cli.record").folder({}, { comm = false })
    folder.add({ frames = { 'anon@[string "a;b"]:1', "f@tmpl one\ntwo:2", "main@x.lua:0" }, pid = 1 }, "task-clock")
    folder.add({ frames = { "leaf\r" }, pid = 1 }, "task-clock")
    assert.same({ 'task-clock;leaf  1', 'task-clock;main@x.lua:0;f@tmpl one two:2;anon@[string "a:b"]:1 1' },
                folder.lines())
  end)
end)
