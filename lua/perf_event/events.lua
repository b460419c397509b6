--- The generic event names perf knows without sysfs (CHECKLIST H13-H15):
-- hardware, software and hardware-cache names, with their aliases.
-- Data only; parse.lua resolves names, pmu.lua lists them.
-- @module perf_event.events

local M = {}

M.TYPE = { hardware = 0, software = 1, tracepoint = 2, hw_cache = 3, raw = 4, breakpoint = 5 }

--- Hardware events: name -> config (PERF_TYPE_HARDWARE).
M.hardware = {
  ["cpu-cycles"] = 0, cycles = 0, instructions = 1, ["cache-references"] = 2,
  ["cache-misses"] = 3, ["branch-instructions"] = 4, branches = 4, ["branch-misses"] = 5,
  ["bus-cycles"] = 6, ["stalled-cycles-frontend"] = 7, ["idle-cycles-frontend"] = 7,
  ["stalled-cycles-backend"] = 8, ["idle-cycles-backend"] = 8, ["ref-cycles"] = 9,
}
--- Canonical hardware names in config order (what `perf list` shows).
M.hardware_list = { "cpu-cycles", "instructions", "cache-references", "cache-misses",
  "branch-instructions", "branch-misses", "bus-cycles", "stalled-cycles-frontend",
  "stalled-cycles-backend", "ref-cycles" }

--- Software events: name -> config (PERF_TYPE_SOFTWARE).
M.software = {
  ["cpu-clock"] = 0, ["task-clock"] = 1, ["page-faults"] = 2, faults = 2,
  ["context-switches"] = 3, cs = 3, ["cpu-migrations"] = 4, migrations = 4,
  ["minor-faults"] = 5, ["major-faults"] = 6, ["alignment-faults"] = 7,
  ["emulation-faults"] = 8, dummy = 9, ["bpf-output"] = 10, ["cgroup-switches"] = 11,
}
M.software_list = { "cpu-clock", "task-clock", "page-faults", "context-switches",
  "cpu-migrations", "minor-faults", "major-faults", "alignment-faults",
  "emulation-faults", "dummy", "bpf-output", "cgroup-switches" }

--- Hardware-cache ids and their spellings (perf's lexer words, exact case).
M.cache_types = {
  { "L1-dcache", "l1-d", "l1d", "L1-data" },
  { "L1-icache", "l1-i", "l1i", "L1-instruction" },
  { "LLC", "L2" },
  { "dTLB", "d-tlb", "Data-TLB" },
  { "iTLB", "i-tlb", "Instruction-TLB" },
  { "branch", "branches", "bpu", "btb", "bpc" },
  { "node" },
}
M.cache_ops = {
  { "load", "loads", "read" },
  { "store", "stores", "write" },
  { "prefetch", "prefetches", "speculative-read", "speculative-load" },
}
M.cache_results = {
  { "refs", "Reference", "ops", "access" },
  { "misses", "miss" },
}
--- Which ops (0 read, 1 write, 2 prefetch) each cache id supports.
M.cache_valid = {
  [0] = { [0] = true, true, true },
  [1] = { [0] = true, [2] = true },
  [2] = { [0] = true, true, true },
  [3] = { [0] = true, true, true },
  [4] = { [0] = true },
  [5] = { [0] = true },
  [6] = { [0] = true, true, true },
}

--- Cache names as `perf list` prints them (valid combinations only).
function M.cache_list()
  local out = {}
  local opname = { [0] = "load", "store", "prefetch" }
  for id = 0, #M.cache_types - 1 do
    local t = M.cache_types[id + 1][1]
    for op = 0, 2 do
      if M.cache_valid[id][op] then
        out[#out + 1] = t .. "-" .. M.cache_ops[op + 1][2]   -- loads, stores, prefetches
        out[#out + 1] = t .. "-" .. opname[op] .. "-misses"
      end
    end
  end
  return out
end

--- Event modifiers perf accepts after `:` (H18).
M.modifiers = "ukhGHpPSDIWeb"

return M
