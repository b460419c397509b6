/*
 * unwind.c - DWARF unwinding of sampled user stacks.
 *
 * Owns: core.unwind, core.unwind_available, core.unwind_regs.  A sample
 * taken with PERF_SAMPLE_REGS_USER and PERF_SAMPLE_STACK_USER carries the
 * user registers at the sample and a copy of the user stack from sp up.
 * elfutils' libdwfl (the library perf's util/unwind-libdw.c uses) walks that
 * copy with the call frame information (.eh_frame, .debug_frame) of the
 * files mapped in the process, so code built without frame pointers still
 * gives its callers.  libdw is optional at build time: the Makefile defines
 * PE_HAVE_LIBDW when pkg-config finds it; without it core.unwind answers
 * nil and a message, and core.unwind_available is false.
 */
#include <string.h>
#include "pe_core.h"

#if defined(PE_HAVE_LIBDW) && defined(__x86_64__)
#define PE_UNWIND 1
#include <stdbool.h>
#include <elfutils/libdwfl.h>
#include <dwarf.h>
#include <asm/perf_regs.h>
#endif

#define PE_UNWIND_MT "perf_event.unwind_session"
#define PE_UNWIND_MAX 512

#ifdef PE_UNWIND
/* The x86-64 DWARF registers 0..16 (rax rdx rcx rbx rsi rdi rbp rsp
 * r8..r15, return address = rip) by the names the record decoder gives
 * the sampled registers (records.c). */
static const char *const dwarf_names[17] = {
  "ax", "dx", "cx", "bx", "si", "di", "bp", "sp",
  "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "ip"
};
/* the sample_regs_user bits those registers need (asm/perf_regs.h) */
#define BIT(r) ((uint64_t)1 << (r))
static const uint64_t regs_mask =
  BIT(PERF_REG_X86_AX) | BIT(PERF_REG_X86_BX) | BIT(PERF_REG_X86_CX) | BIT(PERF_REG_X86_DX) |
  BIT(PERF_REG_X86_SI) | BIT(PERF_REG_X86_DI) | BIT(PERF_REG_X86_BP) | BIT(PERF_REG_X86_SP) |
  BIT(PERF_REG_X86_IP) | BIT(PERF_REG_X86_R8) | BIT(PERF_REG_X86_R9) | BIT(PERF_REG_X86_R10) |
  BIT(PERF_REG_X86_R11) | BIT(PERF_REG_X86_R12) | BIT(PERF_REG_X86_R13) |
  BIT(PERF_REG_X86_R14) | BIT(PERF_REG_X86_R15);

/* One set of mappings reported to libdwfl, cached per maps table: the
 * modules stay, the sample being unwound changes. */
typedef struct {
  Dwfl *dwfl;
  int attached;
  Dwarf_Word regs[17];
  const unsigned char *stack;
  size_t stack_len;
  uint64_t sp;
  uint64_t *pcs;
  int n, max;
} session;

static char *debuginfo_path;
static const Dwfl_Callbacks dwfl_callbacks = {
  .find_elf = dwfl_build_id_find_elf,
  .find_debuginfo = dwfl_standard_find_debuginfo,
  .section_address = dwfl_offline_section_address,
  .debuginfo_path = &debuginfo_path,
};

/* one thread: the sample's */
static pid_t next_thread(Dwfl *dwfl, void *arg, void **thread_argp)
{
  (void)dwfl;
  if (*thread_argp != NULL) return 0;
  *thread_argp = arg;
  return 1;
}

/* words of the stack copy; nothing else of the process is readable */
static bool memory_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *result, void *arg)
{
  session *s = arg;
  (void)dwfl;
  if (addr < s->sp || addr - s->sp > s->stack_len || s->stack_len - (addr - s->sp) < sizeof *result)
    return false;
  memcpy(result, s->stack + (addr - s->sp), sizeof *result);
  return true;
}

static bool set_initial_registers(Dwfl_Thread *thread, void *arg)
{
  session *s = arg;
  return dwfl_thread_state_registers(thread, 0, 17, s->regs);
}

static const Dwfl_Thread_Callbacks thread_callbacks = {
  .next_thread = next_thread,
  .memory_read = memory_read,
  .set_initial_registers = set_initial_registers,
};

static int frame_cb(Dwfl_Frame *state, void *arg)
{
  session *s = arg;
  Dwarf_Addr pc;
  bool activation;
  if (!dwfl_frame_pc(state, &pc, &activation)) return DWARF_CB_ABORT;
  if (pc == 0) return DWARF_CB_ABORT;
  s->pcs[s->n++] = pc;
  return s->n < s->max ? DWARF_CB_OK : DWARF_CB_ABORT;
}

static int session_gc(lua_State *L)
{
  session *s = luaL_checkudata(L, 1, PE_UNWIND_MT);
  if (s->dwfl) dwfl_end(s->dwfl);
  s->dwfl = NULL;
  return 0;
}

/* the session of the maps table at index m: cached in a weak-keyed table
 * (upvalue 1), made and its modules reported when missing */
static session *session_for(lua_State *L, int m)
{
  session *s;
  int i, n, files, top = lua_gettop(L);
  lua_pushvalue(L, m);
  lua_rawget(L, lua_upvalueindex(1));
  if (lua_isuserdata(L, -1)) {
    s = lua_touserdata(L, -1);
    lua_settop(L, top);
    return s;
  }
  lua_pop(L, 1);
  s = lua_newuserdata(L, sizeof *s);
  memset(s, 0, sizeof *s);
  luaL_getmetatable(L, PE_UNWIND_MT);
  lua_setmetatable(L, -2);
  s->dwfl = dwfl_begin(&dwfl_callbacks);
  if (!s->dwfl) { lua_settop(L, top); return NULL; }
  lua_newtable(L);                           /* files reported */
  files = lua_gettop(L);
  dwfl_report_begin(s->dwfl);
  n = (int)pe_rawlen(L, m);
  for (i = 1; i <= n; i++) {
    const char *file;
    uint64_t start, pgoff;
    int map;
    lua_settop(L, files);
    lua_rawgeti(L, m, i);
    map = lua_gettop(L);
    if (!lua_istable(L, map)) continue;
    lua_getfield(L, map, "file");
    file = lua_tostring(L, -1);
    if (!file || file[0] != '/' || strstr(file, " (deleted)")) continue;
    start = pe_opt_u64(L, map, "start", 0);
    pgoff = pe_opt_u64(L, map, "pgoff", 0);
    lua_getfield(L, files, file);
    if (start < pgoff || !lua_isnil(L, -1)) continue;
    /* as perf: the file is loaded at its first mapping's start less that
     * mapping's file offset */
    dwfl_report_elf(s->dwfl, strrchr(file, '/') + 1, file, -1, (GElf_Addr)(start - pgoff), false);
    lua_pushboolean(L, 1);
    lua_setfield(L, files, file);
  }
  lua_settop(L, files);
  dwfl_report_end(s->dwfl, NULL, NULL);
  lua_pop(L, 1);
  s->attached = dwfl_attach_state(s->dwfl, NULL, 1, &thread_callbacks, s);
  lua_pushvalue(L, m);
  lua_pushvalue(L, -2);
  lua_rawset(L, lua_upvalueindex(1));
  lua_settop(L, top);
  return s;
}
#endif

/* core.unwind(maps, regs_user, stack_user [, max]) -> array of the pcs of
 * the frames, the sampled ip first, then return addresses; nil, message
 * when it cannot unwind (no libdw, no user registers).  maps: the
 * executable mappings of the process, {start=, stop=, pgoff=, file=} (as
 * perf_event.symbols keeps them); regs_user and stack_user: the fields of
 * a decoded sample. */
static int l_unwind(lua_State *L)
{
#ifdef PE_UNWIND
  session *s;
  uint64_t pcs[PE_UNWIND_MAX];
  size_t len;
  uint64_t dyn;
  int i, max;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  max = lua_isnoneornil(L, 4) ? 127 : pe_check_int(L, 4, "unwind: max", 1, PE_UNWIND_MAX);
  if (pe_opt_u64(L, 2, "abi", 0) == 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "unwind: the sample has no user registers (kernel thread, or none asked)");
    return 2;
  }
  lua_getfield(L, 3, "data");
  if (!lua_isstring(L, -1)) return luaL_error(L, "unwind: stack_user.data must be a string");
  s = session_for(L, 1);
  if (!s || !s->attached) {
    lua_pushnil(L);
    lua_pushfstring(L, "unwind: libdwfl: %s", dwfl_errmsg(-1));
    return 2;
  }
  s->stack = (const unsigned char *)lua_tolstring(L, -1, &len);
  dyn = pe_opt_u64(L, 3, "dyn_size", len);
  s->stack_len = dyn < len ? (size_t)dyn : len;
  for (i = 0; i < 17; i++) s->regs[i] = pe_opt_u64(L, 2, dwarf_names[i], 0);
  s->sp = s->regs[7];
  s->pcs = pcs;
  s->n = 0;
  s->max = max;
  dwfl_getthread_frames(s->dwfl, 1, frame_cb, s);
  s->stack = NULL;
  s->pcs = NULL;
  lua_createtable(L, s->n, 0);
  for (i = 0; i < s->n; i++) {
    pe_push_u64(L, pcs[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
#else
  lua_pushnil(L);
#if defined(PE_HAVE_LIBDW)
  lua_pushliteral(L, "perf_event.core: DWARF unwinding is implemented for x86-64 only");
#else
  lua_pushliteral(L, "perf_event.core was built without libdw (elfutils, libdw-dev): "
                     "DWARF unwinding is not available");
#endif
  return 2;
#endif
}

void pe_open_unwind(lua_State *L)
{
#ifdef PE_UNWIND
  luaL_newmetatable(L, PE_UNWIND_MT);
  lua_pushcfunction(L, session_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_newtable(L);                           /* maps table -> session */
  lua_newtable(L);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushcclosure(L, l_unwind, 1);
  lua_setfield(L, -2, "unwind");
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "unwind_available");
  pe_push_u64(L, regs_mask);
  lua_setfield(L, -2, "unwind_regs");
#else
  lua_pushcfunction(L, l_unwind);
  lua_setfield(L, -2, "unwind");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "unwind_available");
#endif
}
