--- perf_event.remote: the Lua stacks of another LuaJIT process, read from
-- outside with nothing prepared in it (what `luaperf dump --lua` prints).
-- Each VM is found in the process's memory (its global_State, by the
-- links LuaJIT's own layout gives it), each thread is stopped a moment
-- with ptrace (seized and interrupted: no signal reaches the process) and
-- the running coroutine's frames are walked as of that instant, from the
-- registers when the thread was in the interpreter, from the trace's
-- snapshot when it was in compiled code. Frames are named as pe.profile
-- names them: `name@chunk:line`, builtins and C functions by the names the
-- target's own `package.loaded` gives them (`table.sort`, `cjson.encode`).
-- Needs LuaJIT 2.1 (GC64) on x86-64 in the target, and the right to ptrace
-- it (its user, or CAP_SYS_PTRACE); luaperf itself may run on any Lua.
-- (not a public interface: luaperf's dump subcommand)
-- @module perf_event.remote

local io, string, table = io, string, table
local ipairs, pairs, tonumber, tostring, pcall = ipairs, pairs, tonumber, tostring, pcall
local format, concat = string.format, table.concat

local core = require("perf_event.core")
local naming = require("perf_event.profile.naming")
local fs = require("perf_event.fs")
local P = core._private

local M = {}

--- The VM states LuaJIT keeps in global_State.vmstate (a trace's number
-- when positive).
M.VMSTATES = { [-1] = "interpreted", [-2] = "C", [-3] = "GC", [-4] = "trace exit",
               [-5] = "JIT recording", [-6] = "JIT optimizing", [-7] = "JIT assembling" }

function M.vmstate_name(v)
  if v and v > 0 then return format("compiled (trace %d)", v) end
  return M.VMSTATES[v] or ("state " .. tostring(v))
end

-- the process's mappings: rw private ones (where a VM's state may live)
-- and executable ones, as {lo, hi, name, offset} arrays; nil, why
-- (smaps: each mapping's resident size too. A writable mapping with
-- nothing resident holds no VM; a huge one mostly not resident, such as
-- ASan's shadow memory, terabytes reserved, is not scanned either)
local SPARSE = 2 ^ 30
function M.maps(pid)
  local f, err = io.open("/proc/" .. pid .. "/smaps", "r")
  if not f then return nil, err end
  local rw, ex = {}, {}
  local cur
  for line in f:lines() do
    local lo, hi, perms, off, rest = line:match("^(%x+)%-(%x+) (%S+) (%x+) %S+ %S+%s*(.*)$")
    if lo then
      local r = { tonumber(lo, 16), tonumber(hi, 16), rest, tonumber(off, 16) }
      cur = nil
      if perms:sub(1, 2) == "rw" and perms:sub(4, 4) == "p" and rest ~= "[vvar]" and rest ~= "[vsyscall]" then
        cur = r
      end
      if perms:sub(3, 3) == "x" then ex[#ex + 1] = r end
    elseif cur then
      local rss = line:match("^Rss:%s+(%d+) kB")
      if rss then
        local size, res = cur[2] - cur[1], tonumber(rss) * 1024
        if res > 0 and (size <= SPARSE or res * 8 >= size) then rw[#rw + 1] = cur end
        cur = nil
      end
    end
  end
  f:close()
  return rw, ex
end

-- the threads of pid (its /proc/PID/task)
local function threads(pid)
  local out = {}
  local names = core.readdir and core.readdir("/proc/" .. pid .. "/task")
  for _, n in ipairs(names or {}) do
    local tid = tonumber(n)
    if tid then out[#out + 1] = tid end
  end
  table.sort(out)
  if #out == 0 then out[1] = pid end
  return out
end

-- a file's whole content, or nil (fs.read, trailing newline kept)
local function read_all(path) return fs.read(path, true) end

-- the VM's code, exactly: the .eh_frame FDE of the binary that covers
-- the lowest dispatch entry (lj_vm's own unwind table) sets st.vm_lo and
-- st.vm_hi; without one, ljr_state's estimate stays
local function vm_code(pid, st, ex)
  if not st.vm_lo then return end
  for _, r in ipairs(ex) do
    if st.vm_lo >= r[1] and st.vm_lo < r[2] and r[3]:sub(1, 1) == "/" then
      local ok, elf = pcall(require("perf_event.symbols.elf").read_elf, "/proc/" .. pid .. "/root" .. r[3])
      if not ok or not elf then return end
      -- the mapping's file offset to the segment's link-time address
      for _, seg in ipairs(elf.loads) do
        if r[4] >= seg.offset and r[4] < seg.offset + seg.filesz then
          local bias = r[1] - r[4] + seg.offset - seg.vaddr
          local lo, hi = require("perf_event.symbols.elf").fde_range(elf, st.vm_lo - bias)
          if lo then st.vm_lo, st.vm_hi, st.vm_fde = lo + bias, hi + bias, true end
          return
        end
      end
      return
    end
  end
end

--- The LuaJIT VMs of process pid: an array of states (ljr_state's: g,
-- mainth, vmstate_at, curl_at, dispatch...), or nil, why.
function M.vms(pid)
  local rw, ex = M.maps(pid)
  if not rw then
    local gone = not io.open("/proc/" .. pid .. "/stat", "r")
    return nil, gone and format("no process %s", tostring(pid))
      or format("cannot read %s (dump runs as the process's user or as root)", tostring(ex))
  end
  local gs, err = P.ljr_find(pid, rw)
  if not gs then return nil, err end
  local out = {}
  for _, g in ipairs(gs) do
    local st = P.ljr_state(pid, g, ex)
    if st then
      vm_code(pid, st, ex)
      out[#out + 1] = st
    end
  end
  if #out == 0 then
    return nil, format("process %d holds no LuaJIT 2.1 state (LuaJIT GC64 on x86-64 is read)", pid)
  end
  return out
end

-- address -> name of the target's builtins and C functions, through its
-- main thread's globals (_G, package.loaded), as pe.profile names them
local function remote_names(pid, st)
  local function fields(t) return P.ljr_fields(pid, t) end
  local globals = P.ljr_env(pid, st.mainth)
  local loaded
  for _, f in ipairs(globals and fields(globals) or {}) do
    if f[1] == "package" and f[2] == "table" then
      for _, g in ipairs(fields(f[3])) do
        if g[1] == "loaded" and g[2] == "table" then loaded = g[3] end
      end
    end
  end
  local names = naming.name_modules({ fields = fields, loaded = loaded, globals = globals })
  -- a coroutine.wrap function is a builtin no table holds: its ffid is the
  -- one before coroutine.wrap's (lib_base.c: coroutine_wrap_aux)
  for a, n in pairs(names) do
    if n == "coroutine.wrap" then
      local ffid = P.ljr_ffid(pid, a)
      if ffid and ffid > 1 then names.ffids = { [ffid - 1] = n } end
    end
  end
  return names
end

-- a frame's name: name@chunk:line, or the builtin's or C function's
local function frame_name(fr, names, root, lines)
  if fr.ffid == 0 then
    local src = fr.chunk or "?"
    local info = {
      name = naming.guess_name(src, fr.linedefined, root),
      chunk = naming.chunk_name(src),
      linedefined = fr.linedefined,
    }
    if not lines then return naming.frame_name(info) end
    local s = naming.frame_name(info, fr.line)
    if fr.inlined then s = s .. " (inlined)" end
    return s
  end
  local n = names[fr.fn] or names.ffids and names.ffids[fr.ffid]
  if n then return n end
  if fr.ffid == 1 then return format("[C@0x%x]", fr.cfunc or 0) end
  return format("[builtin#%d]", fr.ffid)
end

--- A namer of process pid's frames (its VM st): a function from frames
-- (leaf first, as ljr_walk and ljr_chain give them) to their names, root
-- first. The names of its builtins are read once, when first needed.
-- `opts.lines = false` names Lua functions by the line that defines them
-- (one name a function, as `luaperf top` lists them), not the frame's line.
function M.namer(pid, st, opts)
  local names
  local lines = not (opts and opts.lines == false)
  local root = { abs = "/proc/" .. pid .. "/root", rel = "/proc/" .. pid .. "/cwd" }
  -- a Lua frame's name by its chunk, definition and line (bounded)
  local cache, ncache = {}, 0
  return function(frames)
    names = names or remote_names(pid, st)
    local out = {}
    for k = #frames, 1, -1 do
      local fr = frames[k]
      local s
      if fr.ffid == 0 then
        local key = (fr.chunk or "?") .. "\0" .. tostring(fr.linedefined) .. "\0" .. tostring(fr.line)
                    .. (fr.inlined and "\0i" or "")
        s = cache[key]
        if not s then
          s = frame_name(fr, names, root, lines)
          if ncache >= 4096 then cache, ncache = {}, 0 end
          cache[key], ncache = s, ncache + 1
        end
      else
        s = frame_name(fr, names, root, lines)
      end
      out[#out + 1] = s
    end
    return out
  end
end

-- the VM state's thread: the one whose r14 is the VM's DISPATCH, else the
-- only thread, else the process's main thread
local function thread_of(st, tids, regs, pid)
  for _, tid in ipairs(tids) do
    if regs[tid] and st.dispatch and regs[tid].r14 == st.dispatch then return tid end
  end
  if #tids == 1 then return tids[1] end
  return pid
end

local MAX_FRAMES = 256   -- frames ljr_walk reads at most (LJR_MAXF)
local MAX_STEPS = 64     -- instructions a thread is stepped to whole frames

-- The walk of VM st's running thread, tid held stopped with registers
-- regs (nil: nonblocking): w, the instructions stepped, tid's registers
-- then, and a signal that arrived while stepping (for ljr_detach; once one
-- has, `nostep`: a step would drop it).
-- Stopped inside the interpreter in the middle of a call or a return, the
-- frames are half rebuilt (BC_RET writes the result over the function's
-- slot before it moves BASE down): the thread goes on one instruction at a
-- time while it stays in the interpreter (never into C, where a system
-- call could block), until they are whole.
function M._whole_walk(pid, st, tid, regs, nostep)
  local w, steps = P.ljr_walk(pid, st, regs), 0
  while regs and not nostep and w.truncated and w.how == "registers" and #w.frames < MAX_FRAMES and steps < MAX_STEPS do
    local r, _, _, sig = P.ljr_step(tid)
    if not r then return w, steps, regs, sig or 0 end
    regs, steps = r, steps + 1
    w = P.ljr_walk(pid, st, r)
  end
  return w, steps, regs, nil
end

--- Each thread's Lua stack of process pid at this instant.
-- opts.nonblocking: the threads are not stopped (the frames are read while
-- they run: L->base's, which the VM updates at calls, not the registers).
-- Returns { pid=, comm=, cmdline=, vms = { { g=, tid=, vmstate=, state=,
-- running=, how=, steps=, frames = { names, leaf last }, truncated= } },
-- stopped = { tid -> true | why } }, or nil, why. steps: instructions the
-- thread was stepped to get whole frames (a stop mid-call or mid-return).
function M.dump(pid, opts)
  opts = opts or {}
  pid = tonumber(pid)
  if not pid then return nil, "not a pid" end
  local vms, why = M.vms(pid)
  if not vms then return nil, why end
  local tids = threads(pid)
  local regs, stopped, held = {}, {}, {}
  if not opts.nonblocking then
    for _, tid in ipairs(tids) do
      local r, err = P.ljr_stop(tid)
      if r then regs[tid] = r held[#held + 1] = tid stopped[tid] = true else stopped[tid] = err end
    end
    if #held == 0 then
      return nil, format("could not stop process %d: %s (dump needs to run as its user or as root; "
                         .. "--nonblocking reads without stopping it)", pid, tostring(stopped[tids[1]]))
    end
  end
  local out = { pid = pid, stopped = stopped, vms = {} }
  local sigs = {}
  local ok, err = pcall(function()
    for _, st in ipairs(vms) do
      local tid = thread_of(st, tids, regs, pid)
      local w, steps, r, sig = M._whole_walk(pid, st, tid, regs[tid], sigs[tid] ~= nil)
      regs[tid], sigs[tid] = r, sigs[tid] or sig
      local frames = w.frames
      if w.running and w.thread ~= st.mainth then
        -- a coroutine: the main thread that resumed it below its frames
        local m = P.ljr_walk(pid, st, nil, st.mainth)
        for _, f in ipairs(m.frames) do frames[#frames + 1] = f end
      end
      out.vms[#out.vms + 1] = { g = st.g, tid = tid, vmstate = w.vmstate, running = w.running,
                                how = w.how, steps = steps, raw = frames, truncated = w.truncated }
    end
  end)
  for _, tid in ipairs(held) do P.ljr_detach(tid, sigs[tid]) end
  if not ok then return nil, err end
  -- named once the threads run again
  for i, v in ipairs(out.vms) do
    v.frames = M.namer(pid, vms[i])(v.raw)
    v.state = M.vmstate_name(v.vmstate)
  end
  out.comm = (read_all("/proc/" .. pid .. "/comm") or ""):gsub("\n$", "")
  local cl = read_all("/proc/" .. pid .. "/cmdline")
  out.cmdline = cl and (cl:gsub("%z", " "):gsub("%s+$", ""))
  return out
end

--- pids and every descendant of each, in that order (each process after
-- its parent, children by pid), from /proc/PID/stat's parent pids.
function M.with_children(pids)
  local kids = {}
  for _, n in ipairs(core.readdir("/proc") or {}) do
    local pid = tonumber(n)
    local st = pid and read_all("/proc/" .. n .. "/stat")
    local ppid = st and tonumber(st:match("^%d+ %b() %a (%d+)"))
    if ppid then
      kids[ppid] = kids[ppid] or {}
      kids[ppid][#kids[ppid] + 1] = pid
    end
  end
  local out, seen = {}, {}
  local function add(pid)
    if seen[pid] then return end
    seen[pid] = true
    out[#out + 1] = pid
    local k = kids[pid] or {}
    table.sort(k)
    for _, c in ipairs(k) do add(c) end
  end
  for _, pid in ipairs(pids) do add(pid) end
  return out
end

--- The text `luaperf dump --lua` prints for a dump's result.
function M.format(d)
  local lines = { format("Process %d: %s", d.pid, d.cmdline or d.comm or "?") }
  for _, v in ipairs(d.vms) do
    lines[#lines + 1] = ""
    if not v.running then
      lines[#lines + 1] = format("Thread %d (LuaJIT VM 0x%x): idle, not in Lua", v.tid, v.g)
    else
      lines[#lines + 1] = format("Thread %d (LuaJIT VM 0x%x): %s", v.tid, v.g, v.state)
      for _, f in ipairs(v.frames) do lines[#lines + 1] = "    " .. f end
      if v.truncated then lines[#lines + 1] = "    (the walk stopped here: frames below not read)" end
    end
  end
  return concat(lines, "\n") .. "\n"
end

return M
