-- pe.profile: Lua-level profiles, checked against os.clock's time around
-- each function, jit.util's trace numbers and machine code addresses
-- (perfmap=true), and functions planted here and in
-- spec/support/profile_work.lua.
local pe = require("perf_event")
local stats = require("support.stats")

local jit = rawget(_G, "jit")
local srep = string.rep   -- an upvalue: busted's global environment would keep the loop from compiling
local WORK = "spec/support/profile_work.lua"

-- first and last line of each `local function NAME` in a source file
local function ranges(path)
  local r, cur = {}, nil
  local n = 0
  for l in io.lines(path) do
    n = n + 1
    local name = l:match("^local function ([%w_]+)")
    if name then cur = name; r[name] = { n } end
    if cur and l:match("^end") then r[cur][2] = n; cur = nil end
  end
  return r
end

-- runs the workload (its own os.clock times around each function);
-- returns os.clock's shares and ours, each normalised over the workload's
-- three functions, our samples in them and our report's lines. (-jp in the
-- same process would own LuaJIT's profiler: the profile would have C leaf
-- frames only.)
local function run_work(mode)
  local out = os.tmpname()
  -- 2999 Hz into an 8 MiB ring: no sample is lost before stop() reads them
  local env = "PE_PROF_FREQ=2999 PE_PROF_PAGES=2048 "
  if os.getenv("PE_BUILD") then env = env .. "PE_BUILD=" .. os.getenv("PE_BUILD") .. " " end
  local f = assert(io.popen(env .. "luajit " .. WORK .. " " .. mode .. " " .. out .. " 2>&1"))
  local text = f:read("*a")
  f:close()
  local ours, report = {}, {}
  for l in io.lines(out) do report[#report + 1] = l end
  os.remove(out)
  assert.equal("mode safepoint nil", report[1], text)
  local clk = {}
  for _, l in ipairs(report) do
    local c, name = l:match("^top (%d+) ([%w_]+)@spec/support/profile_work%.lua:%d+$")
    if c then ours[name] = tonumber(c) end
    local a, b, g = l:match("^clock alpha=([%d.]+) beta=([%d.]+) gamma=([%d.]+)$")
    if a then clk = { alpha = tonumber(a), beta = tonumber(b), gamma = tonumber(g) } end
  end
  local function norm(t)
    local s = 0
    for _, k in ipairs({ "alpha", "beta", "gamma" }) do s = s + (t[k] or 0) end
    local o = {}
    for _, k in ipairs({ "alpha", "beta", "gamma" }) do o[k] = s > 0 and 100 * (t[k] or 0) / s or 0 end
    return o, s
  end
  local cn = norm(clk)
  local on, total = norm(ours)
  return cn, on, total, report
end

-- each function's share of our `total` samples against its share of
-- os.clock time, within the exact binomial bound (odds 1e-6) plus 2 points
-- (systematic: a window's edges, the os.clock calls): ok, or false and what
-- differs
local function close(want, ours, total, report)
  for _, k in ipairs({ "alpha", "beta", "gamma" }) do
    local ok, why = stats.share(k, math.floor(ours[k] * total / 100 + 0.5), total, want[k] / 100, 0.02)
    if not ok then
      return false, why .. "\n" .. table.concat(report, "\n", 1, math.min(#report, 12))
    end
  end
  return true
end

-- the workload in `mode` judged by close(), in a window taken again when
-- steal spoiled it; returns the report and whether it was close, and why
local function judged_run(mode)
  return stats.measure(function()
    local want, ours, total, rep = run_work(mode)
    assert.is_true(total >= 500, "samples " .. total)
    local good, why = close(want, ours, total, rep)
    return rep, good, why
  end, { what = "the " .. mode .. " workload", delay = false })
end

-- the innermost Lua frame of a resolved sample
local function innermost_lua(frames)
  for i = #frames, 1, -1 do if frames[i].lua then return frames[i] end end
  return nil
end

local function check_lines(report, want_kind)
  local r = ranges(WORK)
  local kinds = report[2]
  local n = 0
  for _, l in ipairs(report) do
    -- folded lines: the workload's frames, each at a line of its function
    local stack, c = l:match("^(%S.-) (%d+)$")
    if stack and not l:match("^top ") and not l:match("^kinds ") and not l:match("^mode ") then
      for name, line in stack:gmatch("([%w_]+)@spec/support/profile_work%.lua:(%d+)") do
        local rg = r[name]
        if rg then
          line = tonumber(line)
          assert.is_true(line >= rg[1] and line < rg[2],
                         name .. " sampled at line " .. line .. " outside " .. rg[1] .. "-" .. rg[2])
          n = n + tonumber(c)
        end
      end
    end
  end
  assert.is_true(n > 0)
  local k = tonumber(kinds:match(want_kind .. "=(%d+)"))
  return n, k
end

describe("pe.profile", function()
  if not jit then
    -- PUC Lua: C leaf frames, named from the ELF symbols of the interpreter
    -- (lua=false: the hook mode of PUC Lua is checked in profile_puc_spec.lua)
    it("gives C leaf frames only, named from ELF symbols", function()
      local p = assert(pe.profile.start({ freq = 999, lua = false }))
      finally(function() p:stop() end)
      local t0 = os.clock()
      local s = 0
      while os.clock() - t0 < 0.3 do
        for i = 1, 10000 do s = s + i % 7 end
      end
      p:stop()
      assert.equal("c", p.mode)
      assert.equal("lua=false", p.reason)
      -- cpu-clock at 999 Hz over 0.3 s of this thread's CPU time
      assert.is_true(p.nsamples >= 150, "samples: " .. p.nsamples)
      local k = p:kinds()
      assert.equal(p.nsamples, k.c)
      -- the interpreter's own module: the executable mapped first in
      -- /proc/self/maps, or the liblua it links (Debian strips both, so
      -- the frame is the module in brackets)
      local f = assert(io.open("/proc/self/maps"))
      local exe = f:read("*l"):match("(/%S+)$"):match("([^/]+)$")
      f:close()
      local interp = 0
      for _, e in ipairs(p:top()) do
        if e.name == "[" .. exe .. "]" or e.name:match("^%[liblua") or e.name:match("^lua[%u_]") then
          interp = interp + e.count
        end
      end
      local ok, why = stats.at_least("samples in " .. exe, interp, p.nsamples, 0.9)
      assert.is_true(ok, why)
    end)
    return
  end

  local jutil = require("jit.util")

  it("self-test: the safe point's capture agrees with debug.getinfo; GCfuncL.pc and the prototype header"
     .. " agree with jit.util.funcbc", function()
    local st = pe.profile.selftest()
    assert.is_true(st.ok, tostring(st.reason))
    -- the capture's frames against debug.getinfo at every level of the
    -- known stacks (nested, pcall, table.sort, a compiled loop, coroutines)
    assert.is_true(st.safepoint.ok, tostring(st.safepoint.reason))
    assert.is_true(st.safepoint.checked >= 20, st.safepoint.checked)
    -- the layout perf_event.luamap's bytecode ranges rely on
    assert.is_true(st.layout.ok, tostring(st.layout.reason))
    assert.equal(0, st.layout.proto_bc % 8)
  end)

  it("JIT-compiled: per-function shares match os.clock's, lines inside the function", function()
    -- (a burst of steal gives the loop it hits more samples than CPU
    -- time: a window with more than stats.MAX_STEAL stolen is taken again)
    local report, ok, msg = judged_run("jit")
    assert.is_true(ok, msg)
    -- almost every sample's leaf is the workload's Lua frame, at a line of
    -- its function (alpha's i % 7 calls lj_vm_modi: that helper of the
    -- trace is a C leaf under alpha)
    local n, lua = check_lines(report, "interp")
    assert.is_true(lua >= 0.8 * n, ("Lua leaf %d of %d"):format(lua, n))
  end)

  it("interpreted (jit.off): per-function shares match os.clock's, lines inside the function", function()
    local report, ok, msg = judged_run("interp")
    assert.is_true(ok, msg)
    local n, interp = check_lines(report, "interp")
    assert.equal(0, tonumber(report[2]:match("trace=(%d+)")))
    assert.equal(0, tonumber(report[2]:match("caller=(%d+)")))
    assert.is_true(interp >= 0.9 * n, "interp " .. interp .. " of " .. n)
  end)

  it("perfmap=true registers traces with jit.util's numbers and addresses, and forgets them on a flush", function()
    local function planted_loop(n)
      local s = 0
      for i = 1, n do s = s + (i % 11) end
      return s
    end
    local p = assert(pe.profile.start({ freq = 999, perfmap = true }))   -- the trace registry (p.reg)
    finally(function() p:stop() if p.perfmap_path then os.remove(p.perfmap_path) end end)
    assert.equal("safepoint", p.walk)
    local t0 = os.clock()
    while os.clock() - t0 < 0.2 do planted_loop(1e5) end
    local reg = p.reg
    local live = 0
    local line0 = debug.getinfo(planted_loop, "S").linedefined
    local seen_planted = false
    for tr, e in pairs(reg.live) do
      live = live + 1
      local code, addr = jutil.tracemc(tr)
      assert.equal(addr, e.lo)
      assert.equal(addr + #code, e.hi)
      if e.info.name == "planted_loop" then
        seen_planted = true
        assert.equal(line0, e.info.linedefined)
      end
    end
    assert.is_true(live > 0, "no live trace")
    assert.is_true(seen_planted, "no trace starts in planted_loop")
    assert.is_true(reg.ntraces >= live)
    -- (the safe point's arm may have flushed once: LuaJIT's profiler mode)
    local nflush, before = reg.nflush, {}
    for _, e in pairs(reg.live) do before[e] = true end
    jit.flush()
    -- after the flush no trace of before is live (their addresses are
    -- reused); busted's own code may compile a new one meanwhile
    assert.equal(nflush + 1, reg.nflush)
    for _, e in pairs(reg.live) do assert.is_nil(before[e], e.info.name) end
    p:stop()
    -- the samples: planted_loop's lines, from the safe point
    local hits = 0
    for _, frames in ipairs(p.samples) do
      local f = innermost_lua(frames)
      if f and f.lua.name == "planted_loop" then
        hits = hits + 1
        assert.is_true(f.line > line0 and f.line < line0 + 4, "line " .. f.line)
      end
    end
    assert.is_true(hits >= 0.5 * p.nsamples, hits .. " of " .. p.nsamples)
  end)

  it("names a C leaf in libc under its JIT-compiled Lua caller (string.rep)", function()
    local function planted_rep(n)
      local t = 0
      for i = 1, n do t = t + #srep("x", 200000 + i % 3) end
      return t
    end
    -- the driving loop stays interpreted, so planted_rep's own loop is
    -- the trace that calls string.rep (not an outer trace inlining it)
    local function drive()
      local t0 = os.clock()
      while os.clock() - t0 < 0.3 do planted_rep(500) end
    end
    jit.off(drive)
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    drive()
    p:stop()
    local under, wrong, libc = 0, 0, 0
    for _, frames in ipairs(p.samples) do
      local leaf = frames[#frames]
      -- C outside the VM: libc's memset/memcpy (or ASan's interceptors)
      if leaf.c and leaf.c ~= "[unknown]" and not leaf.c:match("^%[luajit") and not leaf.c:match("^%[vdso") then
        libc = libc + 1
        local caller = frames[#frames - 1]
        if caller and caller.lua then
          if caller.lua.name == "planted_rep" then under = under + 1 else wrong = wrong + 1 end
        end
      end
    end
    -- string.rep's fill runs in libc; its caller is the Lua frame the
    -- safe point captured after it
    assert.is_true(stats.at_least("samples in libc", libc, p.nsamples, 0.5))
    assert.is_true(under >= 10, under .. " right, " .. wrong .. " wrong")
    assert.is_true(stats.at_least("libc leaves under planted_rep (of those with a Lua caller)", under,
                                  under + wrong, 0.8))
    if os.getenv("PE_SUITE") ~= "asan" then
      -- without ASan's interceptor frames the caller is found for nearly all
      assert.is_true(stats.at_least("libc leaves under planted_rep", under, libc, 0.8))
      -- the leaf: libc's fill, named from libc6-dbg's debug file when it is
      -- installed (__memset_*), else the stripped library's [libc.so.6]
      local folded = p:folded()
      assert.truthy(folded:find("planted_rep@spec/profile_spec.lua:%d+;%[libc.so.6%] %d+\n")
                    or folded:find("planted_rep@spec/profile_spec.lua:%d+;__mem[%w_]+ %d+\n"), folded)
    end
  end)

  it("names functions defined before start and loaded after it", function()
    local function planted_before(n)
      local s = 0
      for i = 1, n do s = s + (i % 3) * 2 end
      return s
    end
    jit.off(planted_before)
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    local f2 = assert(loadstring("return function(n) local s = 0 for i = 1, n do s = s + i % 5 end return s end",
                                 "=after"))()
    jit.off(f2)
    local t0 = os.clock()
    while os.clock() - t0 < 0.3 do planted_before(1e5) f2(1e5) end
    p:stop()
    local count = {}
    for _, e in ipairs(p:top()) do count[e.name] = e.count end
    local line = debug.getinfo(planted_before, "S").linedefined
    local b = count["planted_before@spec/profile_spec.lua:" .. line] or 0
    local a = count["anon@after:1"] or 0
    -- the rest is the loop's own line and, under ASan, its interceptors
    local both = os.getenv("PE_SUITE") == "asan" and 0.75 or 0.85
    local ok1, why1 = stats.at_least("planted_before", b, p.nsamples, 0.2)
    local ok2, why2 = stats.at_least("anon@after:1", a, p.nsamples, 0.2)
    local ok3, why3 = stats.at_least("the two", a + b, p.nsamples, both)
    assert.is_true(ok1 and ok2 and ok3, why1 .. "; " .. why2 .. "; " .. why3)
  end)

  for _, mode in ipairs({ "interp", "jit" }) do
    it("full Lua stacks (" .. mode .. "): one hot function under two callers shows both paths, root first", function()
      local function stk_leaf(n)
        local s = 0
        for i = 1, n do s = s + (i % 7) end
        return s
      end
      local function stk_via_a(n) return stk_leaf(n) + 1 end
      local function stk_via_b(n) return stk_leaf(n) * 2 end
      local function stk_top(t0)
        while os.clock() - t0 < 0.4 do stk_via_a(1e5) stk_via_b(1e5) end
      end
      if mode == "interp" then
        for _, f in ipairs({ stk_leaf, stk_via_a, stk_via_b, stk_top }) do jit.off(f) end
      end
      local p = assert(pe.profile.start({ freq = 999 }))
      finally(function() p:stop() end)
      assert.is_true(p.stacks, tostring(p.stacks_reason))
      stk_top(os.clock())
      p:stop()
      -- each caller's frame is at the line of its call, as debug.getinfo
      -- gives the functions' first lines
      local function at(f) return debug.getinfo(f, "S").linedefined end
      local top_line = at(stk_top) + 1
      local a = string.format("stk_top@spec/profile_spec.lua:%d;stk_via_a@spec/profile_spec.lua:%d;" ..
                              "stk_leaf@spec/profile_spec.lua:", top_line, at(stk_via_a))
      local b = string.format("stk_top@spec/profile_spec.lua:%d;stk_via_b@spec/profile_spec.lua:%d;" ..
                              "stk_leaf@spec/profile_spec.lua:", top_line, at(stk_via_b))
      local na, nb = 0, 0
      for l in p:folded():gmatch("[^\n]+") do
        local c = tonumber(l:match(" (%d+)$"))
        -- below busted's own frames, the path ends in stk_leaf's loop line
        if l:find(a .. (at(stk_leaf) + 2) .. " ", 1, true) then na = na + c end
        if l:find(b .. (at(stk_leaf) + 2) .. " ", 1, true) then nb = nb + c end
      end
      assert.is_true(na >= 0.25 * p.nsamples and nb >= 0.25 * p.nsamples,
                     string.format("via_a %d via_b %d of %d\n%s", na, nb, p.nsamples, p:folded()))
      -- nearly every sample had its signal (the last ones may come after
      -- stop, and the kernel may merge two wakeups into one: 93 % was seen
      -- with two make test running at once on 2 CPUs)
      assert.is_true(p.nsigs >= 0.85 * p.nsamples, p.nsigs .. " signals, " .. p.nsamples .. " samples")
    end)
  end

  it("a compiled tight loop 17 Lua frames deep shows its callers", function()
    local function deep_leaf(n)
      local s = 0
      for i = 1, n do s = s + (i % 7) end
      return s
    end
    local function deep_rec(d, n)
      if d == 0 then return deep_leaf(n) end
      return deep_rec(d - 1, n) + 1
    end
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    local t0 = os.clock()
    while os.clock() - t0 < 0.3 do deep_rec(15, 1e6) end
    p:stop()
    local rec_line = debug.getinfo(deep_rec, "S").linedefined
    local full, leafs = 0, 0
    for _, frames in ipairs(p.samples) do
      local n = #frames
      if frames[n].lua and frames[n].lua.name == "deep_leaf" then
        leafs = leafs + 1
        -- deep_rec frames above it, each at a line of deep_rec
        local k = 0
        for i = n - 1, 1, -1 do
          local f = frames[i]
          if not (f.lua and f.lua.name == "deep_rec") then break end
          assert.is_true(f.line >= rec_line and f.line <= rec_line + 3, "deep_rec line " .. f.line)
          k = k + 1
        end
        local ok = k >= 15
        if ok then full = full + 1 end
      end
    end
    assert.is_true(leafs >= 100, "deep_leaf samples " .. leafs)
    local ok, why = stats.at_least("deep_leaf samples with >= 15 deep_rec frames", full, leafs, 0.8)
    assert.is_true(ok, why .. "\n" .. p:folded())
  end)

  it("a fast function called by interpreted code counts for its Lua caller (math.sqrt)", function()
    local sqrt = math.sqrt
    local function ff_caller(n)
      local s = 0
      for i = 1, n do s = s + sqrt(i) end
      return s
    end
    jit.off(ff_caller)
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    local t0 = os.clock()
    while os.clock() - t0 < 0.3 do ff_caller(1e5) end
    p:stop()
    -- samples in the builtin: the builtin the signal found is the leaf of
    -- the stack captured at the next instruction, under ff_caller's call
    -- line (after a return and a new call of ff_caller, its first line,
    -- once in a while under ASan)
    local line = debug.getinfo(ff_caller, "S").linedefined + 2
    local under, at_call = 0, 0
    for _, frames in ipairs(p.samples) do
      local n = #frames
      if frames[n].c and n >= 2 and frames[n - 1].lua and frames[n - 1].lua.name == "ff_caller" then
        assert.is_true(frames[n - 1].line == line or frames[n - 1].line == line - 1, frames[n - 1].line)
        under = under + 1
        if frames[n - 1].line == line then at_call = at_call + 1 end
      end
    end
    assert.is_true(stats.at_least("samples in the builtin under ff_caller", under, p.nsamples, 0.05))
    assert.is_true(stats.at_least("of those, at the call line", at_call, under, 0.95))
    local top = p:top(1)[1]
    assert.matches("^ff_caller@", top.name)
    assert.is_true(stats.at_least(top.name, top.count, p.nsamples, 0.85))
  end)

  -- C functions called from Lua: each workload's loop is one line, so the
  -- call's line is also the line a trace over the loop starts at
  local cw_ffi, cw_buf = require("ffi"), nil
  pcall(cw_ffi.cdef, "void *memset(void *s, int c, size_t n);")
  local cw_memset = cw_ffi.C.memset
  local cw_concat, cw_format, cw_tostring = table.concat, string.format, tostring
  local cw_parts = {}
  for i = 1, 2000 do cw_parts[i] = "abcdefghij" .. i end
  local function cw_cat(n) local s = 0 for _ = 1, n do s = s + #cw_concat(cw_parts, ",") end return s end
  local function cw_fmt(n) local s = 0 for i = 1, n do s = s + #cw_format("%d %s %.17g", i, "x", i / 7) end return s end
  local function cw_ffi_fill(n) for i = 1, n do cw_memset(cw_buf, i % 256, 1048576) end end
  local function cw_tostr(n) local s = 0 for i = 1, n do s = s + #cw_tostring(i / 7 + 1e300) end return s end
  local cworks = { { "cw_cat", cw_cat, 50 }, { "cw_fmt", cw_fmt, 20000 }, { "cw_ffi_fill", cw_ffi_fill, 50 },
                   { "cw_tostr", cw_tostr, 20000 } }
  -- what each mode must reach: the share of a workload's samples with a C
  -- leaf whose nearest Lua frame is the workload at its call line.
  -- Measured on a loaded 2-core VM: 89-98 % interpreted, 71-98 % compiled
  -- (table.concat's the lowest)
  -- under ASan its interceptors' own frames and a stale cur_L->base (see
  -- doc/internals/safepoint.md) took 116 of 202 compiled C leaves once
  local cw_min = { interp = 0.8, jit = os.getenv("PE_SUITE") == "asan" and 0.5 or 0.6 }

  for _, mode in ipairs({ "interp", "jit" }) do
    it("a C function called from Lua sits under its caller at the call line (" .. mode
       .. "): table.concat, string.format, an FFI call into libc, tostring", function()
      cw_buf = cw_buf or cw_ffi.new("char[?]", 1048576)
      local report = {}
      for _, w in ipairs(cworks) do
        local name, fn, n = w[1], w[2], w[3]
        if mode == "interp" then jit.off(fn) else jit.on(fn) end
        local p = assert(pe.profile.start({ freq = 999 }))
        finally(function() p:stop() end)
        assert.is_true(p.stacks, tostring(p.stacks_reason))
        local t0 = os.clock()
        while os.clock() - t0 < 0.3 do fn(n) end
        p:stop()
        local line = debug.getinfo(fn, "S").linedefined
        local cleaf, under, wrong = 0, 0, 0
        for _, frames in ipairs(p.samples) do
          local k = #frames
          if frames[k].c then
            local up
            for i = k - 1, 1, -1 do if frames[i].lua then up = frames[i] break end end
            if up and up.lua.name == name then
              cleaf = cleaf + 1
              if up.line == line then under = under + 1 else wrong = wrong + 1 end
            elseif up == nil or up.lua.chunk ~= "spec/profile_spec.lua" or up.lua.name ~= "anon" then
              -- a C leaf with no caller, or not under the workload (the
              -- driving loop's own lines are this spec's anon function)
              cleaf = cleaf + 1
              if os.getenv("PE_PROF_REPORT") then
                local t = {}
                for i = math.max(1, k - 3), k do
                  t[#t + 1] = frames[i].c or pe.profile.frame_name(frames[i].lua, frames[i].line)
                end
                io.stderr:write("missed ", name, " ", table.concat(t, ";"), "\n")
              end
            end
          end
        end
        report[#report + 1] = string.format("%s %d/%d of %d", name, under, cleaf, p.nsamples)
        -- the C part is a real share of the time, and (nearly) all of it
        -- is under the workload at its call line
        local ok, why = stats.at_least(name .. ": samples with a C leaf", cleaf, p.nsamples, 0.2)
        assert.is_true(ok, why .. "; " .. table.concat(report, ", ") .. "\n" .. p:folded())
        ok, why = stats.at_least(name .. ": C leaves under the workload", under, cleaf, cw_min[mode])
        assert.is_true(ok, why .. "; " .. table.concat(report, ", ") .. "\n" .. p:folded())
        assert.equal(0, wrong)
      end
      if os.getenv("PE_PROF_REPORT") then io.stderr:write(mode, ": ", table.concat(report, ", "), "\n") end
    end)
  end

  it("names the builtin a jit.off() loop calls as the leaf under its caller (math.sqrt, string.byte)", function()
    local sqrt, sbyte = math.sqrt, string.byte
    local text = string.rep("abcdefgh", 64)
    local function bi_sqrt(n) local s = 0 for i = 1, n do s = s + sqrt(i) end return s end
    local function bi_byte(n) local s = 0 for _ = 1, n do s = s + sbyte(text, 1, 64) end return s end
    for _, w in ipairs({ { bi_sqrt, "math.sqrt", 1e5 }, { bi_byte, "string.byte", 1e4 } }) do
      local fn, bname, n = w[1], w[2], w[3]
      jit.off(fn)
      local p = assert(pe.profile.start({ freq = 999 }))
      finally(function() p:stop() end)
      local t0 = os.clock()
      while os.clock() - t0 < 0.3 do fn(n) end
      p:stop()
      -- the address behind the name: the function LuaJIT's %p gives
      local addr = tonumber(string.format("%p", bname == "math.sqrt" and sqrt or sbyte):match("0x(%x+)"), 16)
      assert.equal(bname, p.builtins[addr])
      local named, unnamed = 0, 0
      local lname = bname == "math.sqrt" and "bi_sqrt" or "bi_byte"
      local want = lname .. "@spec/profile_spec.lua:" .. debug.getinfo(fn, "S").linedefined .. ";" .. bname .. " "
      for l in p:folded():gmatch("[^\n]+") do
        local c = tonumber(l:match(" (%d+)$"))
        if l:find(want, 1, true) then named = named + c end
        if l:find(lname .. "@spec/profile_spec.lua:%d+;%[luajit%] %d+$") then unnamed = unnamed + c end
      end
      if os.getenv("PE_PROF_REPORT") then
        io.stderr:write(string.format("builtin %s: %d named, %d [luajit] of %d\n", bname, named, unnamed, p.nsamples))
      end
      -- builtin samples in LuaJIT's own (stripped) code are named, not
      -- [luajit]; a few remain in the call/return sequence, where rdx is
      -- not yet (or no longer) the builtin's BASE
      local ok1, why1 = stats.at_least(bname .. " named", named, p.nsamples, 0.05)
      local ok2, why2 = stats.at_most(bname .. " as [luajit], of those named or not", unnamed, named + unnamed, 0.2)
      assert.is_true(ok1 and ok2, why1 .. "; " .. why2 .. "\n" .. p:folded())
    end
  end)

  it("attributes code in coroutines, and survives trace flushes and GC of profiled functions", function()
    local co_hot = function(n)
      local s = 0
      for i = 1, n do s = s + (i % 9) end
      return s
    end
    jit.off(co_hot)
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    local co = coroutine.wrap(function()
      while true do coroutine.yield(co_hot(2e5)) end
    end)
    local t0 = os.clock()
    while os.clock() - t0 < 0.2 do co() end
    local t1 = os.clock()
    -- generated chunks: compiled, flushed, collected, 40 times over
    for g = 1, 40 do
      local f = assert(loadstring("local s = 0 for i = 1, 2e5 do s = s + i % 13 end return s", "=gen" .. g))
      f() f()
      jit.flush()
      f = nil   -- luacheck: ignore 311
      collectgarbage()
    end
    p:stop()
    local t2 = os.clock()
    local co_n, gen_n, other = 0, 0, 0
    local line = debug.getinfo(co_hot, "S").linedefined
    for _, frames in ipairs(p.samples) do
      local f = innermost_lua(frames)
      if f then
        if f.lua.chunk == "spec/profile_spec.lua" and f.lua.linedefined == line then co_n = co_n + 1
        elseif f.lua.chunk:match("^gen%d+$") then gen_n = gen_n + 1
        elseif f.lua.chunk ~= "spec/profile_spec.lua" then other = other + 1 end
      end
    end
    -- co_hot ran about 0.2 s of CPU, the generated chunks at least 40 x 2
    -- loops of 2e5 iterations; the drivers' lines are this file's (with
    -- the full collections' time: the safe point comes after
    -- collectgarbage returns, at its caller's line), and no other Lua
    -- function is the leaf but busted's few
    -- co_hot's due: its 0.2 s at the rate the whole window got (the kernel
    -- lowers a rate it finds too costly), half of it up to Poisson sampling
    local enough, why = stats.count_at_least("co_hot", co_n, (t1 - t0) * #p.samples / (t2 - t0), 0.5)
    assert.is_true(enough, why)
    assert.is_true(gen_n >= 10, "gen " .. gen_n)
    assert.is_true(other <= 0.05 * (co_n + gen_n), "other " .. other .. "\n" .. p:folded())
  end)

  it("soak: start/drain/stop cycles with coroutines, flushes and GC; each cycle names only its own code", function()
    local cycles, report = 0, {}
    local t_end = os.clock() + 3
    local parts = {}
    for i = 1, 500 do parts[i] = "soak" .. i end
    while os.clock() < t_end or cycles < 6 do
      cycles = cycles + 1
      -- fresh code each cycle: a loop, a C call (table.concat) and a
      -- builtin (string.rep), run in a coroutine that yields every round
      local src = "local parts, concat, rep = ... return function(n) local s = 0 while true do "
        .. "for i = 1, n do s = s + (i % 13) end s = s + #concat(parts) + #rep('z', 5000) "
        .. "coroutine.yield(s) end end"
      -- loaded before start (found through this frame's locals) or after
      -- it (jit.attach's bc event); JIT-compiled or interpreted
      local mk, body, p
      if cycles % 3 ~= 0 then
        mk = assert(loadstring(src, "=soak" .. cycles))
        body = mk(parts, table.concat, string.rep)
      end
      p = assert(pe.profile.start({ freq = 999 }))
      finally(function() p:stop() end)
      if not mk then
        mk = assert(loadstring(src, "=soak" .. cycles))
        body = mk(parts, table.concat, string.rep)
      end
      if cycles % 2 == 0 then jit.off(body) end
      local co = coroutine.wrap(body)
      local t0 = os.clock()
      while os.clock() - t0 < 0.1 do co(20000) end
      p:drain()
      jit.flush()
      t0 = os.clock()
      while os.clock() - t0 < 0.1 do co(20000) end
      co, body, mk = nil, nil, nil   -- luacheck: ignore 311
      collectgarbage()
      collectgarbage()
      p:stop()
      local own, foreign = 0, 0
      for _, frames in ipairs(p.samples) do
        for _, f in ipairs(frames) do
          local c = f.lua and f.lua.chunk:match("^soak(%d+)$")
          if c then
            if tonumber(c) == cycles then own = own + 1 else foreign = foreign + 1 end
            break
          end
        end
      end
      report[#report + 1] = string.format("%d:%d/%d", cycles, own, p.nsamples)
      -- about 0.2 s of the coroutine's CPU time at 999 Hz; no sample is
      -- named after an earlier cycle's (collected) code whose addresses
      -- the new code may reuse
      assert.is_true(own >= 50, table.concat(report, " "))
      assert.equal(0, foreign)
      assert.is_true(p.nsigs >= 0.8 * p.nsamples, p.nsigs .. " signals, " .. p.nsamples .. " samples")
    end
    if os.getenv("PE_PROF_REPORT") then io.stderr:write("soak ", table.concat(report, " "), "\n") end
  end)

  it("SIGIO does not end the process: the safe point's handler takes it and counts it", function()
    local ffi = require("ffi")
    pcall(ffi.cdef, "int raise(int sig);")
    -- a period of 1 s of CPU time: no sample comes by itself during the
    -- test; the fd's own signal (F_SETSIG), whose queue may overflow
    local p = assert(pe.profile.start({ period = 1e9, sigtrap = false }))
    finally(function() p:stop() end)
    assert.equal("safepoint", p.walk)
    assert.is_false(p.sigtrap)
    -- the plain SIGIO the kernel sends when it cannot queue the signal is
    -- taken by the handler (its default action would end the process)
    local f = assert(io.open("/proc/self/status"))
    local cgt = assert(f:read("*a"):match("SigCgt:%s*(%x+)"))
    f:close()
    local bit29 = math.floor(tonumber(cgt:sub(-8), 16) / 2 ^ 28) % 2   -- SIGIO = 29
    assert.equal(1, bit29)
    -- (by lj/signal.c's handler: the safe-point profile armed first in
    -- this process took SIGIO)
    local LP = pe.core._private
    local s0 = LP.luasafe_stats().throttled
    assert.equal(0, ffi.C.raise(29))
    assert.equal(s0 + 1, LP.luasafe_stats().throttled)
    p:stop()
    assert.equal(s0 + 1, p.sig_throttled)   -- (the process's count)
  end)

  it("a C function called in a coroutine and one called in the main thread each sit under their own caller", function()
    local parts, concat, rep = {}, table.concat, string.rep
    for i = 1, 2000 do parts[i] = "abcdefghij" end
    local function co_side() while true do local s = #concat(parts) coroutine.yield(s) end end
    local function main_side() return #rep("y", 200000) end
    local function drive()
      local co = coroutine.wrap(co_side)
      local t0 = os.clock()
      while os.clock() - t0 < 0.4 do co() main_side() end
    end
    jit.off(co_side) jit.off(main_side) jit.off(drive)
    local p = assert(pe.profile.start({ freq = 999 }))
    finally(function() p:stop() end)
    drive()
    p:stop()
    local co_ok, main_ok, crossed = 0, 0, 0
    for _, frames in ipairs(p.samples) do
      local names = {}
      for _, f in ipairs(frames) do names[#names + 1] = f.c or f.lua.name end
      local k = table.concat(names, ";")
      -- the coroutine's stack: under drive, which resumed it; the main
      -- thread's runs through drive
      if k:find("co_side;table.concat", 1, true) then
        local joined = k:find("drive;coroutine.wrap", 1, true) ~= nil
        if k:find("main_side", 1, true) or not joined then crossed = crossed + 1
        else co_ok = co_ok + 1 end
      elseif k:find("drive;main_side;string.rep", 1, true) then
        if k:find("co_side", 1, true) then crossed = crossed + 1 else main_ok = main_ok + 1 end
      elseif k:find("string.rep", 1, true) or k:find("table.concat", 1, true) then
        crossed = crossed + 1
      end
    end
    local ok1, why1 = stats.at_least("in the coroutine", co_ok, p.nsamples, 0.2)
    local ok2, why2 = stats.at_least("in the main thread", main_ok, p.nsamples, 0.2)
    assert.is_true(ok1 and ok2, why1 .. "; " .. why2 .. "\n" .. p:folded())
    assert.equal(0, crossed)
  end)

  it("writes a perf map that names the traces for the perf tool", function()
    local f = io.popen("command -v perf")
    local perf = f:read("*l")
    f:close()
    if not perf then pending("no perf tool") return end
    local data = os.tmpname()
    local env = os.getenv("PE_BUILD") and ("PE_BUILD=" .. os.getenv("PE_BUILD") .. " ") or ""
    f = assert(io.popen("perf record -q -e cpu-clock:u -o " .. data .. " -- env " .. env
                        .. "luajit spec/support/profile_perfmap.lua 2>&1"))
    local out = f:read("*a")
    f:close()
    local map = out:match("map (%S+)")
    -- every live trace has its line, with jit.util.tracemc's address and size
    assert.truthy(map, out)
    assert.is_true(tonumber(out:match("ok (%d+)")) >= 1, out)
    f = assert(io.popen("perf report -i " .. data .. " --stdio --sort sym 2>/dev/null"))
    local rep = f:read("*a")
    f:close()
    os.remove(data)
    os.remove(map)
    local pct = rep:match("([%d%.]+)%%%s+%[%.%] mapped_hot@spec/support/profile_perfmap%.lua:%d+ %[trace %d+%]")
    assert.truthy(pct, rep)
    assert.is_true(tonumber(pct) >= 50, rep)
  end)

  it("perf_event.autoprofile profiles a whole run given with luajit -l", function()
    local out = os.tmpname()
    local build = os.getenv("PE_BUILD") or "build"
    local script = os.tmpname()
    local sf = assert(io.open(script, "w"))
    sf:write("local function whole_run(n)\n  local s = 0\n  for i = 1, n do s = (s * 7 + i) % 65521 end\n",
             "  return s\nend\nfor _ = 1, 30 do whole_run(1e6) end\n")
    sf:close()
    local cmd = "LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='" .. build .. "/?.so;;' PE_PROFILE_OUT=" .. out
      .. " luajit -l perf_event.autoprofile " .. script
    local rc = os.execute(cmd)
    assert.is_true(rc == 0 or rc == true)
    local total, hot = 0, 0
    for l in io.lines(out) do
      local c = tonumber(l:match(" (%d+)$"))
      total = total + c
      -- the loop's line, in the function named from the script's text,
      -- called from the main chunk's line 6
      if l == "main@" .. script .. ":6;whole_run@" .. script .. ":3 " .. c then hot = hot + c end
    end
    os.remove(out)
    os.remove(script)
    assert.is_true(total >= 50, "samples " .. total)
    assert.is_true(stats.at_least("samples in whole_run's loop", hot, total, 0.8))
  end)

  it("stop is idempotent and the folded text is 'a;b N' lines, most first", function()
    local p = assert(pe.profile.start())
    finally(function() p:stop() end)
    local t0 = os.clock()
    while os.clock() - t0 < 0.05 do end
    p:stop()
    p:stop()
    local last, total = math.huge, 0
    for l in p:folded():gmatch("[^\n]+") do
      local c = tonumber(l:match(" (%d+)$"))
      assert.is_true(c <= last)
      last = c
      total = total + c
    end
    assert.equal(p.nsamples, total)
    -- aggregate(): the same groups as the folded lines, frames root first
    local n, folded = 0, p:folded()
    for _, e in ipairs(p:aggregate()) do
      n = n + e.count
      assert.truthy(folded:find(e.key .. " " .. e.count .. "\n", 1, true))
      local leaf = e.frames[#e.frames]
      if leaf.c and leaf.addr then assert.is_number(leaf.addr) end
    end
    assert.equal(p.nsamples, n)
    assert.matches("perf_event.profile%(cpu%-clock, " .. p.mode .. ", %d+ samples%)", tostring(p))
    assert.equal("safepoint", p.mode)
  end)
end)
