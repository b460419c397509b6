/*
 * abi.c - the kernel ABI as tables, and core.abi (their Lua view).
 *
 * Owns: every name <-> number of the perf_event ABI the binding knows:
 * attr types, the attr field table (storage, union groups, perf's print
 * order and labels), the sample_type / read_format / branch_sample_type bit
 * names, errno names, callchain context markers, record types and misc
 * bits, the fixed-layout sample fields, breakpoint types, and the
 * software / hardware / hardware-cache event ids.  The encoder (attr.c), the decoder (records.c)
 * and the messages (errors.c) read these tables; the Lua modules read
 * core.abi, so no number of the ABI is typed twice.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include "pe_core.h"
#include "pe_records.h"

/* ---- bit names --------------------------------------------------------- */
const pe_bitname pe_sample_bits[] = {
  {"ip", PE_SAMPLE_IP}, {"tid", PE_SAMPLE_TID}, {"time", PE_SAMPLE_TIME},
  {"addr", PE_SAMPLE_ADDR}, {"read", PE_SAMPLE_READ},
  {"callchain", PE_SAMPLE_CALLCHAIN}, {"id", PE_SAMPLE_ID},
  {"cpu", PE_SAMPLE_CPU}, {"period", PE_SAMPLE_PERIOD},
  {"stream_id", PE_SAMPLE_STREAM_ID}, {"raw", PE_SAMPLE_RAW},
  {"branch_stack", PE_SAMPLE_BRANCH_STACK}, {"regs_user", PE_SAMPLE_REGS_USER},
  {"stack_user", PE_SAMPLE_STACK_USER}, {"weight", PE_SAMPLE_WEIGHT},
  {"data_src", PE_SAMPLE_DATA_SRC}, {"identifier", PE_SAMPLE_IDENTIFIER},
  {"transaction", PE_SAMPLE_TRANSACTION}, {"regs_intr", PE_SAMPLE_REGS_INTR},
  {"phys_addr", PE_SAMPLE_PHYS_ADDR}, {"aux", PE_SAMPLE_AUX},
  {"cgroup", PE_SAMPLE_CGROUP}, {"data_page_size", PE_SAMPLE_DATA_PAGE_SIZE},
  {"code_page_size", PE_SAMPLE_CODE_PAGE_SIZE},
  {"weight_struct", PE_SAMPLE_WEIGHT_STRUCT}, {NULL, 0}
};

const pe_bitname pe_read_bits[] = {
  {"total_time_enabled", PE_FORMAT_TOTAL_TIME_ENABLED},
  {"total_time_running", PE_FORMAT_TOTAL_TIME_RUNNING},
  {"id", PE_FORMAT_ID}, {"group", PE_FORMAT_GROUP}, {"lost", PE_FORMAT_LOST},
  {NULL, 0}
};

const pe_bitname pe_branch_bits[] = {
  {"user", 1u << 0}, {"kernel", 1u << 1}, {"hv", 1u << 2},
  {"any", 1u << 3}, {"any_call", 1u << 4}, {"any_return", 1u << 5},
  {"ind_call", 1u << 6}, {"abort_tx", 1u << 7}, {"in_tx", 1u << 8},
  {"no_tx", 1u << 9}, {"cond", 1u << 10}, {"call_stack", 1u << 11},
  {"ind_jump", 1u << 12}, {"call", 1u << 13}, {"no_flags", 1u << 14},
  {"no_cycles", 1u << 15}, {"type_save", 1u << 16},
  {"hw_index", PE_SAMPLE_BRANCH_HW_INDEX}, {"priv_save", 1u << 18},
  {"counters", PE_SAMPLE_BRANCH_COUNTERS}, {"plm_all", PE_SAMPLE_BRANCH_PLM_ALL},
  {NULL, 0}
};

/* ---- breakpoint types (B29): <linux/hw_breakpoint.h> ------------------- */
static const pe_named bp_types[] = {
  {"empty", PE_BP_EMPTY}, {"r", PE_BP_R}, {"w", PE_BP_W}, {"rw", PE_BP_RW},
  {"x", PE_BP_X}, {NULL, 0}
};

/* ---- attr types -------------------------------------------------------- */
const pe_named pe_type_names[] = {
  {"hardware", PE_TYPE_HARDWARE}, {"software", PE_TYPE_SOFTWARE},
  {"tracepoint", PE_TYPE_TRACEPOINT}, {"hw_cache", PE_TYPE_HW_CACHE},
  {"raw", PE_TYPE_RAW}, {"breakpoint", PE_TYPE_BREAKPOINT}, {NULL, 0}
};

/* ---- the attr field table ---------------------------------------------- */
#define OFF(f) ((unsigned)offsetof(struct pe_attr, f))
#define SZ(f) ((unsigned)sizeof(((struct pe_attr *)0)->f))
#define AT(f) OFF(f), SZ(f)
#define FLAG(n) {#n, PE_K_FLAG, AT(flags), PE_FLAG_##n, 0, #n, 0, 0}
#define PERIOD "{ sample_period, sample_freq }"
#define WAKEUP "{ wakeup_events, wakeup_watermark }"
#define CONFIG1 "{ bp_addr, config1 }"
#define CONFIG2 "{ bp_len, config2 }"

/* In the order perf prints an attr (perf_event_attr__fprintf); the fields
 * perf does not print (perf = NULL) sit by their storage. */
const pe_fielddesc pe_attr_fields[] = {
  {"type", PE_K_TYPE, AT(type), 0, 0, "type", 0, 0},
  {"size", PE_K_U32, AT(size), 0, 0, "size", 0, 0},
  {"config", PE_K_U64, AT(config), 0, 0, "config", 1, 0},
  {"sample_period", PE_K_U64, AT(sample_period), 0, 1, PERIOD, 0, 0},
  {"sample_freq", PE_K_U64, AT(sample_period), 0, 1, PERIOD, 0, 0},
  {"sample_type", PE_K_BITS, AT(sample_type), 0, 0, "sample_type", 0, 0},
  {"read_format", PE_K_BITS, AT(read_format), 0, 0, "read_format", 0, 0},
  FLAG(disabled), FLAG(inherit), FLAG(pinned), FLAG(exclusive),
  FLAG(exclude_user), FLAG(exclude_kernel), FLAG(exclude_hv), FLAG(exclude_idle),
  FLAG(mmap), FLAG(comm), FLAG(freq), FLAG(inherit_stat), FLAG(enable_on_exec),
  FLAG(task), FLAG(watermark),
  {"precise_ip", PE_K_PRECISE, AT(flags), PE_FLAG_precise_ip, 0, "precise_ip", 0, 0},
  FLAG(mmap_data), FLAG(sample_id_all), FLAG(exclude_host), FLAG(exclude_guest),
  FLAG(exclude_callchain_kernel), FLAG(exclude_callchain_user), FLAG(mmap2),
  FLAG(comm_exec), FLAG(use_clockid), FLAG(context_switch), FLAG(write_backward),
  FLAG(namespaces), FLAG(ksymbol), FLAG(bpf_event), FLAG(aux_output), FLAG(cgroup),
  FLAG(text_poke), FLAG(build_id), FLAG(inherit_thread), FLAG(remove_on_exec),
  FLAG(sigtrap),
  {"wakeup_events", PE_K_U32, AT(wakeup_events), 0, 2, WAKEUP, 0, 0},
  {"wakeup_watermark", PE_K_U32, AT(wakeup_events), 0, 2, WAKEUP, 0, 0},
  {"bp_type", PE_K_BPTYPE, AT(bp_type), 0, 0, "bp_type", 0, 1},
  {"bp_addr", PE_K_U64, AT(config1), 0, 3, CONFIG1, 1, 1},
  {"config1", PE_K_U64, AT(config1), 0, 3, CONFIG1, 1, 1},
  {"kprobe_func", PE_K_STRPTR, AT(config1), 0, 3, NULL, 0, 0},
  {"uprobe_path", PE_K_STRPTR, AT(config1), 0, 3, NULL, 0, 0},
  {"bp_len", PE_K_U64, AT(config2), 0, 4, CONFIG2, 1, 1},
  {"config2", PE_K_U64, AT(config2), 0, 4, CONFIG2, 1, 1},
  {"kprobe_addr", PE_K_U64, AT(config2), 0, 4, NULL, 0, 0},
  {"probe_offset", PE_K_U64, AT(config2), 0, 4, NULL, 0, 0},
  {"branch_sample_type", PE_K_BITS, AT(branch_sample_type), 0, 0, "branch_sample_type", 0, 0},
  {"sample_regs_user", PE_K_U64, AT(sample_regs_user), 0, 0, "sample_regs_user", 1, 0},
  {"sample_stack_user", PE_K_U32, AT(sample_stack_user), 0, 0, "sample_stack_user", 0, 0},
  {"clockid", PE_K_CLOCKID, AT(clockid), 0, 0, "clockid", 0, 0},
  {"sample_regs_intr", PE_K_U64, AT(sample_regs_intr), 0, 0, "sample_regs_intr", 1, 0},
  {"aux_watermark", PE_K_U32, AT(aux_watermark), 0, 0, "aux_watermark", 0, 0},
  {"sample_max_stack", PE_K_U16, AT(sample_max_stack), 0, 0, "sample_max_stack", 0, 0},
  {"aux_sample_size", PE_K_U32, AT(aux_sample_size), 0, 0, "aux_sample_size", 0, 0},
  {"aux_action", PE_K_U32, AT(aux_action), 0, 5, NULL, 0, 0},
  {"aux_start_paused", PE_K_AUXBIT, AT(aux_action), 0, 0, NULL, 0, 0},
  {"aux_pause", PE_K_AUXBIT, AT(aux_action), 1, 0, NULL, 0, 0},
  {"aux_resume", PE_K_AUXBIT, AT(aux_action), 2, 0, NULL, 0, 0},
  {"sig_data", PE_K_U64, AT(sig_data), 0, 0, "sig_data", 1, 1},
  {"config3", PE_K_U64, AT(config3), 0, 0, "config3", 1, 0},
  {NULL, PE_K_U64, 0, 0, 0, 0, NULL, 0, 0}
};

const pe_fielddesc *pe_attr_field(const char *name)
{
  const pe_fielddesc *f;
  for (f = pe_attr_fields; f->name; f++)
    if (strcmp(f->name, name) == 0) return f;
  return NULL;
}

static const char *const kind_names[] = {
  "u64", "u32", "u16", "flag", "precise_ip", "bits", "type", "bp_type",
  "clockid", "string", "aux_bit"
};

/* ---- errno names ------------------------------------------------------- */
static const struct { int err; const char *name; } errnames[] = {
  {EPERM, "EPERM"}, {ENOENT, "ENOENT"}, {ESRCH, "ESRCH"}, {EINTR, "EINTR"},
  {EIO, "EIO"}, {ENXIO, "ENXIO"}, {E2BIG, "E2BIG"}, {EBADF, "EBADF"},
  {EAGAIN, "EAGAIN"}, {ENOMEM, "ENOMEM"}, {EACCES, "EACCES"},
  {EFAULT, "EFAULT"}, {EBUSY, "EBUSY"}, {EEXIST, "EEXIST"},
  {ENODEV, "ENODEV"}, {ENOTDIR, "ENOTDIR"}, {EISDIR, "EISDIR"},
  {EINVAL, "EINVAL"}, {ENFILE, "ENFILE"}, {EMFILE, "EMFILE"},
  {ENOTTY, "ENOTTY"}, {EFBIG, "EFBIG"}, {ENOSPC, "ENOSPC"},
  {ERANGE, "ERANGE"}, {ENOSYS, "ENOSYS"}, {EOPNOTSUPP, "EOPNOTSUPP"},
  {EOVERFLOW, "EOVERFLOW"}, {ENAMETOOLONG, "ENAMETOOLONG"},
  {ELOOP, "ELOOP"}, {EROFS, "EROFS"}, {ECHILD, "ECHILD"},
  {EPIPE, "EPIPE"}, {ETIMEDOUT, "ETIMEDOUT"}, {ENODATA, "ENODATA"},
};
#define N_ERRNAMES (sizeof errnames / sizeof errnames[0])

const char *pe_errno_name(int err)
{
  size_t i;
  for (i = 0; i < N_ERRNAMES; i++)
    if (errnames[i].err == err) return errnames[i].name;
  return "E?";
}

/* ---- callchain context markers (E26) ----------------------------------- */
static const struct { uint64_t ip; const char *name; } contexts[] = {
  {PE_CONTEXT_HV, "hv"}, {PE_CONTEXT_KERNEL, "kernel"}, {PE_CONTEXT_USER, "user"},
  {PE_CONTEXT_GUEST, "guest"}, {PE_CONTEXT_GUEST_KERNEL, "guest_kernel"},
  {PE_CONTEXT_GUEST_USER, "guest_user"}, {0, NULL}
};
/* what the decoder calls a marker (>= PERF_CONTEXT_MAX) it has no name for */
#define CONTEXT_OTHER "context"

const char *pe_context_name(uint64_t ip)
{
  int i;
  for (i = 0; contexts[i].name; i++)
    if (contexts[i].ip == ip) return contexts[i].name;
  return CONTEXT_OTHER;
}

/* ---- record types (E1): the decoder's type names ----------------------- */
static const char *const type_names[] = {
  NULL, "mmap", "lost", "comm", "exit", "throttle", "unthrottle", "fork",
  "read", "sample", "mmap2", "aux", "itrace_start", "lost_samples", "switch",
  "switch_cpu_wide", "namespaces", "ksymbol", "bpf_event", "cgroup",
  "text_poke", "aux_output_hw_id", "callchain_deferred"
};

const char *pe_record_type_name(uint32_t type)
{
  if (type < sizeof type_names / sizeof type_names[0]) return type_names[type];
  return NULL;
}

/* ---- record header misc bits (E2) -------------------------------------- */
static const pe_named misc_bits[] = {
  {"cpumode_mask", PE_RECORD_MISC_CPUMODE_MASK}, {"kernel", PE_RECORD_MISC_KERNEL},
  {"user", PE_RECORD_MISC_USER}, {"hypervisor", PE_RECORD_MISC_HYPERVISOR},
  {"guest_kernel", PE_RECORD_MISC_GUEST_KERNEL},
  {"guest_user", PE_RECORD_MISC_GUEST_USER},
  {"mmap_data", PE_RECORD_MISC_MMAP_DATA}, {"comm_exec", PE_RECORD_MISC_COMM_EXEC},
  {"switch_out", PE_RECORD_MISC_SWITCH_OUT}, {"exact_ip", PE_RECORD_MISC_EXACT_IP},
  {"switch_out_preempt", PE_RECORD_MISC_SWITCH_OUT_PREEMPT},
  {"mmap_build_id", PE_RECORD_MISC_MMAP_BUILD_ID}, {NULL, 0}
};

/* ---- the fixed-layout head of a sample (E5..E13) ----------------------- */
/* In record order: one u64 each, or two u32 halves (lo, hi; hi may be
 * reserved).  A sample whose sample_type has only these bits has a fixed
 * size: 8 bytes per entry present. */
static const struct {
  const char *name; uint64_t bit; const char *lo, *hi; int halves;
} sample_fixed[] = {
  {"identifier", PE_SAMPLE_IDENTIFIER, "id", NULL, 0},
  {"ip", PE_SAMPLE_IP, "ip", NULL, 0},
  {"tid", PE_SAMPLE_TID, "pid", "tid", 1},
  {"time", PE_SAMPLE_TIME, "time", NULL, 0},
  {"addr", PE_SAMPLE_ADDR, "addr", NULL, 0},
  {"id", PE_SAMPLE_ID, "id", NULL, 0},
  {"stream_id", PE_SAMPLE_STREAM_ID, "stream_id", NULL, 0},
  {"cpu", PE_SAMPLE_CPU, "cpu", NULL, 1},
  {"period", PE_SAMPLE_PERIOD, "period", NULL, 0},
  {NULL, 0, NULL, NULL, 0}
};

/* ---- event ids (B4, B6, B7) -------------------------------------------- */
static const pe_named sw_ids[] = {
  {"cpu_clock", PE_SW_CPU_CLOCK}, {"task_clock", PE_SW_TASK_CLOCK},
  {"page_faults", PE_SW_PAGE_FAULTS}, {"context_switches", PE_SW_CONTEXT_SWITCHES},
  {"cpu_migrations", PE_SW_CPU_MIGRATIONS}, {"page_faults_min", PE_SW_PAGE_FAULTS_MIN},
  {"page_faults_maj", PE_SW_PAGE_FAULTS_MAJ},
  {"alignment_faults", PE_SW_ALIGNMENT_FAULTS},
  {"emulation_faults", PE_SW_EMULATION_FAULTS}, {"dummy", PE_SW_DUMMY},
  {"bpf_output", PE_SW_BPF_OUTPUT}, {"cgroup_switches", PE_SW_CGROUP_SWITCHES},
  {NULL, 0}
};
static const pe_named hw_ids[] = {
  {"cpu_cycles", PE_HW_CPU_CYCLES}, {"instructions", PE_HW_INSTRUCTIONS},
  {"cache_references", PE_HW_CACHE_REFERENCES}, {"cache_misses", PE_HW_CACHE_MISSES},
  {"branch_instructions", PE_HW_BRANCH_INSTRUCTIONS},
  {"branch_misses", PE_HW_BRANCH_MISSES}, {"bus_cycles", PE_HW_BUS_CYCLES},
  {"stalled_cycles_frontend", PE_HW_STALLED_CYCLES_FRONTEND},
  {"stalled_cycles_backend", PE_HW_STALLED_CYCLES_BACKEND},
  {"ref_cpu_cycles", PE_HW_REF_CPU_CYCLES}, {NULL, 0}
};
static const pe_named cache_ids[] = {
  {"l1d", PE_HW_CACHE_L1D}, {"l1i", PE_HW_CACHE_L1I}, {"ll", PE_HW_CACHE_LL},
  {"dtlb", PE_HW_CACHE_DTLB}, {"itlb", PE_HW_CACHE_ITLB}, {"bpu", PE_HW_CACHE_BPU},
  {"node", PE_HW_CACHE_NODE}, {NULL, 0}
};
static const pe_named cache_ops[] = {
  {"read", PE_HW_CACHE_OP_READ}, {"write", PE_HW_CACHE_OP_WRITE},
  {"prefetch", PE_HW_CACHE_OP_PREFETCH}, {NULL, 0}
};
static const pe_named cache_results[] = {
  {"access", PE_HW_CACHE_RESULT_ACCESS}, {"miss", PE_HW_CACHE_RESULT_MISS}, {NULL, 0}
};

/* ---- the Lua view ------------------------------------------------------ */
static void set_int(lua_State *L, const char *k, lua_Integer v)
{
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

/* t[name] = bit for each entry, in a new table set as parent[key] */
static void push_bits(lua_State *L, const char *key, const pe_bitname *t)
{
  lua_newtable(L);
  for (; t->name; t++) {
    pe_push_u64(L, t->bit);
    lua_setfield(L, -2, t->name);
  }
  lua_setfield(L, -2, key);
}

/* parent[key] = {name = value}; with rkey, parent[rkey] = {[value] = name} */
static void push_named(lua_State *L, const char *key, const char *rkey, const pe_named *t)
{
  const pe_named *p;
  lua_newtable(L);
  for (p = t; p->name; p++) set_int(L, p->name, p->value);
  lua_setfield(L, -2, key);
  if (!rkey) return;
  lua_newtable(L);
  for (p = t; p->name; p++) {
    lua_pushstring(L, p->name);
    lua_rawseti(L, -2, (int)p->value);
  }
  lua_setfield(L, -2, rkey);
}

static void push_attr_fields(lua_State *L)
{
  const pe_fielddesc *f;
  int i = 0;
  lua_newtable(L);
  for (f = pe_attr_fields; f->name; f++) {
    lua_createtable(L, 0, 9);
    set_str(L, "name", f->name);
    set_str(L, "kind", kind_names[f->kind]);
    set_int(L, "offset", f->off);
    set_int(L, "size", f->size);
    if (f->kind == PE_K_FLAG || f->kind == PE_K_PRECISE || f->kind == PE_K_AUXBIT)
      set_int(L, "bit", f->bit);
    if (f->group) set_int(L, "union", f->group);
    if (f->perf) set_str(L, "perf", f->perf);
    lua_pushboolean(L, f->hex);
    lua_setfield(L, -2, "hex");
    lua_pushboolean(L, f->modify);
    lua_setfield(L, -2, "modify");
    lua_rawseti(L, -2, ++i);
  }
  lua_setfield(L, -2, "attr_fields");
}

static void push_errnos(lua_State *L)
{
  size_t i;
  lua_newtable(L);
  for (i = 0; i < N_ERRNAMES; i++) set_int(L, errnames[i].name, errnames[i].err);
  lua_setfield(L, -2, "errno");
  lua_newtable(L);
  for (i = 0; i < N_ERRNAMES; i++) {
    lua_pushstring(L, errnames[i].name);
    lua_rawseti(L, -2, errnames[i].err);
  }
  lua_setfield(L, -2, "errno_name");
}

static void push_records(lua_State *L)
{
  uint32_t t;
  lua_newtable(L);
  for (t = 0; t < PE_RECORD_MAX; t++) {
    const char *name = pe_record_type_name(t);
    if (!name) continue;
    lua_pushstring(L, name);
    lua_rawseti(L, -2, (int)t);
    set_int(L, name, t);
  }
  lua_setfield(L, -2, "record_type");
  lua_newtable(L);
  {
    const pe_named *m;
    for (m = misc_bits; m->name; m++) set_int(L, m->name, m->value);
  }
  lua_setfield(L, -2, "misc");
}

static void push_contexts(lua_State *L)
{
  int i;
  lua_newtable(L);
  for (i = 0; contexts[i].name; i++) {
    pe_push_u64(L, contexts[i].ip);
    lua_setfield(L, -2, contexts[i].name);
  }
  lua_setfield(L, -2, "context");
  pe_push_u64(L, PE_CONTEXT_MAX);
  lua_setfield(L, -2, "context_max");
  lua_pushliteral(L, CONTEXT_OTHER);
  lua_setfield(L, -2, "context_other");
}

static void push_sample_fixed(lua_State *L)
{
  int i;
  uint64_t mask = 0;
  lua_newtable(L);
  for (i = 0; sample_fixed[i].name; i++) {
    lua_createtable(L, 0, 5);
    set_str(L, "name", sample_fixed[i].name);
    pe_push_u64(L, sample_fixed[i].bit);
    lua_setfield(L, -2, "bit");
    if (sample_fixed[i].halves) {
      set_str(L, "lo", sample_fixed[i].lo);
      if (sample_fixed[i].hi) set_str(L, "hi", sample_fixed[i].hi);
    } else {
      set_str(L, "field", sample_fixed[i].lo);
    }
    lua_rawseti(L, -2, i + 1);
    mask |= sample_fixed[i].bit;
  }
  lua_setfield(L, -2, "sample_fixed");
  pe_push_u64(L, mask);
  lua_setfield(L, -2, "sample_fixed_mask");
  lua_pushinteger(L, PE_SAMPLE_MAX_BIT);
  lua_setfield(L, -2, "sample_max_bit");
}

void pe_open_abi(lua_State *L)
{
  lua_newtable(L);
  push_named(L, "type", "type_name", pe_type_names);
  push_bits(L, "sample_type", pe_sample_bits);
  push_bits(L, "read_format", pe_read_bits);
  push_bits(L, "branch_sample_type", pe_branch_bits);
  push_attr_fields(L);
  push_errnos(L);
  push_records(L);
  push_contexts(L);
  push_sample_fixed(L);
  push_named(L, "bp_type", NULL, bp_types);
  push_named(L, "sw", "sw_name", sw_ids);
  push_named(L, "hw", "hw_name", hw_ids);
  lua_newtable(L);
  push_named(L, "id", "id_name", cache_ids);
  push_named(L, "op", "op_name", cache_ops);
  push_named(L, "result", "result_name", cache_results);
  set_int(L, "op_shift", PE_HW_CACHE_OP_SHIFT);          /* config = id | op << 8 | result << 16 */
  set_int(L, "result_shift", PE_HW_CACHE_RESULT_SHIFT);
  lua_setfield(L, -2, "hw_cache");
  set_int(L, "attr_size", PE_ATTR_SIZE_VER8);
  lua_setfield(L, -2, "abi");
}
