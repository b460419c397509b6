-- The rock is built from a checkout: `luarocks make` (Lua 5.1, whose C module
-- LuaJIT loads too) or `luarocks --lua-version=5.4 make`, in the checkout's
-- top directory.  `luarocks make` never fetches source.url; the project has
-- no published archive, so the url names the checkout itself, relative to
-- where luarocks runs (`luarocks build` of this file, which would fetch it,
-- stops there: use `luarocks make`).
--
-- The C core is built by the project's Makefile (the same flags, warnings,
-- -fvisibility=hidden and every csrc/*.c, csrc/lj/*.c and csrc/puc/*.c, so there is no
-- second list of sources here), against the headers luarocks was configured for; the build
-- directory is named after those headers so that 5.1 and 5.4 never share an
-- object.  Every lua/perf_event/*.lua and lua/perf_event/*/*.lua (the
-- folders of perf_event.profile, perf_event.openresty, perf_event.cli and
-- the parts of parse, symbols, pprof and stat) is installed:
-- again no list to keep.
-- spec/rock_spec.lua builds and installs this rock into temporary trees and
-- runs the installed luaperf and pe.open on each interpreter.
rockspec_format = "3.0"
package = "perf_event"
version = "scm-1"
source = {
  url = ".",
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
