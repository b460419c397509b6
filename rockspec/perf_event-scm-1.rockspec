rockspec_format = "3.0"
package = "perf_event"
version = "scm-1"
source = {
  url = "git+file:///work/main",
}
description = {
  summary = "Linux perf_event_open(2) for Lua: counters, groups, sampling, perf event strings",
  detailed = [[
A C core (the syscall, ioctls, mmap ring-buffer draining, user-page reads)
under a Lua module with userdata event objects and iterator-based record
streams, plus a pure-Lua layer that builds perf_event_attr from perf-style
event strings and sysfs format/ and events/ files.  LuaJIT 2.1 (OpenResty's
luajit2), Lua 5.1 and 5.4.
]],
  license = "MIT",
  labels = { "linux", "perf", "profiling", "openresty" },
}
supported_platforms = { "linux" }
dependencies = {
  "lua >= 5.1",
}
build = {
  type = "builtin",
  modules = {
    ["perf_event.core"] = {
      sources = {
        "csrc/attr.c", "csrc/compat.c", "csrc/core.c", "csrc/errors.c", "csrc/event.c",
        "csrc/readfmt.c", "csrc/ring.c", "csrc/records.c", "csrc/u64.c", "csrc/userpage.c",
        "csrc/fast.c", "csrc/spawn.c", "csrc/lifecycle.c", "csrc/group.c", "csrc/layouts.c",
      },
      defines = { "_GNU_SOURCE" },
    },
    ["perf_event"] = "lua/perf_event/init.lua",
    ["perf_event.parse"] = "lua/perf_event/parse.lua",
    ["perf_event.pmu"] = "lua/perf_event/pmu.lua",
    ["perf_event.events"] = "lua/perf_event/events.lua",
    ["perf_event.fs"] = "lua/perf_event/fs.lua",
    ["perf_event.tracepoint"] = "lua/perf_event/tracepoint.lua",
    ["perf_event.u64"] = "lua/perf_event/u64.lua",
    ["perf_event.records"] = "lua/perf_event/records.lua",
    ["perf_event.fast"] = "lua/perf_event/fast.lua",
    ["perf_event.stat"] = "lua/perf_event/stat.lua",
    ["perf_event.symbols"] = "lua/perf_event/symbols.lua",
    ["perf_event.cli"] = "lua/perf_event/cli.lua",
  },
  install = {
    bin = { luaperf = "bin/luaperf" },
  },
}
