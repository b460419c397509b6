/*
 * lj/bpfprof.c - the BPF side of `luaperf record --lua -p` on a process
 * that loaded nothing of ours: bpf/ljstack.bpf.c (embedded, built by the
 * Makefile) loaded with libbpf, attached to sampling events the Lua side
 * opened, fed each process's VM (perf_event.remote's state), and its ring
 * of raw chains read back.  Compiled with libbpf when pkg-config finds
 * it (libbpf-dev) and clang builds the program (PE_HAVE_LIBBPF); without
 * them each entry says why not.
 *
 *   _private.ljb_load()            -> true | nil, why
 *   _private.ljb_vm(pid, st)       -> true | nil, why (st: ljr_state's)
 *   _private.ljb_prog()            -> the program's fd (for ev:set_bpf) | nil, why
 *   _private.ljb_poll(ms [, max])  -> {sample, ...}: {pid=, tid=, vmstate=,
 *                                     how=, l=, base=, pc=, rip=, rsp=,
 *                                     ret={32 words at rsp}, fn={...},
 *                                     pcs={...}, fpc={...}, kind={...},
 *                                     truncated=}: pcs[i] the PC frame
 *                                     i+1 resumes at, or 0; kind[i] and
 *                                     fpc[i] frame i's function as it
 *                                     was (bpf/ljstack.h)
 *   _private.ljb_counts()          -> {sent=, dropped=, unknown=}
 *   _private.ljb_close()
 */
#define _GNU_SOURCE
#include "pe_core.h"
#include <string.h>
#include <stdlib.h>

#ifdef PE_HAVE_LIBBPF
#include <bpf/libbpf.h>
#include <bpf/bpf.h>
#include "ljstack_bpf.h"           /* build/gen: the program's object, bytes */

#include "bpf/ljstack.h"

static struct bpf_object *ljb_obj;
static struct ring_buffer *ljb_rb;
static int ljb_prog = -1, ljb_vms = -1, ljb_counts_fd = -1;

/* the poll's Lua state and table while ring_buffer__poll calls back */
static lua_State *ljb_L;
static int ljb_n, ljb_max;

static void ljb_setnum(lua_State *L, const char *k, uint64_t v)
{
  lua_pushnumber(L, (lua_Number)v);
  lua_setfield(L, -2, k);
}

static int ljb_one(void *ctx, void *data, size_t size)
{
  lua_State *L = ljb_L;
  const struct ljb_sample *s = data;
  uint32_t i, n;
  (void)ctx;
  if (size < sizeof *s || ljb_n >= ljb_max) return 0;
  n = s->n < LJB_MAXF ? s->n : LJB_MAXF;
  lua_createtable(L, 0, 14);
  lua_pushinteger(L, s->pid); lua_setfield(L, -2, "pid");
  lua_pushinteger(L, s->tid); lua_setfield(L, -2, "tid");
  lua_pushinteger(L, s->vmstate); lua_setfield(L, -2, "vmstate");
  lua_pushinteger(L, s->how); lua_setfield(L, -2, "how");
  lua_pushboolean(L, s->trunc != 0); lua_setfield(L, -2, "truncated");
  ljb_setnum(L, "l", s->l);
  ljb_setnum(L, "base", s->base);
  ljb_setnum(L, "pc", s->pc);
  ljb_setnum(L, "rip", s->rip);
  ljb_setnum(L, "rsp", s->rsp);
  lua_createtable(L, LJB_RET, 0);
  for (i = 0; i < LJB_RET; i++) { lua_pushnumber(L, (lua_Number)s->ret[i]); lua_rawseti(L, -2, (int)i + 1); }
  lua_setfield(L, -2, "ret");
  lua_createtable(L, (int)n, 0);
  for (i = 0; i < n; i++) { lua_pushnumber(L, (lua_Number)s->fn[i]); lua_rawseti(L, -2, (int)i + 1); }
  lua_setfield(L, -2, "fn");
  lua_createtable(L, (int)n, 0);
  for (i = 0; i < n; i++) { lua_pushnumber(L, (lua_Number)s->pcs[i]); lua_rawseti(L, -2, (int)i + 1); }
  lua_setfield(L, -2, "pcs");
  lua_createtable(L, (int)n, 0);
  for (i = 0; i < n; i++) { lua_pushnumber(L, (lua_Number)s->fpc[i]); lua_rawseti(L, -2, (int)i + 1); }
  lua_setfield(L, -2, "fpc");
  lua_createtable(L, (int)n, 0);
  for (i = 0; i < n; i++) { lua_pushinteger(L, (lua_Integer)s->kind[i]); lua_rawseti(L, -2, (int)i + 1); }
  lua_setfield(L, -2, "kind");
  lua_rawseti(L, -2, ++ljb_n);
  return 0;
}

static int ljb_why(lua_State *L, const char *what, int err)
{
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", what, strerror(err > 0 ? err : -err));
  lua_pushinteger(L, err > 0 ? err : -err);
  return 3;
}

static void ljb_free(void)
{
  if (ljb_rb) ring_buffer__free(ljb_rb);
  if (ljb_obj) bpf_object__close(ljb_obj);
  ljb_rb = NULL;
  ljb_obj = NULL;
  ljb_prog = ljb_vms = ljb_counts_fd = -1;
}

static int l_load(lua_State *L)
{
  struct bpf_program *prog;
  int err, rfd;
  if (ljb_obj) { lua_pushboolean(L, 1); return 1; }
  libbpf_set_print(NULL);
  ljb_obj = bpf_object__open_mem(ljstack_bpf, sizeof ljstack_bpf, NULL);
  if (!ljb_obj) { err = errno; ljb_free(); return ljb_why(L, "opening the BPF program", err); }
  err = bpf_object__load(ljb_obj);
  if (err) { ljb_free(); return ljb_why(L, "loading the BPF program", err); }
  prog = bpf_object__find_program_by_name(ljb_obj, "ljb_sample");
  ljb_prog = prog ? bpf_program__fd(prog) : -1;
  ljb_vms = bpf_object__find_map_fd_by_name(ljb_obj, "ljb_vms");
  ljb_counts_fd = bpf_object__find_map_fd_by_name(ljb_obj, "ljb_counts");
  rfd = bpf_object__find_map_fd_by_name(ljb_obj, "ljb_samples");
  if (ljb_prog < 0 || ljb_vms < 0 || rfd < 0 || ljb_counts_fd < 0) {
    ljb_free();
    return ljb_why(L, "the BPF object", ENOENT);
  }
  ljb_rb = ring_buffer__new(rfd, ljb_one, NULL, NULL);
  if (!ljb_rb) { err = errno; ljb_free(); return ljb_why(L, "the BPF ring buffer", err); }
  lua_pushboolean(L, 1);
  return 1;
}

static uint64_t ljb_num(lua_State *L, int t, const char *k)
{
  lua_Number v;
  lua_getfield(L, t, k);
  v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v > 0 ? (uint64_t)v : 0;
}

static int l_vm(lua_State *L)
{
  uint32_t pid = (uint32_t)luaL_checkinteger(L, 1);
  struct ljb_vm vm;
  luaL_checktype(L, 2, LUA_TTABLE);
  if (!ljb_obj) return ljb_why(L, "the BPF program is not loaded", EINVAL);
  vm.g = ljb_num(L, 2, "g");
  vm.curl_at = ljb_num(L, 2, "curl_at");
  vm.vmstate_at = ljb_num(L, 2, "vmstate_at");
  vm.dispatch = ljb_num(L, 2, "dispatch");
  vm.vm_lo = ljb_num(L, 2, "vm_lo");
  vm.vm_hi = ljb_num(L, 2, "vm_hi");
  vm.mainth = ljb_num(L, 2, "mainth");
  if (bpf_map_update_elem(ljb_vms, &pid, &vm, BPF_ANY) != 0) return ljb_why(L, "the BPF map of VMs", errno);
  lua_pushboolean(L, 1);
  return 1;
}

/* the program's fd, for ev:set_bpf */
static int l_prog(lua_State *L)
{
  if (!ljb_obj) return ljb_why(L, "the BPF program is not loaded", EINVAL);
  lua_pushinteger(L, ljb_prog);
  return 1;
}

static int l_poll(lua_State *L)
{
  int ms = (int)luaL_optinteger(L, 1, 0);
  ljb_max = (int)luaL_optinteger(L, 2, 1 << 20);
  lua_newtable(L);
  if (!ljb_rb) return 1;
  ljb_L = L;
  ljb_n = 0;
  ring_buffer__poll(ljb_rb, ms);
  ljb_L = NULL;
  return 1;
}

static int l_counts(lua_State *L)
{
  static const char *const names[] = { "sent", "dropped", "unknown" };
  int ncpu = libbpf_num_possible_cpus(), k;
  uint64_t *vals;
  lua_createtable(L, 0, 3);
  if (!ljb_obj || ncpu <= 0) return 1;
  vals = calloc((size_t)ncpu, sizeof *vals);
  if (!vals) return 1;
  for (k = 0; k < 3; k++) {
    uint32_t key = (uint32_t)k;
    uint64_t sum = 0;
    int c;
    if (bpf_map_lookup_elem(ljb_counts_fd, &key, vals) == 0)
      for (c = 0; c < ncpu; c++) sum += vals[c];
    ljb_setnum(L, names[k], sum);
  }
  free(vals);
  return 1;
}

static int l_close(lua_State *L)
{
  (void)L;
  ljb_free();
  return 0;
}

#define LJB_FUNCS                                                                              \
  {"ljb_load", l_load}, {"ljb_vm", l_vm}, {"ljb_prog", l_prog}, {"ljb_poll", l_poll}, \
  {"ljb_counts", l_counts}, {"ljb_close", l_close}

#else

static int l_none(lua_State *L)
{
  lua_pushnil(L);
  lua_pushliteral(L, "built without BPF (libbpf-dev and clang at build time: tools/setup installs them)");
  return 2;
}
#define LJB_FUNCS                                                                              \
  {"ljb_load", l_none}, {"ljb_vm", l_none}, {"ljb_prog", l_none}, {"ljb_poll", l_none}, \
  {"ljb_counts", l_none}, {"ljb_close", l_none}

#endif

void pe_open_ljbpf(lua_State *L)
{
  static const luaL_Reg fns[] = { LJB_FUNCS, {NULL, NULL} };
  pe_push_private(L, lua_gettop(L));
  pe_setfuncs(L, fns);
  lua_pop(L, 1);
}
