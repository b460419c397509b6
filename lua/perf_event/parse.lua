--- Event strings in perf's syntax -> perf_event_attr tables (doc/coverage.md H13-H22).
-- Pure Lua over sysfs (pmu.lua) and tracefs (tracepoint.lua).  The attr
-- built for a string equals what `perf stat -vv -e STRING` prints (perf 6.1
-- rules, modifiers included); spec/perf_oracle_spec.lua checks that.
-- The face of perf_event.parse.grammar (the parser; its scanner and terms in
-- perf_event.parse.lex and perf_event.parse.terms), perf_event.parse.attrtext
-- (attr tables as perf -vv text) and `describe`, which resolves a spec
-- through perf_event.resolve first.
-- Not a public interface: reached through perf_event (doc/api.md lists what is).
-- @module perf_event.parse

local lex = require("perf_event.parse.lex")
local grammar = require("perf_event.parse.grammar")
local attrtext = require("perf_event.parse.attrtext")
local resolve = require("perf_event.resolve")

local ipairs, tostring, setmetatable, rawget = ipairs, tostring, setmetatable, rawget
local format, concat = string.format, table.concat

-- suggest_work, the count of edit-distance cells "did you mean" computed
-- (specs assert on it), is perf_event.parse.lex's
local M = setmetatable({}, { __index = function(_, k)
  if k == "suggest_work" then return rawget(lex, k) end
end })

--- Parses a comma-separated list of events (`{a,b}:mod` groups included).
-- @tparam string str e.g. `"cycles:u,{task-clock,page-faults}:k"`
-- @treturn[1] table array of `{name=, attr=, group=<n|nil>, leader=<bool>, mods=<string>,
--   pmu=, alias=, scale=, unit=, per_pkg=, snapshot=, terms={...}, bits={...},
--   precise_max=, sample_read=, weak=}`
-- @treturn[2] nil
-- @treturn[2] string the error, quoting the string with a caret under the bad spot
M.parse = grammar.parse

--- An attr table as text, in perf's `-vv` layout (non-zero fields only).
-- @function format_attr
-- @tparam table attr
-- @treturn string
M.format_attr = attrtext.format_attr

--- Describes a spec: for each event the attr perf would print and which
-- sysfs format terms produced which config bits.  The spec is resolved by
-- perf_event.resolve, as for `pe.open`.
-- @param spec an event string (or a table accepted by `attr`)
-- @treturn[1] string
-- @treturn[2] nil
-- @treturn[2] string error
function M.describe(spec)
  local list, err = resolve.entries(spec)
  if not list then return nil, err end
  local out = {}
  for _, e in ipairs(list) do
    local head = e.name
    if e.group then head = format("%s  (group %d%s)", head, e.group, e.leader and ", leader" or "") end
    if e.pmu then head = head .. "  pmu " .. e.pmu end
    out[#out + 1] = head
    out[#out + 1] = attrtext.format_attr(e.attr)
    for _, b in ipairs(e.bits or {}) do
      out[#out + 1] = format("  # %s=%s -> %s (format %s, from %s)", b.term, b.value, b.config,
        b.spec, b.from)
    end
    if e.scale or e.unit then
      out[#out + 1] = format("  # scale %s unit %s", tostring(e.scale), tostring(e.unit))
    end
    if e.mods and e.mods ~= "" then out[#out + 1] = "  # modifiers :" .. e.mods end
  end
  return concat(out, "\n")
end

--- Gives an attr table the `__tostring` that prints it like perf -vv.
-- @function attr_table
-- @tparam table a
-- @treturn table a
M.attr_table = attrtext.attr_table

--- Builds one attr table from a spec (an event string, `{event="...", field=...}`,
-- or a full attr table with `type`): perf_event.resolve's `attr`, as `pe.attr`.
-- @treturn[1] table attr fields named as in linux/perf_event.h (tostring() prints it like perf -vv)
-- @treturn[2] nil
-- @treturn[2] string
function M.attr(spec)
  return resolve.attr(spec)
end

M.render_error = lex.render

return M
