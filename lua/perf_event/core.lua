--- perf_event.core: the C core (csrc/, built as core.so), with its classes
-- complete.  The functions and constants are the C module's
-- (perf_event.native); the methods of events and groups are assembled once
-- by perf_event.class (the C methods, `records()` of perf_event.records, the
-- group methods that act on the leader and, on LuaJIT, the FFI routes of
-- perf_event.fast) before this module returns, so an event has the same
-- methods whether the program loaded `perf_event.core` or `perf_event`.
-- Not a public interface: its functions are reached through perf_event
-- (doc/api.md lists what is), not documented one by one.
-- @module perf_event.core

local core = require("perf_event.native")
require("perf_event.class")
return core
