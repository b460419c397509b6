# perf_event for Lua - build and test.
#   make                 C core for LuaJIT   -> build/perf_event/core.so
#   make LUA=lua5.4      C core for Lua 5.4  -> build/lua5.4/perf_event/core.so
#   make LUA=lua5.1      C core for Lua 5.1  -> build/lua5.1/perf_event/core.so
#   make asan            ASan+UBSan core for LuaJIT -> build/asan/perf_event/core.so
#   make test            specs on LuaJIT, 5.4, 5.1 and the ASan core; ends "N passed, N failed"
#                        (writes no kernel-wide sysctl; as a user, what needs root is skipped)
#   make test-sysctl     opt-in, as root: specs that write a kernel-wide sysctl
#                        (perf_event_max_sample_rate; restored after), spec/optin/
#   make lint            luacheck + cppcheck

LUA ?= luajit
CC ?= cc
SRCS := $(wildcard csrc/*.c)
HDRS := $(wildcard csrc/*.h)
WARN := -Wall -Wextra -Werror -Wshadow
BASECFLAGS := -std=gnu11 -fPIC -fvisibility=hidden $(WARN)
OPT ?= -O2 -g
LDFLAGS_SO := -shared

ifeq ($(LUA),luajit)
  LUA_INC := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
  OUTDIR := build
else
  LUA_INC := $(shell pkg-config --cflags $(LUA) 2>/dev/null || echo -I/usr/include/$(LUA))
  OUTDIR := build/$(LUA)
endif

TARGET := $(OUTDIR)/perf_event/core.so

.PHONY: all asan test test-asan test-sysctl lint clean bench doc bench-read bench-records bench-nginx
all: $(TARGET)

$(TARGET): $(SRCS) $(HDRS) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(OPT) $(LUA_INC) $(CFLAGS) $(SRCS) -o $@ $(LDFLAGS_SO) $(LDFLAGS)

ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
build/asan/perf_event/core.so: $(SRCS) $(HDRS) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) -O1 -g $(ASAN_FLAGS) $(shell pkg-config --cflags luajit) $(SRCS) -o $@ -shared $(ASAN_FLAGS)

asan: build/asan/perf_event/core.so

# Test fixtures: a small C library and programs the specs probe (uprobes,
# breakpoints on code, exact call counts).
build/test/libpetarget.so: spec/support/petarget.c
	@mkdir -p $(dir $@)
	$(CC) -O0 -g -fPIC -shared -Wall -Wextra -Werror $< -o $@

build/test/petarget: spec/support/petarget_main.c build/test/libpetarget.so
	$(CC) -O0 -g -Wall -Wextra -Werror $< -o $@ -Lbuild/test -lpetarget -Wl,-rpath,'$$ORIGIN'

# petest: a test-only Lua module per interpreter (spec/support/petest.c)
PETEST_SRC := spec/support/petest.c build/test/libpetarget.so
PETEST_CC = $(CC) -O1 -g -fPIC -shared -Wall -Wextra -Werror $< -o $@ -Lbuild/test -lpetarget -Wl,-rpath,'$$ORIGIN/..'
build/test/luajit/petest.so: $(PETEST_SRC)
	@mkdir -p $(dir $@)
	$(PETEST_CC) $(shell pkg-config --cflags luajit)
build/test/lua5.4/petest.so: $(PETEST_SRC)
	@mkdir -p $(dir $@)
	$(PETEST_CC) -I/usr/include/lua5.4
build/test/lua5.1/petest.so: $(PETEST_SRC)
	@mkdir -p $(dir $@)
	$(PETEST_CC) -I/usr/include/lua5.1

fixtures: build/test/libpetarget.so build/test/petarget build/test/luajit/petest.so \
          build/test/lua5.4/petest.so build/test/lua5.1/petest.so

test: fixtures
	$(MAKE) LUA=luajit
	$(MAKE) LUA=lua5.4
	$(MAKE) LUA=lua5.1
	$(MAKE) asan
	$(MAKE) fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	tools/runtests

test-asan: fixtures asan
	PE_SUITES=asan tools/runtests

# not part of `make test`: these change every perf user on the machine while
# they run (spec/optin/*.lua do not match busted's "_spec" pattern)
test-sysctl: fixtures all
	PE_ALLOW_SYSCTL=1 PE_SUITES=luajit tools/runtests --pattern=. spec/optin

lint:
	luacheck lua spec bin examples bench
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --std=c11 csrc

# benchmarks: ratios against a C baseline in the same run (see README)
bench-read: all
	bench/read/run 9 200000
bench-records: all
	bench/records/run.sh 50000 15
bench-nginx: all fixtures
	bench/nginx/run.sh 3 11
bench: bench-read bench-records bench-nginx

# the LDoc reference (lua-ldoc) -> doc/reference/
doc:
	ldoc .

clean:
	rm -rf build

# ---- hardening (issue 7): fuzzing, valgrind, soak --------------------------
# make fuzz [FUZZ_SECONDS=N]   libFuzzer+ASan+UBSan targets, N seconds each
# make fuzz-seed               refresh fuzz/corpus from this kernel's rings
# make test-valgrind           the suite under memcheck (PUC Lua 5.4 core)
# make soak [SOAK_SECONDS=60]  10^5 open/mmap/close cycles + a 10 kHz session
FUZZ_CC ?= clang-14
FUZZ_SECONDS ?= 5
# seconds per fuzz target inside `make test`
TEST_FUZZ_SECONDS ?= 5
FUZZ_TARGETS := readfmt records attr
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -fno-omit-frame-pointer -std=gnu11 -Wall -Wextra -Werror -I/usr/include/lua5.4
FUZZ_LUA_LIB := $(shell pkg-config --variable=libdir lua5.4 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)/liblua5.4.a

build/fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.h $(SRCS) $(HDRS) Makefile
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< $(SRCS) $(FUZZ_LUA_LIB) -lm -ldl -o $@

fuzz-build: $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS))

fuzz: fuzz-build
	tools/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-seed: all
	luajit fuzz/seed.lua fuzz/corpus

test-valgrind: fixtures
	$(MAKE) LUA=lua5.4
	tools/valgrind-run

soak: fixtures all
	PE_SOAK=long PE_SUITES=luajit tools/runtests spec/soak_spec.lua

.PHONY: fuzz fuzz-build fuzz-seed test-valgrind soak
