-- The release rockspec of perf_event 0.1.0.  `make dist` writes the source
-- archive (dist/perf_event-0.1.0.tar.gz, the tracked files of the checked-out
-- commit) and packs it with this file into dist/perf_event-0.1.0-1.src.rock,
-- which installs with no network and no checkout:
--
--   luarocks install dist/perf_event-0.1.0-1.src.rock
--
-- The source url is the archive's name, relative to where luarocks runs: the
-- project publishes no archive of its own yet.  This file lives apart from
-- rockspec/perf_event-scm-1.rockspec so that `luarocks make
-- rockspec/*.rockspec` in a checkout still names one rockspec.  The build and install steps
-- are the scm rockspec's (spec/rock_spec.lua checks that the two agree).
rockspec_format = "3.0"
package = "perf_event"
version = "0.1.0-1"
source = {
  url = "perf_event-0.1.0.tar.gz",
  dir = "perf_event-0.1.0",
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
  type = "command",
  build_command = [[make rock 'ROCK_DIR=build/rock$(LUA_INCDIR)' 'ROCK_INC=-I$(LUA_INCDIR)' 'CFLAGS=$(CFLAGS)']],
  install_command = [[mkdir -p '$(LIBDIR)/perf_event' '$(LUADIR)/perf_event' ]]
    .. [[&& cp 'build/rock$(LUA_INCDIR)/perf_event/core.so' '$(LIBDIR)/perf_event/' ]]
    .. [[&& cd lua && cp --parents perf_event/*.lua perf_event/*/*.lua '$(LUADIR)/']],
  install = {
    bin = { luaperf = "bin/luaperf" },
  },
}
test = {
  type = "command",
  command = "make test",
}
