--- perf_event.cli.record: `luaperf record`, samples to folded stacks,
-- (not a public interface: luaperf's subcommands, run through perf_event.cli's main)
-- perf.data, pprof or speedscope; `record --lua` is in perf_event.cli.record_lua.
-- The options are read in perf_event.cli.record_args, the events opened and
-- their rings read in perf_event.cli.record_sampling, the samples written in
-- perf_event.cli.record_output.
-- @module perf_event.cli.record

local io, tostring = io, tostring

local args = require("perf_event.cli.record_args")
local sampling = require("perf_event.cli.record_sampling")
local output = require("perf_event.cli.record_output")

local M = {}

local USAGE = {
  record = [=[
usage: luaperf record [-e EVENT] [-F HZ | -c PERIOD] [-g | --call-graph fp|dwarf[,SIZE]]
                      [-p PID | -t TID | -a | -C CPUS] [-o FILE] [--folded] [-- CMD ARGS...]
                      [--pprof | --speedscope]
       luaperf record --lua [-e EVENT] [-F HZ | -c PERIOD] [-p PID] [-o FILE] [-- CMD ARGS...]

  -e, --event EVENT   what triggers a sample (default: cpu-clock); several
                      (-e A -e B, or -e A,B) are sampled side by side, each
                      kept apart in every output (below)
  -F, --freq HZ       samples per second (default 999); above the kernel's
                      perf_event_max_sample_rate lowered to it with a warning
  -c, --count PERIOD  one sample every PERIOD events instead of -F
  -g                  record call chains (frame pointers); without -g only the
                      sampled function is written
      --call-graph MODE  fp (as -g) or dwarf[,SIZE]: copy SIZE bytes (8192)
                      of user stack per sample and unwind it with the files'
                      call frame information (elfutils' libdw; code built
                      without frame pointers keeps its callers)
  -p, --pid PID       sample an existing process until it exits or Ctrl-C
                      (or as long as CMD runs)
  -t, --tid TID       sample one thread (not its children) until it exits or Ctrl-C
  -a, --all-cpus      sample every CPU (system wide) until Ctrl-C, or while CMD runs
  -C, --cpu CPUS      sample these CPUs only ('0-1,3'), system wide
  -m, --mmap-pages N  ring size per CPU: N pages (a power of two) or a size
                      (512K, 2M); default as perf's: perf_event_mlock_kb
                      (128 pages of 4 KiB; dwarf: 4 times that)
  -o, --output FILE   folded stacks go to FILE (default perf.folded; '-' = stdout);
                      a FILE ending in .data gets perf.data instead, which
                      'perf report -i FILE' and 'perf script -i FILE' read
      --folded        folded stacks even when FILE ends in .data
      --pprof         pprof's profile.proto, gzipped, to FILE (default perf.pb.gz):
                      'go tool pprof -top FILE', Pyroscope and Parca read it
      --speedscope    speedscope's JSON to FILE (default perf.speedscope.json):
                      open it at https://www.speedscope.app
      --lua           Lua frames, 'function@chunk:line' (doc/profiling.md):
                      with CMD, each Lua process of CMD profiles itself
                      (perf_event.autoprofile, loaded through LUA_INIT) and
                      its stacks, Lua callers included, are written when it
                      closes its Lua state or calls os.exit; with -p PIDS,
                      any running LuaJIT 2.1 process (nothing loaded in it)
                      is sampled and each sample's Lua stack read at that
                      instant by a BPF program (root, a core built with
                      libbpf); without BPF, a process started with
                      perf_event.luamap has its Lua leaf named from
                      /tmp/perf-PID.map (folded output only)
      --children      with --lua -p: every descendant of each PID too, those
                      forked while recording included (nginx's workers)

Folded output: one line per distinct stack, root first: 'comm;main;caller;callee N';
with several events each stack is rooted at its event: 'EVENT;comm;main;... N'.
perf.data has one attr per event (its ids in each sample, as perf's); --pprof
one sample type per event, --speedscope one profile per event; the closing
line gives the samples and lost of each event.
Samples the kernel dropped (a full ring) are counted, never hidden: a
'[lost] N' line in folded output ('EVENT;[lost] N' with several events), a
LOST_SAMPLES record in perf.data ('perf report': Total Lost Samples) and
'; N lost' on the closing line.
User addresses are named from the ELF symbol tables (.symtab/.dynsym) of the
mapped files or of their separate debug files (/usr/lib/debug/.build-id,
.gnu_debuglink: install e.g. libc6-dbg), kernel ones from /proc/kallsyms; a
file's code without a symbol prints as [lib.so], others as [unknown]: one
frame per address, as perf (a stripped program: [prog];[prog];[prog]).
]=],
}

local record_lua = require("perf_event.cli.record_lua")
local record_lua_child = record_lua.record_lua_child
M.luamap = record_lua.luamap

--- Aggregates samples into folded stacks (perf_event.cli.record_output's).
-- @function folder
-- @tparam table sym a perf_event.symbols symbolizer
-- @treturn table with `add(rec)`, `lines()` and `samples`
M.folder = output.folder
--- Writes s to out and closes it (perf_event.cli.record_output's).
-- @function write_out
M.write_out = output.write_out
--- perf record's default ring in pages (perf_event.cli.record_args').
-- @function default_pages
M.default_pages = args.default_pages
--- `-m`: perf record's --mmap-pages value in pages (perf_event.cli.record_args').
-- @function mmap_pages
M.mmap_pages = args.mmap_pages
--- perf record's --call-graph value (perf_event.cli.record_args').
-- @function call_graph
-- @treturn table|nil `{mode=, size=}` (nil for no value)
-- @treturn string|nil what is wrong with the value
M.call_graph = args.call_graph

--- `luaperf record ARGS`: samples a command, a process, threads or CPUs.
-- @tparam table argv the arguments after `record`
-- @treturn number the exit code
function M.record(argv)
  local s, rc = args.options(argv)
  if not s then return rc end
  local o = s.o
  if o.help then io.stdout:write(USAGE.record) return 0 end
  local c, pid, freq, period, as_profile = s.c, s.pid, s.freq, s.period, s.as_profile
  c.catch_signals()
  -- --lua's output: the file (or stdout), its path; nil once the reason is written
  local function lua_output()
    local path = o.output or as_profile == "pprof" and "perf.pb.gz"
                 or as_profile == "speedscope" and "perf.speedscope.json" or "perf.folded"
    local out, oerr = io.stdout, nil
    if path ~= "-" then out, oerr = io.open(path, "wb") end
    if not out then io.stderr:write("luaperf record: cannot write ", tostring(oerr), "\n") return nil end
    if out ~= io.stdout then c._private.cloexec(out) end   -- not in CMD
    return out, path
  end
  if o.lua and not pid then
    local out, path = lua_output()
    if not out then return 1 end
    return record_lua_child(o, freq, period, out, path, as_profile)
  end

  if o.lua and pid then
    -- the Lua stacks read at each sample (BPF): any LuaJIT process, as root
    local remote = require("perf_event.cli.record_remote")
    local ok, why = remote.available(s.c)
    if ok then
      local out, path = lua_output()
      if not out then return 1 end
      return remote.record(s, out, path)
    end
    if as_profile or o.children or #s.pids > 1 then
      io.stderr:write("luaperf record: ", why, "\n")
      return 1
    end
    io.stderr:write("luaperf record: ", why, ": only a process started with perf_event.luamap is named "
                    .. "(its leaf Lua frames, from /tmp/perf-PID.map)\n")
  end

  rc = sampling.expand(s)
  if rc then return rc end
  rc = sampling.open_events(s)
  if rc then return rc end
  rc = output.perfdata(s, argv)
  if rc then return rc end
  output.sinks(s, M.luamap)
  rc = sampling.run(s)
  if rc then return rc end
  return output.finish(s)
end

M.USAGE = USAGE

return M
