--- The generic event names perf knows without sysfs (doc/coverage.md H13-H15):
-- hardware, software and hardware-cache names, with their aliases.
-- Names only: the numbers are the C core's (core.abi); parse.lua resolves
-- names, pmu.lua lists them.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.events

local abi = require("perf_event.core").abi

local M = {}

M.TYPE = abi.type

-- perf's names for the kernel's PERF_COUNT_HW_* / PERF_COUNT_SW_* ids:
-- canonical name (what `perf list` shows) -> the abi key, then aliases ->
-- canonical name.  The numbers are core.abi's.
local HW = {
  ["cpu-cycles"] = "cpu_cycles", instructions = "instructions",
  ["cache-references"] = "cache_references", ["cache-misses"] = "cache_misses",
  ["branch-instructions"] = "branch_instructions", ["branch-misses"] = "branch_misses",
  ["bus-cycles"] = "bus_cycles", ["stalled-cycles-frontend"] = "stalled_cycles_frontend",
  ["stalled-cycles-backend"] = "stalled_cycles_backend", ["ref-cycles"] = "ref_cpu_cycles",
}
local HW_ALIAS = { cycles = "cpu-cycles", branches = "branch-instructions",
  ["idle-cycles-frontend"] = "stalled-cycles-frontend",
  ["idle-cycles-backend"] = "stalled-cycles-backend" }
local SW = {
  ["cpu-clock"] = "cpu_clock", ["task-clock"] = "task_clock", ["page-faults"] = "page_faults",
  ["context-switches"] = "context_switches", ["cpu-migrations"] = "cpu_migrations",
  ["minor-faults"] = "page_faults_min", ["major-faults"] = "page_faults_maj",
  ["alignment-faults"] = "alignment_faults", ["emulation-faults"] = "emulation_faults",
  dummy = "dummy", ["bpf-output"] = "bpf_output", ["cgroup-switches"] = "cgroup_switches",
}
local SW_ALIAS = { faults = "page-faults", cs = "context-switches", migrations = "cpu-migrations" }

-- name -> config (aliases included), and the canonical names in id order
local function table_of(canon, alias, ids)
  local byname, list = {}, {}
  for name, key in pairs(canon) do
    local id = assert(ids[key], key)
    byname[name] = id
    list[#list + 1] = name
  end
  for a, name in pairs(alias) do byname[a] = byname[name] end
  table.sort(list, function(x, y) return byname[x] < byname[y] end)
  return byname, list
end

--- Hardware events: name -> config (PERF_TYPE_HARDWARE).
--- Canonical hardware names in config order (what `perf list` shows).
M.hardware, M.hardware_list = table_of(HW, HW_ALIAS, abi.hw)

--- Software events: name -> config (PERF_TYPE_SOFTWARE), and the canonical
-- names in config order.
M.software, M.software_list = table_of(SW, SW_ALIAS, abi.sw)

--- Hardware-cache ids and their spellings (perf's lexer words, exact
-- case), at index id + 1 of the kernel's PERF_COUNT_HW_CACHE_* id.
local CACHE = {
  l1d = { "L1-dcache", "l1-d", "l1d", "L1-data" },
  l1i = { "L1-icache", "l1-i", "l1i", "L1-instruction" },
  ll = { "LLC", "L2" },
  dtlb = { "dTLB", "d-tlb", "Data-TLB" },
  itlb = { "iTLB", "i-tlb", "Instruction-TLB" },
  bpu = { "branch", "branches", "bpu", "btb", "bpc" },
  node = { "node" },
}
local CACHE_OPS = {
  read = { "load", "loads", "read" },
  write = { "store", "stores", "write" },
  prefetch = { "prefetch", "prefetches", "speculative-read", "speculative-load" },
}
local CACHE_RESULTS = {
  access = { "refs", "Reference", "ops", "access" },
  miss = { "misses", "miss" },
}
-- the ops perf accepts for each cache (its hw_cache_stat table)
local CACHE_VALID = {
  l1d = { "read", "write", "prefetch" }, l1i = { "read", "prefetch" },
  ll = { "read", "write", "prefetch" }, dtlb = { "read", "write", "prefetch" },
  itlb = { "read" }, bpu = { "read" }, node = { "read", "write", "prefetch" },
}

-- spellings keyed by the abi name -> array at index id + 1
local function by_id(spellings, ids)
  local out = {}
  for key, words in pairs(spellings) do out[assert(ids[key], key) + 1] = words end
  return out
end
M.cache_types = by_id(CACHE, abi.hw_cache.id)
M.cache_ops = by_id(CACHE_OPS, abi.hw_cache.op)
M.cache_results = by_id(CACHE_RESULTS, abi.hw_cache.result)
--- Which op ids each cache id supports: cache_valid[id][op] == true.
M.cache_valid = {}
for key, ops in pairs(CACHE_VALID) do
  local v = {}
  for _, op in ipairs(ops) do v[abi.hw_cache.op[op]] = true end
  M.cache_valid[abi.hw_cache.id[key]] = v
end

--- Cache names as `perf list` prints them (valid combinations only).
function M.cache_list()
  local out = {}
  for id = 0, #M.cache_types - 1 do
    local t = M.cache_types[id + 1][1]
    for op = 0, #M.cache_ops - 1 do
      if M.cache_valid[id][op] then
        local words = M.cache_ops[op + 1]
        out[#out + 1] = t .. "-" .. words[2]           -- loads, stores, prefetches
        out[#out + 1] = t .. "-" .. words[1] .. "-misses"
      end
    end
  end
  return out
end

--- Event modifiers perf accepts after `:` (H18).
M.modifiers = "ukhGHpPSDIWeb"

return M
