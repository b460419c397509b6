--- perf_event.profile.safepoint: pe.profile's Lua stacks on LuaJIT, taken
-- at a safe point through LuaJIT's own profiler hook (csrc/lj/safepoint.c
-- and the files beside it)
-- (not a public interface: pe.profile.start uses it).
--
-- Each sample of the profile's event signals the thread; when it runs Lua,
-- the handler arms LuaJIT's profiler hook, and the VM calls the capture at
-- its next instruction (a trace exits at its next line check): the capture
-- walks the frames there, interns the stack and gives its id to the
-- signal's record. `drain` takes the signals' records (each has its
-- sample's ip; the ring's samples are only counted) and turns each
-- distinct (stack, leaf, ip) into profile frames: `{lua=info, line=}` and `{c=name}` for the C
-- functions on the stack (table.sort, pcall, ...) and for a C function the
-- signal found running (string.format), root first. A coroutine's frames
-- come under the frames of the code that resumed it.
-- @module perf_event.profile.safepoint

local tostring, ipairs, pairs, format, floor, sort, concat, remove, insert =
  tostring, ipairs, pairs, string.format, math.floor, table.sort, table.concat, table.remove, table.insert
local debug, coroutine, require, rawget, pcall, error = debug, coroutine, require, rawget, pcall, error

local M = {}

local FLAG_TRUNC, FLAG_UNJOINED = 1, 2

local jit = rawget(_G, "jit")
local now = require("perf_event.profile.raw").now
local last_at = require("perf_event.symbols")._last_at
local labels = require("perf_event.profile.labels")

local KEYW = 11   -- numbers per key of luasafe_take (csrc/lj/match.c)

-- the C core's private functions (luasafe_*): perf_event.core itself, so
-- that this file needs nothing of perf_event's init.lua
local function core_private()
  return require("perf_event.core")._private
end

-- ---------------------------------------------------------------- self-test

-- a stack of words (as luasafe_here/read give them) as a list of frames,
-- leaf first: {lua = true, source, linedefined, currentline} or {c = true}
local function word_frames(w, chunks)
  local out = {}
  for i = #w - 5, 3, -6 do
    if w[i] == 0 then
      out[#out + 1] = { source = chunks[w[i + 1]], linedefined = w[i + 2], lastlinedefined = w[i + 3],
                        currentline = w[i + 4] }
    else
      out[#out + 1] = { c = true }
    end
  end
  return out
end

-- debug.getinfo's levels from `level` down, leaf first (of thread th, or this one)
local function levels(level, th)
  local out = {}
  while true do
    local i
    if th then i = debug.getinfo(th, level, "Sl") else i = debug.getinfo(level + 1, "Sl") end
    if not i then break end
    if i.what == "C" then out[#out + 1] = { c = true }
    else out[#out + 1] = { source = i.source, linedefined = i.linedefined, currentline = i.currentline } end
    level = level + 1
  end
  return out
end

-- nil when same, else the first difference; prefix: got may go on
-- (the self-test runs in a coroutine: the capture joins the frames of the
-- threads that resumed it, which debug.getinfo does not see)
local function compare(got, want, what, prefix)
  if #got ~= #want and not (prefix and #got > #want) then
    return format("%s: %d frames, debug.getinfo has %d", what, #got, #want)
  end
  for i = 1, #want do
    local g, w = got[i], want[i]
    if (g.c ~= nil) ~= (w.c ~= nil) then return format("%s: frame %d is %s, debug.getinfo says %s", what, i,
                                                        g.c and "C" or "Lua", w.c and "C" or "Lua") end
    if not g.c and (g.source ~= w.source or g.linedefined ~= w.linedefined or g.currentline ~= w.currentline) then
      return format("%s: frame %d is %s:%d line %d, debug.getinfo says %s:%d line %d", what, i, tostring(g.source),
                    g.linedefined, g.currentline, tostring(w.source), w.linedefined, w.currentline)
    end
  end
end

local here_args

-- the capture's stack of the caller, leaf first, without luasafe_here's own frame
local function here()
  local w, chunks = core_private().luasafe_here(here_args[1], here_args[2])
  if not w then error(chunks, 0) end
  local f = word_frames(w, chunks)
  remove(f, 1)   -- luasafe_here
  remove(f, 1)   -- here
  return f, w[1]
end

-- the known stacks: each case returns got, want (leaf first)
local function st_leaf() local g, w = here(), levels(1) return g, w end
local function st_mid() local g, w = st_leaf() return g, w end
local function st_pcall()
  local _, g, w = pcall(function() local g2, w2 = here(), levels(1) return g2, w2 end)
  return g, w
end
local function st_sort()
  local g, w
  local t = { 5, 3, 8, 1 }
  sort(t, function(a, b) if not g then g, w = here(), levels(1) end return a < b end)
  return g, w
end
local function st_loop()
  -- called from a compiled loop (the call makes the trace exit or stitch)
  local g, w
  for i = 1, 300 do if i == 299 then g, w = here(), levels(1) end end
  return g, w
end
local function st_co(wrap)
  local co_g, co_w, co_flags
  local body = function() co_g, co_flags = here() co_w = levels(1) coroutine.yield() end
  local outer   -- the resumer's frames, at the line that resumes
  if wrap then local f = coroutine.wrap(body) outer = levels(1) f() else
    local co = coroutine.create(body)
    local ok, err
    -- (the resumer's frames taken at the line that resumes, the same line)
    outer = levels(1) ok, err = coroutine.resume(co)
    if not ok then error(err, 0) end
  end
  -- the coroutine's frames, then coroutine.resume or the wrap function,
  -- then the resumer's (whose line is the resume's)
  local want = {}
  for _, f in ipairs(co_w) do want[#want + 1] = f end
  -- run in a coroutine resumed from C (an nginx request's), the chain of
  -- resumers from the main thread breaks there: the coroutine's own
  -- frames come alone, marked (frames.unjoined)
  local _, ismain = coroutine.running()
  if not ismain and floor(co_flags / FLAG_UNJOINED) % 2 == 1 then return co_g, want end
  want[#want + 1] = { c = true }
  for _, f in ipairs(outer) do want[#want + 1] = f end
  return co_g, want
end

-- compiled lines: a loop of two lines, whose trace's snapshots the
-- capture reads (csrc/lj/layout.c, lj_trace_pc)
local function st_lines_loop(n)
  local a = 0
  for i = 1, n do
    a = (a + i % 7) * 3
    a = a % 1000003
  end
  return a
end

-- the self-test of compiled lines: luasafe_lines' reading of a function's
-- lines against jit.util.funcinfo at each bytecode, and of its loop's
-- trace's snapshots against jit.util.tracesnap (each snapshot's line in
-- the function). nil, or why not
local function lines_selftest(LP)
  local okj, util = pcall(require, "jit.util")
  if not okj or not jit.status() then return "the JIT is off" end
  local tr
  local function on_trace(what, t, fn) if what == "stop" and fn == st_lines_loop then tr = t end end
  local vmevent = require("perf_event.vmevent")
  vmevent.subscribe("trace", on_trace)
  local ok, err = pcall(st_lines_loop, 2000)
  vmevent.unsubscribe("trace", on_trace)
  if not ok then return "compiled lines: " .. tostring(err) end
  if not tr then return "compiled lines: the self-test's loop was not compiled" end
  local mc, addr = util.tracemc(tr)
  if not addr then return "compiled lines: no machine code" end
  local lines, snaps = LP.luasafe_lines(st_lines_loop, tr, addr, #mc)
  if not lines then return "compiled lines: " .. tostring(snaps) end
  local fi = util.funcinfo(st_lines_loop)
  for pos = 0, fi.bytecodes - 1 do
    local want = util.funcinfo(st_lines_loop, pos).currentline
    if lines[pos + 1] ~= want then
      return format("compiled lines: bytecode %d is line %s, jit.util.funcinfo says %s", pos,
                    tostring(lines[pos + 1]), tostring(want))
    end
  end
  if #snaps == 0 then return "compiled lines: no snapshot" end
  for i, sn in ipairs(snaps) do
    local want = util.tracesnap(tr, i - 1)
    if not want or want[0] ~= sn[1] then
      return format("compiled lines: snapshot %d has ref %d, jit.util.tracesnap says %s", i - 1, sn[1],
                    tostring(want and want[0]))
    end
    if sn[2] < fi.linedefined or sn[2] > fi.lastlinedefined then
      return format("compiled lines: snapshot %d is at line %d, outside the loop's function", i - 1, sn[2])
    end
  end
end

local selftest_result

--- The self-test at the first start: the capture's walk against
-- debug.getinfo at every level of known stacks (nested, through pcall,
-- a table.sort comparator, a compiled loop, coroutines resumed by
-- coroutine.resume and by a coroutine.wrap function).
-- @treturn table {ok=, reason=, checked=}
function M.selftest()
  if selftest_result then return selftest_result end
  if not jit then selftest_result = { ok = false, reason = "needs LuaJIT" } return selftest_result end
  local LP = core_private()
  if not LP.luasafe_here then
    selftest_result = { ok = false, reason = "no luasafe in the core" }
    return selftest_result
  end
  -- where the coroutine API is refused (nginx's init_worker_by_lua), the
  -- self-test fails without being remembered: a later start elsewhere
  -- (a request handler, a timer) runs it again
  local okw, wrapped = pcall(coroutine.wrap, function() end)
  local okr, running, ismain = pcall(coroutine.running)
  if not (okw and okr) then return { ok = false, reason = "self-test: " .. tostring(okw and running or wrapped) } end
  here_args = { coroutine.resume, wrapped }
  -- a core whose safe point is compiled out, or that finds no LuaJIT VM
  -- here, says why at its first call: that is the reason
  local w0, why0 = LP.luasafe_here(here_args[1], here_args[2])
  if not w0 then
    LP.luasafe_forget()
    selftest_result = { ok = false, reason = tostring(why0) }
    return selftest_result
  end
  local cases = { nested = st_mid, pcall = st_pcall, sort = st_sort, loop = st_loop,
                  coroutine = function() return st_co(false) end, wrap = function() return st_co(true) end }
  local names, checked = {}, 0
  for k in pairs(cases) do names[#names + 1] = k end
  sort(names)
  for _, k in ipairs(names) do
    local ok, g, w = pcall(cases[k])
    if not ok then selftest_result = { ok = false, reason = "self-test " .. k .. ": " .. tostring(g) } break end
    -- the capture goes to the root thread; debug.getinfo's outermost
    -- levels below the script (busted's, the interpreter's) are the same
    local why = compare(g, w, k, not ismain)
    if why then selftest_result = { ok = false, reason = "self-test " .. why } break end
    checked = checked + #w
  end
  LP.luasafe_forget()
  if not selftest_result then
    local why = lines_selftest(LP)
    LP.luasafe_lines_use(not why)
    selftest_result = { ok = true, checked = checked, lines = not why, lines_reason = why }
  end
  return selftest_result
end

-- ---------------------------------------------------------------- arming

--- Arms safe-point capture for profile p: its event p.ev was opened with
-- sigtrap and sig_data `trap`, or (trap nil) with a wakeup per sample.
-- @treturn true | nil, reason
function M.arm(p, lj_mode, trap)
  local st = M.selftest()
  if not st.ok then return nil, st.reason end
  local LP = core_private()
  local slot, got = LP.luasafe_arm(p.ev:fd(), coroutine.resume, here_args[2], lj_mode or "l", trap)
  if not slot then return nil, got end
  p.lj_mode = got   -- the mode LuaJIT's profiler runs in: the first armed profile's
  p.safe = { slot = slot, nstacks = 0, nchunks = 0, stacks = {}, chunks = {}, frames = {}, ipc = {}, nipc = 0,
             ranges = {}, rcache = {}, nrcache = 0, byk = {}, blab = {}, nkeys = 0, nresolved = 0 }
  p.labels = p.keep ~= false and {} or nil
  p.vmcount = { [0] = 0, 0, 0, 0, 0, 0 }   -- samples by VM state class since the start (labels.VM)
  labels.track(p)
  if p.block then LP.luasafe_block(slot) end   -- (before its event is enabled)
  return true
end

-- open: the event's fd is still open (else the slot is freed regardless)
function M.disarm(p, open)
  local s = p.safe
  if s then core_private().luasafe_disarm(s.slot, open and p.ev:fd() or nil) end
end

-- ---------------------------------------------------------------- drain

local MAPS_EVERY = 1e9   -- ns: /proc/self/maps reread at most this often

-- p.sym:lookup(a), the maps read again (at most once a second) when a is
-- in no mapping known (a library loaded since), unless `known`
local function lookup(p, a, known)
  local name, off, module, lo, hi = p.sym:lookup(a)
  if module == nil and not known then
    local t = now()
    if t - (p.maps_t or 0) > MAPS_EVERY then
      p.sym:load_maps("self")
      p.maps_t, p.maps_reads = t, (p.maps_reads or 0) + 1
      p.safe.ipc, p.safe.nipc, p.safe.ranges = {}, 0, {}
      name, off, module, lo, hi = p.sym:lookup(a)
    end
  end
  return name, off, module, lo, hi
end

local RANGES_MAX = 4096   -- symbol ranges a profile remembers

-- the C symbol at ip as an entry { name, module, lo, hi }, memoised per
-- profile: by ip, then by the address range the symbol covers, so that a
-- new ip in a function already seen costs a binary search, not a lookup
-- (in an nginx worker half the samples fell on a C address never seen
-- before); the entry's identity stands for the symbol in frames_of
local function ip_sym(p, ip, trace)
  local s = p.safe
  local e = s.ipc[ip]
  if e then return e end
  if s.nipc >= 4096 then s.ipc, s.nipc = {}, 0 end
  local r = s.ranges
  local best = last_at(r, 3, ip) or 0
  -- (a gap between mappings answers only a trace's samples: elsewhere a
  -- library loaded since may be there)
  if best > 0 and ip < r[best][4] and (r[best][2] or trace == 1) then
    e = r[best]
  else
    -- a trace's ip outside every mapping known is the trace's machine
    -- code (LuaJIT maps more as it compiles): no reread of the maps
    local name, _, module, a, b = lookup(p, ip, trace == 1)
    -- code no symbol covers: one name for the gap it is in (c_leaf and
    -- in_vm read "file+0x..." as "[file]" anyway)
    if module and name:find("+0x", 1, true) then name = "[" .. module .. "]" end
    e = { name, module, a, b }
    if s.ranges ~= r then r, best = s.ranges, 0 end   -- the maps were read again
    -- kept when it overlaps no range already known (sorted, disjoint)
    if a and b and a <= ip and ip < b and #r < RANGES_MAX and (module or trace == 1)
       and (best == 0 or r[best][4] <= a) and (not r[best + 1] or b <= r[best + 1][3]) then
      insert(r, best + 1, e)
    end
  end
  s.ipc[ip], s.nipc = e, s.nipc + 1
  return e
end

-- the profile's name for the C function or builtin at GCfunc address a
-- (lua_CFunction cf when known)
local function c_name(p, a, cf, ffid)
  local b = p.builtins
  if not b then
    b = p.helpers.builtins()
    p.builtins = b
    -- the builtins by ffid too: one not in a library table (ipairs'
    -- iterator) is named as LuaJIT's tostring names it, builtin#N
    local byff, jutil = {}, require("jit.util")
    for _, f in ipairs(b.functions) do
      local fi = jutil.funcinfo(f)
      if fi.ffid and not byff[fi.ffid] then byff[fi.ffid] = b[p.helpers.addr_of(f)] end
    end
    p.builtins_ffid = byff
  end
  -- (a C function by its table name, `cjson.encode`; another closure of it by
  -- its lua_CFunction)
  local n = b[a] or (ffid and p.builtins_ffid[ffid]) or (cf and b.cfuncs and b.cfuncs[cf])
  if n then return n end
  if ffid then return "builtin#" .. ffid end
  if cf and cf ~= 0 and p.sym then
    local name = ip_sym(p, cf)[1]   -- ("file+0x..." made "[file]" there)
    if name then return name end
  end
  return format("[C@0x%x]", cf and cf ~= 0 and cf or a)
end

local function u64(lo, hi)
  return (lo % 4294967296) + (hi % 4294967296) * 4294967296
end

-- the frames of stack id (root first), made once per profile
local function stack_frames(p, id)
  local s = p.safe
  local fr = s.frames[id]
  if fr then return fr end
  local w = s.stacks[id]
  local proto_info = p.helpers.proto_info
  fr = {}
  for i = 3, #w, 6 do
    local k = w[i]
    if k == 0 then
      fr[#fr + 1] = { lua = proto_info({ source = s.chunks[w[i + 1]] or "?", linedefined = w[i + 2],
                                         lastlinedefined = w[i + 3] }),
                      line = w[i + 4] >= 0 and w[i + 4] or w[i + 2] }
    elseif i > 3 or k ~= 2 then
      -- (the outermost C frame, the host's entry (lua_pcall's), is left out)
      local cf = k == 2 and u64(w[i + 4], w[i + 5]) or nil
      local name = k == 3 and "coroutine.wrap" or c_name(p, u64(w[i + 2], w[i + 3]), cf, k == 1 and w[i + 1] or nil)
      fr[#fr + 1] = { c = name, builtin = k ~= 2 or nil }
    end
  end
  if w[1] % 2 == FLAG_TRUNC then fr.truncated = true end
  if floor(w[1] / FLAG_UNJOINED) % 2 == 1 then fr.unjoined = true end
  fr.nleaf = 1
  s.frames[id] = fr
  return fr
end

-- a module's own file (not anonymous memory, "anon" to the symbols, or
-- a pseudo-file such as "[vdso]")
local function is_file(module)
  return module and module ~= "anon" and module:sub(1, 1) ~= "["
end

-- the VM's own code: the interpreter, or trace code (anonymous memory)
local function in_vm(name, module)
  return not is_file(module) or (module:find("luajit", 1, true) and (name:find("+0x", 1, true)
    or name:find("^lj_") or name:find("^%[")))
end

local function c_leaf(p, ip, e)
  e = e or ip_sym(p, ip)
  local name, module = e[1], e[2]
  if module and name:find("+0x", 1, true) then name = "[" .. module .. "]" end
  return { c = name, addr = ip, module = module }
end

-- the frames of one distinct sample: its ip, its stack id (0: none), the
-- builtin or C function the signal found running (0: none; cut: its frame
-- ends the stack), whether a trace ran (trace, 1)
local function resolve(p, ip, e, id, leafa, cut, trace)
  if id == 0 then
    local fr = { c_leaf(p, ip, e) }
    fr.nleaf = 1
    return fr
  end
  local fr = stack_frames(p, id)
  if #fr == 0 then
    fr = { c_leaf(p, ip, e) }
    fr.nleaf = 1
    return fr
  end
  local leaf = leafa ~= 0 and cut == 0
  local name, module = e[1], e[2]
  -- in a trace, LuaJIT's own code is a helper the trace called (string
  -- formatting, table resizing): kept as the leaf
  local vm = in_vm(name, module) and not (trace == 1 and is_file(module))
  if not leaf and vm then return fr end
  local out = {}
  for i = 1, #fr do out[i] = fr[i] end
  out.truncated, out.unjoined = fr.truncated, fr.unjoined
  local n = 0
  if leaf then out[#out + 1] = { c = c_name(p, leafa), builtin = true } n = 1 end
  if not vm then out[#out + 1] = c_leaf(p, ip, e) n = n + 1 end
  out.nleaf = n
  return out
end

local RCACHE_MAX = 4096   -- distinct samples whose frames a profile remembers

-- the frames of a distinct sample, remembered per profile (bounded): by
-- the C symbol at ip (ip_sym's entry: one per function, not per address;
-- a C leaf frame keeps the first address seen), then by stack id, cut and
-- trace in one number, then (rarely) by the running function the signal
-- found; no string is made
local function frames_of(p, s, id, leafa, cut, trace, ip)
  local e = s.ipc[ip] or ip_sym(p, ip, trace)
  local rc = s.rcache
  local byip = rc[e]
  if not byip then
    if s.nrcache >= RCACHE_MAX then rc, s.nrcache = {}, 0 s.rcache = rc end
    byip = {}
    rc[e] = byip
  end
  local k = id * 4 + cut * 2 + trace
  local fr
  if leafa ~= 0 then
    local byleaf = byip[-1 - k]
    if not byleaf then byleaf = {} byip[-1 - k] = byleaf end
    fr = byleaf[leafa]
    if not fr then
      fr = resolve(p, ip, e, id, leafa, cut, trace)
      byleaf[leafa], s.nrcache, s.nresolved = fr, s.nrcache + 1, s.nresolved + 1
    end
  else
    fr = byip[k]
    if fr then return fr end
    fr = resolve(p, ip, e, id, leafa, cut, trace)
    byip[k], s.nrcache, s.nresolved = fr, s.nrcache + 1, s.nresolved + 1
  end
  return fr
end

--- Takes the signals' records (each has its sample's ip and time; one
-- stands for the ring's samples the kernel signalled together, taken at
-- its ip: luasafe_take) and adds each sample's frames to p, once per
-- distinct sample of this drain (p:_count with its count for keep=false).
-- No pairs() here: a drain may run from a __gc (LuaJIT bug #1000).
function M.drain(p, final)
  local s = p.safe
  local keep = p.keep ~= false
  local keys, order, stacks, chunks, st = core_private().luasafe_take(s.slot, p.ev, s.nstacks, s.nchunks, final,
                                                                      keep)
  for id = s.nstacks + 1, st.nstacks do s.stacks[id] = stacks[id] end
  for id = s.nchunks + 1, st.nchunks do s.chunks[id] = chunks[id] end
  s.nstacks, s.nchunks = st.nstacks, st.nchunks
  p.capture_total_ns, p.captures, p.captures_slow = st.capture_ns, st.captures, st.captures_slow
  p.capture_ns = p.captures > 0 and p.capture_total_ns / p.captures or 0
  p.handler_total_ns, p.handlers, p.handlers_slow = st.handler_ns, st.handlers, st.handlers_slow
  p.handler_ns = p.handlers > 0 and p.handler_total_ns / p.handlers or 0
  p.sig_dropped, p.sig_throttled, p.sig_merged, p.sig_matched = st.dropped, st.throttled, st.merged, st.matched
  p.hook_unstuck = st.unstuck
  p.lost = st.lost
  p.nring = (p.nring or 0) + st.ring_samples
  p.nsigs = (p.nsigs or 0) + st.records
  local samples, byk = p.samples, s.byk
  s.nkeys = s.nkeys + #keys / KEYW
  local nsafe = p.nsafe or 0
  local count, get, pend, interned = p._count, labels.get, labels.pend, labels.interned()
  local block = p.block
  local labs, blab = p.labels, s.blab
  local vmc = p.vmcount
  for i = 1, #keys, KEYW do
    local id, cnt = keys[i], keys[i + 6]
    vmc[keys[i + 7]] = vmc[keys[i + 7]] + cnt
    local fr = frames_of(p, s, id, keys[i + 1], keys[i + 2], keys[i + 4], keys[i + 5])
    if id ~= 0 then nsafe = nsafe + cnt end
    -- (the label's memo read here: a call per key costs, interpreted)
    local vm, route, ctx = keys[i + 7], keys[i + 8], keys[i + 9]
    local l1 = interned[vm]
    local l2 = l1 and l1[route]
    local lab = l2 and l2[ctx] or get(vm, route, ctx)
    if block then
      -- a wait counts by its length, and only under Lua frames (the event
      -- loop's epoll_wait, and what yields to it, have none)
      local ns = keys[i + 10]
      if id ~= 0 and ns > 0 then
        local e, new = count(p, fr, ns, lab)
        if new then pend(p, lab, e) end
        p.nwaits = (p.nwaits or 0) + cnt
      end
    elseif keep then
      byk[(i + KEYW - 1) / KEYW], blab[(i + KEYW - 1) / KEYW] = fr, lab
    else
      local e, new = count(p, fr, cnt, lab)
      if new then pend(p, lab, e) end
    end
  end
  if keep then
    for j = 1, #order do
      local n = #samples + 1
      samples[n], labs[n] = byk[order[j]], blab[order[j]]
      pend(p, labs[n], n)
    end
  end
  p.nsafe, p.npaired = nsafe, p.nsigs
  -- a sample whose signal never came (the kernel could not queue it, or
  -- the record ring was full): counted once the ring holds more samples
  -- than the signals and the samples they stand for, the ones still
  -- waiting for their capture aside
  local missing = p.nring - p.nsigs - st.merged - st.pending - (s.nmissing or 0)
  if missing > 0 and not block then
    s.nmissing = (s.nmissing or 0) + missing
    local fr = s.nosig or { { c = "[no signal]" }, nleaf = 1 }
    s.nosig = fr
    if keep then for _ = 1, missing do samples[#samples + 1] = fr end else p:_count(fr, missing) end
  end
  p.nsamples = p.nsigs + st.merged + (s.nmissing or 0)
end

-- the functions of a drain, for profile.lua's jit.off of an aggregated
-- profile's drain (see M.start there)
function M.drain_fns()
  return { M.drain, resolve, frames_of, stack_frames, ip_sym, last_at, lookup, c_leaf, in_vm, is_file, c_name, u64,
           labels.get, labels.pend }
end

--- What a stack id stands for (tests): its frames' text, root first.
function M.text(p, fr)
  local parts = {}
  for i, f in ipairs(fr) do parts[i] = f.c or p.helpers.frame_name(f.lua, f.line) end
  return concat(parts, ";")
end

return M
