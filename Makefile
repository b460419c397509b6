# perf_event for Lua - build and test.
#   make                 C core for LuaJIT   -> build/perf_event/core.so
#   make LUA=lua5.4      C core for Lua 5.4  -> build/lua5.4/perf_event/core.so
#   make LUA=lua5.1      C core for Lua 5.1  -> build/lua5.1/perf_event/core.so
#   make asan            ASan+UBSan core for LuaJIT -> build/asan/perf_event/core.so
#   make test            specs on LuaJIT, 5.4, 5.1 and the ASan core; ends "N passed, N failed"
#                        (writes no kernel-wide sysctl; as a user, what needs root is skipped)
#   make test-stats      the tests judged on timing, not on a sampling bound (tagged #stats:
#                        drains racing the scheduler), one suite at a time
#   make test-sysctl     opt-in, as root: specs that write a kernel-wide sysctl
#                        (perf_event_max_sample_rate; restored after), spec/optin/
#   make test-user       as root, after make test: the suite again as uid 65534
#                        (what needs root skips, saying why)
#   make lint            luacheck + cppcheck
#   make dist            dist/perf_event-0.1.0.tar.gz and dist/perf_event-0.1.0-1.src.rock

LUA ?= luajit
CC ?= cc
# csrc/lj/: the LuaJIT readers (its layout, the safe point, the hook repair);
# csrc/puc/: PUC Lua's hook sampler (the hook, its string pool, the struct reads)
SRCS := $(wildcard csrc/*.c csrc/lj/*.c csrc/puc/*.c)
HDRS := $(wildcard csrc/*.h csrc/lj/*.h csrc/puc/*.h csrc/bpf/*.h)
WARN := -Wall -Wextra -Werror -Wshadow
BASECFLAGS := -std=gnu11 -fPIC -fvisibility=hidden $(WARN)
OPT ?= -O2 -g
LDFLAGS_SO := -shared

# DWARF unwinding (csrc/unwind.c, `luaperf record --call-graph dwarf`) uses
# elfutils' libdw when pkg-config finds it (libdw-dev); LIBDW=0 builds
# without it, and core.unwind then says so.
LIBDW ?= $(shell pkg-config --exists libdw 2>/dev/null && echo 1 || echo 0)
ifeq ($(LIBDW),1)
  DW_CFLAGS := -DPE_HAVE_LIBDW $(shell pkg-config --cflags libdw)
  DW_LIBS := $(shell pkg-config --libs libdw)
endif

# The BPF program of `luaperf record --lua -p` (csrc/bpf/ljstack.bpf.c,
# loaded by csrc/lj/bpfprof.c) needs libbpf (libbpf-dev, found by
# pkg-config) and clang to build it; LIBBPF=0 builds without it, and the
# core then says so.
BPF_CLANG ?= clang
LIBBPF ?= $(shell pkg-config --exists libbpf 2>/dev/null && command -v $(BPF_CLANG) >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(LIBBPF),1)
  BPF_CFLAGS := -DPE_HAVE_LIBBPF -Ibuild/gen $(shell pkg-config --cflags libbpf)
  BPF_LIBS := $(shell pkg-config --libs libbpf)
  BPF_GEN := build/gen/ljstack_bpf.h
endif

LUAJIT_INC := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# One object per C file and build variant (luajit, lua5.4, lua5.1, asan) in
# build/obj/<variant>/: the module links them; the test-only pesim module
# links the same objects through an archive (spec/cdeps_spec.lua runs nm on
# them to check that no two C files call each other).
NAMES := $(patsubst csrc/%.c,%,$(SRCS))
# The rock (rockspec/) is the variant "rock": `make rock ROCK_DIR=D
# ROCK_INC=-I...` builds D/perf_event/core.so, objects in D/obj, against the
# headers luarocks was configured for (one D per Lua version).
ROCK_DIR ?= build/rock
ROCK_INC ?= $(LUAJIT_INC)
objdir_of = $(if $(filter rock,$(1)),$(ROCK_DIR)/obj,build/obj/$(1))
objs_of = $(addprefix $(call objdir_of,$(1))/,$(addsuffix .o,$(NAMES)))
inc_of = $(if $(filter rock,$(1)),$(ROCK_INC),$(if $(filter luajit asan,$(1)),$(LUAJIT_INC),$(shell pkg-config --cflags $(1) 2>/dev/null || echo -I/usr/include/$(1))))
cflags_of = $(if $(filter asan,$(1)),-O1 -g $(ASAN_FLAGS),$(OPT) $(CFLAGS))

ifeq ($(LUA),luajit)
  OUTDIR := build
else
  OUTDIR := build/$(LUA)
endif

TARGET := $(OUTDIR)/perf_event/core.so

.PHONY: all asan rock test test-user test-asan test-stats test-sysctl lint clean bench doc bench-read bench-records bench-nginx bench-openresty bench-record bench-fleet bench-profile bench-remote bench-block bench-labels
all: $(TARGET)

$(TARGET): $(call objs_of,$(LUA)) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(OPT) $(CFLAGS) $(call objs_of,$(LUA)) -o $@ $(LDFLAGS_SO) $(LDFLAGS) $(DW_LIBS) $(BPF_LIBS)

build/asan/perf_event/core.so: $(call objs_of,asan) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) -O1 -g $(ASAN_FLAGS) $(call objs_of,asan) -o $@ -shared $(ASAN_FLAGS) $(DW_LIBS) $(BPF_LIBS)

asan: build/asan/perf_event/core.so build/test/asan/pesim.so build/test/asan/ljtest.so

# pesim: the ring and user-page simulators (spec/support/pesim.c), and
# ljtest: what the LuaJIT specs do to LuaJIT on purpose
# (spec/support/ljtest.c): test-only Lua modules per variant, never part of
# core.so
define variant
$(call objdir_of,$(1))/%.o: csrc/%.c $$(HDRS) Makefile
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASECFLAGS) $$(call cflags_of,$(1)) $$(call inc_of,$(1)) -Icsrc $$(if $$(filter %/unwind.c,$$<),$$(DW_CFLAGS)) \
	  $$(if $$(filter %/bpfprof.c,$$<),$$(BPF_CFLAGS)) -c $$< -o $$@
$(call objdir_of,$(1))/lj/bpfprof.o: $(BPF_GEN)
build/obj/$(1)/libpecore.a: $$(filter-out %/core.o,$$(call objs_of,$(1)))
	rm -f $$@
	ar rcs $$@ $$^
build/test/$(1)/pesim.so: spec/support/pesim.c build/obj/$(1)/libpecore.a $$(HDRS) Makefile
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASECFLAGS) $$(call cflags_of,$(1)) $$(call inc_of,$(1)) -Icsrc $$< \
	  build/obj/$(1)/libpecore.a -o $$@ -shared -Wl,--exclude-libs,ALL \
	  $$(if $$(filter asan,$(1)),$$(ASAN_FLAGS))
build/test/$(1)/ljtest.so: spec/support/ljtest.c build/obj/$(1)/libpecore.a $$(HDRS) Makefile
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASECFLAGS) $$(call cflags_of,$(1)) $$(call inc_of,$(1)) -Icsrc $$< \
	  build/obj/$(1)/libpecore.a -o $$@ -shared -Wl,--exclude-libs,ALL \
	  $$(if $$(filter asan,$(1)),$$(ASAN_FLAGS))
endef
$(foreach v,$(sort luajit lua5.4 lua5.1 asan rock $(LUA)),$(eval $(call variant,$(v))))

# the BPF program, built for the bpf target and embedded in the core as bytes
build/gen/ljstack.bpf.o: csrc/bpf/ljstack.bpf.c csrc/bpf/ljstack.h csrc/lj/offsets.h Makefile
	@mkdir -p $(dir $@)
	$(BPF_CLANG) -O2 -g -Wall -Wextra -Werror -target bpf -Icsrc -I/usr/include/$(shell $(CC) -dumpmachine) -c $< -o $@
build/gen/ljstack_bpf.h: build/gen/ljstack.bpf.o
	{ echo 'static const unsigned char ljstack_bpf[] = {'; \
	  od -An -v -tx1 $< | sed 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'; echo '};'; } > $@

rock: $(ROCK_DIR)/perf_event/core.so
$(ROCK_DIR)/perf_event/core.so: $(call objs_of,rock) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(OPT) $(CFLAGS) $(call objs_of,rock) -o $@ $(LDFLAGS_SO) $(LDFLAGS) $(DW_LIBS) $(BPF_LIBS)

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
          build/test/lua5.4/petest.so build/test/lua5.1/petest.so \
          build/test/luajit/pesim.so build/test/lua5.4/pesim.so build/test/lua5.1/pesim.so \
          build/test/luajit/ljtest.so

# (the builds two jobs at a time: one per core of the CI machine)
test:
	$(MAKE) -j2 fixtures
	$(MAKE) -j2 LUA=luajit
	$(MAKE) -j2 LUA=lua5.4
	$(MAKE) -j2 LUA=lua5.1
	$(MAKE) -j2 asan
	$(MAKE) -j2 fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	@$(RUNTESTS_LAST)

# runtests' closing "N passed, N failed, N skipped" stays the last line: make
# prints "make: *** [...] Error 1" after any failed recipe (-s or .SILENT do
# not stop it), so on a failure the recipe ends make with SIGPIPE, which
# neither make nor a calling shell reports (exit status 141, not 0).  Under a
# parent make, the parent says "Broken pipe".
RUNTESTS_LAST = tools/runtests || kill -PIPE $$PPID

test-user:
	@tools/test-as-user || kill -PIPE $$PPID

# the tests tagged #stats, left out of `make test`: whether they pass
# depends on the scheduler (a drain keeping up, a race against perf), not on
# a bound from their sample count (spec/support/stats.lua)
test-stats: fixtures
	$(MAKE) LUA=luajit
	$(MAKE) LUA=lua5.4
	$(MAKE) LUA=lua5.1
	$(MAKE) asan
	@PE_STATS=1 $(RUNTESTS_LAST)

test-asan: fixtures asan
	@PE_SUITES=asan $(RUNTESTS_LAST)

# not part of `make test`: these change every perf user on the machine while
# they run (spec/optin/*.lua do not match busted's "_spec" pattern)
test-sysctl: fixtures all
	PE_ALLOW_SYSCTL=1 PE_SUITES=luajit tools/runtests --pattern=. spec/optin

lint:
	luacheck lua spec bin examples bench
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --std=c11 -i csrc/bpf csrc

# benchmarks: ratios against a C baseline in the same run (see README)
bench-read: all
	bench/read/run 9 200000
bench-records: all
	bench/records/run.sh 50000 15
bench-nginx: all fixtures
	bench/nginx/run.sh 3 11
# perf_event.openresty configured by doc/openresty.md's snippet: the always-on
# sampler and log() against a twin server and the group's read(2)
bench-openresty: all
	bench/nginx/module.sh 3 15
# an armed block profile on /hello (root: its worker runs as root)
bench-block: all
	bench/nginx/block.sh 3 9
# what the route and VM state labels add to a sample, against 7e4314f
bench-labels: all
	bench/profile/labels.sh 9
bench-record: all fixtures
	bench/record/run.sh 300000000 5
bench-fleet: all
	bench/fleet/run.sh 5 5
# Lua-level profiles: CPU time of a mixed workload with no profile, jit.profile
# and pe.profile, LuaJIT, 5.4 and 5.1 (PE_BENCH_CALLGRIND=1: Ir per sample)
bench-profile: all
	$(MAKE) LUA=lua5.4
	$(MAKE) LUA=lua5.1
	bench/profile/run.sh 15 0.2
# luaperf record --lua -p on an unprepared LuaJIT (root, libbpf): what it costs
# the target at 99 and 999 Hz, and its own CPU
bench-remote: all
	luajit bench/remote/overhead.lua 99 30
	luajit bench/remote/overhead.lua 999 10
bench: bench-read bench-records bench-nginx bench-openresty bench-record bench-fleet bench-profile bench-remote \
	bench-block bench-labels

# the LDoc reference (lua-ldoc) -> doc/reference/; LDoc copies its
# template to /tmp/ldoc_root (a fixed name, TMPDIR not heeded) and leaves it
doc:
	ldoc .
	rm -rf /tmp/ldoc_root

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
FUZZ_SAN := address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS := -g -O1 -std=gnu11 -Wall -Wextra -Werror -I/usr/include/lua5.4 -Icsrc
FUZZ_LUA_LIB := $(shell pkg-config --variable=libdir lua5.4 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)/liblua5.4.a
# the core's sources and the simulators (pesim.c), compiled once with the
# fuzzers' instrumentation, linked into each fuzzer
FUZZ_OBJS := $(patsubst csrc/%.c,build/fuzz/obj/%.o,$(SRCS)) build/fuzz/obj/pesim.o
.SECONDARY: $(FUZZ_OBJS)

build/fuzz/obj/%.o: csrc/%.c $(HDRS) Makefile
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,$(FUZZ_SAN) -c $< -o $@
build/fuzz/obj/pesim.o: spec/support/pesim.c $(HDRS) Makefile
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,$(FUZZ_SAN) -c $< -o $@
build/fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.h $(FUZZ_OBJS) $(HDRS) Makefile
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer,$(FUZZ_SAN) $< $(FUZZ_OBJS) $(FUZZ_LUA_LIB) -lm -ldl -o $@

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
	PE_SOAK=long PE_STATS=1 PE_SUITES=luajit tools/runtests spec/soak_spec.lua

.PHONY: fuzz fuzz-build fuzz-seed test-valgrind soak

# ---- release: make dist -> dist/perf_event-$(VERSION).tar.gz and
# dist/perf_event-$(VERSION)-1.src.rock (rockspec/release/perf_event-$(VERSION)-1.rockspec
# with the archive, zipped as `luarocks pack` would).  The archive is `git archive` of HEAD: what is committed,
# not the work tree.
VERSION := 0.1.0
DIST := dist
.PHONY: dist
dist:
	@mkdir -p $(DIST)
	rm -f $(DIST)/perf_event-$(VERSION).tar.gz $(DIST)/perf_event-$(VERSION)-1.src.rock
	git archive --format=tar.gz --prefix=perf_event-$(VERSION)/ -o $(DIST)/perf_event-$(VERSION).tar.gz HEAD
	cp rockspec/release/perf_event-$(VERSION)-1.rockspec $(DIST)/
	cd $(DIST) && zip -q perf_event-$(VERSION)-1.src.rock perf_event-$(VERSION)-1.rockspec perf_event-$(VERSION).tar.gz
	rm -f $(DIST)/perf_event-$(VERSION)-1.rockspec
