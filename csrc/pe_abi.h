/*
 * pe_abi.h - our own copy of the perf_event kernel ABI.
 *
 * Owns: struct layouts (perf_event_attr up to config3 / size 136, the mmap
 * user page, record header), every PERF_* constant the binding uses, and
 * the ioctl request codes.  Written from the UAPI documentation and checked
 * against the running kernel (see doc/coverage.md sections B-G);
 * the build never includes <linux/perf_event.h>, so it does not depend on
 * the host's linux-libc-dev version.  Names carry a PE_ prefix so they can
 * coexist with the system header if a user includes both.
 */
#ifndef PE_ABI_H
#define PE_ABI_H

#include <stdint.h>
#include <stddef.h>

/* ---- syscall number ---------------------------------------------------- */
#if defined(__x86_64__)
#define PE_NR_perf_event_open 298
#elif defined(__aarch64__) || defined(__riscv)
#define PE_NR_perf_event_open 241
#elif defined(__i386__)
#define PE_NR_perf_event_open 336
#elif defined(__arm__)
#define PE_NR_perf_event_open 364
#elif defined(__powerpc__)
#define PE_NR_perf_event_open 319
#elif defined(__s390__)
#define PE_NR_perf_event_open 331
#else
#include <sys/syscall.h>
#define PE_NR_perf_event_open SYS_perf_event_open
#endif

/* ---- attr types (B3) --------------------------------------------------- */
enum {
  PE_TYPE_HARDWARE = 0, PE_TYPE_SOFTWARE = 1, PE_TYPE_TRACEPOINT = 2,
  PE_TYPE_HW_CACHE = 3, PE_TYPE_RAW = 4, PE_TYPE_BREAKPOINT = 5
};

/* ---- attr sizes (B1) --------------------------------------------------- */
#define PE_ATTR_SIZE_VER0 64
#define PE_ATTR_SIZE_VER1 72
#define PE_ATTR_SIZE_VER2 80
#define PE_ATTR_SIZE_VER3 96
#define PE_ATTR_SIZE_VER4 104
#define PE_ATTR_SIZE_VER5 112
#define PE_ATTR_SIZE_VER6 120
#define PE_ATTR_SIZE_VER7 128
#define PE_ATTR_SIZE_VER8 136

/*
 * struct perf_event_attr, x86_64/arm64 layout (B0..B0c).  The flag
 * bitfield is kept as one u64 word; PE_FLAG_* give the bit positions.
 */
struct pe_attr {
  uint32_t type;                 /* 0 */
  uint32_t size;                 /* 4 */
  uint64_t config;               /* 8 */
  uint64_t sample_period;        /* 16: union with sample_freq */
  uint64_t sample_type;          /* 24 */
  uint64_t read_format;          /* 32 */
  uint64_t flags;                /* 40: the bitfield word */
  uint32_t wakeup_events;        /* 48: union with wakeup_watermark */
  uint32_t bp_type;              /* 52 */
  uint64_t config1;              /* 56: bp_addr, kprobe_func, uprobe_path */
  uint64_t config2;              /* 64: bp_len, kprobe_addr, probe_offset */
  uint64_t branch_sample_type;   /* 72 */
  uint64_t sample_regs_user;     /* 80 */
  uint32_t sample_stack_user;    /* 88 */
  int32_t  clockid;              /* 92 */
  uint64_t sample_regs_intr;     /* 96 */
  uint32_t aux_watermark;        /* 104 */
  uint16_t sample_max_stack;     /* 108 */
  uint16_t reserved_2;           /* 110 */
  uint32_t aux_sample_size;      /* 112 */
  uint32_t aux_action;           /* 116: aux_start_paused:1 aux_pause:1 aux_resume:1 */
  uint64_t sig_data;             /* 120 */
  uint64_t config3;              /* 128 */
};                               /* 136 */

_Static_assert(sizeof(struct pe_attr) == PE_ATTR_SIZE_VER8, "attr size");
_Static_assert(offsetof(struct pe_attr, flags) == 40, "flags offset");
_Static_assert(offsetof(struct pe_attr, config1) == 56, "config1 offset");
_Static_assert(offsetof(struct pe_attr, sample_regs_intr) == 96, "regs_intr offset");
_Static_assert(offsetof(struct pe_attr, sig_data) == 120, "sig_data offset");

/* flag word bit positions (B19..B24) */
enum {
  PE_FLAG_disabled = 0, PE_FLAG_inherit = 1, PE_FLAG_pinned = 2,
  PE_FLAG_exclusive = 3, PE_FLAG_exclude_user = 4, PE_FLAG_exclude_kernel = 5,
  PE_FLAG_exclude_hv = 6, PE_FLAG_exclude_idle = 7, PE_FLAG_mmap = 8,
  PE_FLAG_comm = 9, PE_FLAG_freq = 10, PE_FLAG_inherit_stat = 11,
  PE_FLAG_enable_on_exec = 12, PE_FLAG_task = 13, PE_FLAG_watermark = 14,
  PE_FLAG_precise_ip = 15, /* 2 bits: 15-16 */
  PE_FLAG_mmap_data = 17, PE_FLAG_sample_id_all = 18, PE_FLAG_exclude_host = 19,
  PE_FLAG_exclude_guest = 20, PE_FLAG_exclude_callchain_kernel = 21,
  PE_FLAG_exclude_callchain_user = 22, PE_FLAG_mmap2 = 23, PE_FLAG_comm_exec = 24,
  PE_FLAG_use_clockid = 25, PE_FLAG_context_switch = 26,
  PE_FLAG_write_backward = 27, PE_FLAG_namespaces = 28, PE_FLAG_ksymbol = 29,
  PE_FLAG_bpf_event = 30, PE_FLAG_aux_output = 31, PE_FLAG_cgroup = 32,
  PE_FLAG_text_poke = 33, PE_FLAG_build_id = 34, PE_FLAG_inherit_thread = 35,
  PE_FLAG_remove_on_exec = 36, PE_FLAG_sigtrap = 37
};
#define PE_FLAG_BIT(name) ((uint64_t)1 << PE_FLAG_##name)

/* ---- hardware / software / cache configs (B4, B6, B8) ------------------ */
enum {
  PE_HW_CPU_CYCLES = 0, PE_HW_INSTRUCTIONS, PE_HW_CACHE_REFERENCES,
  PE_HW_CACHE_MISSES, PE_HW_BRANCH_INSTRUCTIONS, PE_HW_BRANCH_MISSES,
  PE_HW_BUS_CYCLES, PE_HW_STALLED_CYCLES_FRONTEND,
  PE_HW_STALLED_CYCLES_BACKEND, PE_HW_REF_CPU_CYCLES, PE_HW_MAX
};
enum {
  PE_SW_CPU_CLOCK = 0, PE_SW_TASK_CLOCK, PE_SW_PAGE_FAULTS,
  PE_SW_CONTEXT_SWITCHES, PE_SW_CPU_MIGRATIONS, PE_SW_PAGE_FAULTS_MIN,
  PE_SW_PAGE_FAULTS_MAJ, PE_SW_ALIGNMENT_FAULTS, PE_SW_EMULATION_FAULTS,
  PE_SW_DUMMY, PE_SW_BPF_OUTPUT, PE_SW_CGROUP_SWITCHES, PE_SW_MAX
};
#define PE_PMU_TYPE_SHIFT 32
#define PE_HW_EVENT_MASK 0xffffffffULL

/* ---- sample_type bits (B15, B16) --------------------------------------- */
enum {
  PE_SAMPLE_IP = 1u << 0, PE_SAMPLE_TID = 1u << 1, PE_SAMPLE_TIME = 1u << 2,
  PE_SAMPLE_ADDR = 1u << 3, PE_SAMPLE_READ = 1u << 4,
  PE_SAMPLE_CALLCHAIN = 1u << 5, PE_SAMPLE_ID = 1u << 6,
  PE_SAMPLE_CPU = 1u << 7, PE_SAMPLE_PERIOD = 1u << 8,
  PE_SAMPLE_STREAM_ID = 1u << 9, PE_SAMPLE_RAW = 1u << 10,
  PE_SAMPLE_BRANCH_STACK = 1u << 11, PE_SAMPLE_REGS_USER = 1u << 12,
  PE_SAMPLE_STACK_USER = 1u << 13, PE_SAMPLE_WEIGHT = 1u << 14,
  PE_SAMPLE_DATA_SRC = 1u << 15, PE_SAMPLE_IDENTIFIER = 1u << 16,
  PE_SAMPLE_TRANSACTION = 1u << 17, PE_SAMPLE_REGS_INTR = 1u << 18,
  PE_SAMPLE_PHYS_ADDR = 1u << 19, PE_SAMPLE_AUX = 1u << 20,
  PE_SAMPLE_CGROUP = 1u << 21, PE_SAMPLE_DATA_PAGE_SIZE = 1u << 22,
  PE_SAMPLE_CODE_PAGE_SIZE = 1u << 23, PE_SAMPLE_WEIGHT_STRUCT = 1u << 24
};
#define PE_SAMPLE_MAX_BIT 25

/* ---- read_format bits (B18) -------------------------------------------- */
enum {
  PE_FORMAT_TOTAL_TIME_ENABLED = 1u << 0, PE_FORMAT_TOTAL_TIME_RUNNING = 1u << 1,
  PE_FORMAT_ID = 1u << 2, PE_FORMAT_GROUP = 1u << 3, PE_FORMAT_LOST = 1u << 4
};
#define PE_FORMAT_MAX_BIT 5

/* ---- branch_sample_type bits (B33, B33a) ------------------------------- */
#define PE_BRANCH_MAX_BIT 20
#define PE_SAMPLE_BRANCH_PLM_ALL 7u
#define PE_SAMPLE_BRANCH_HW_INDEX (1u << 17)
#define PE_SAMPLE_BRANCH_COUNTERS (1u << 19)

/* ---- open flags (A16..A19) --------------------------------------------- */
#define PE_FLAG_FD_NO_GROUP   (1ul << 0)
#define PE_FLAG_FD_OUTPUT     (1ul << 1)
#define PE_FLAG_PID_CGROUP    (1ul << 2)
#define PE_FLAG_FD_CLOEXEC    (1ul << 3)

/* ---- ioctls (G1..G13): generic _IOC encoding, same on x86 and arm64 ---- */
#define PE_IOC_ENABLE            0x2400ul
#define PE_IOC_DISABLE           0x2401ul
#define PE_IOC_REFRESH           0x2402ul
#define PE_IOC_RESET             0x2403ul
#define PE_IOC_PERIOD            0x40082404ul
#define PE_IOC_SET_OUTPUT        0x2405ul
#define PE_IOC_SET_FILTER        0x40082406ul
#define PE_IOC_ID                0x80082407ul
#define PE_IOC_SET_BPF           0x40042408ul
#define PE_IOC_PAUSE_OUTPUT      0x40042409ul
#define PE_IOC_QUERY_BPF         0xc008240aul
#define PE_IOC_MODIFY_ATTRIBUTES 0x4008240bul
#define PE_IOC_FLAG_GROUP        1ul

#define PE_PR_TASK_PERF_EVENTS_DISABLE 31
#define PE_PR_TASK_PERF_EVENTS_ENABLE  32

/* ---- breakpoints (B29, B31) -------------------------------------------- */
enum { PE_BP_EMPTY = 0, PE_BP_R = 1, PE_BP_W = 2, PE_BP_RW = 3, PE_BP_X = 4 };

/* ---- hardware cache ids, ops, results (B7) ----------------------------- */
enum {
  PE_HW_CACHE_L1D = 0, PE_HW_CACHE_L1I, PE_HW_CACHE_LL, PE_HW_CACHE_DTLB,
  PE_HW_CACHE_ITLB, PE_HW_CACHE_BPU, PE_HW_CACHE_NODE, PE_HW_CACHE_MAX
};
enum { PE_HW_CACHE_OP_READ = 0, PE_HW_CACHE_OP_WRITE, PE_HW_CACHE_OP_PREFETCH };
enum { PE_HW_CACHE_RESULT_ACCESS = 0, PE_HW_CACHE_RESULT_MISS };
#define PE_HW_CACHE_OP_SHIFT 8       /* config = id | op << 8 | result << 16 */
#define PE_HW_CACHE_RESULT_SHIFT 16

/* ---- the mmap'ed user page (D6..D8) ------------------------------------ */
struct pe_mmap_page {
  uint32_t version;              /* 0 */
  uint32_t compat_version;       /* 4 */
  uint32_t lock;                 /* 8 */
  uint32_t index;                /* 12 */
  int64_t  offset;               /* 16 */
  uint64_t time_enabled;         /* 24 */
  uint64_t time_running;         /* 32 */
  uint64_t capabilities;         /* 40 */
  uint16_t pmc_width;            /* 48 */
  uint16_t time_shift;           /* 50 */
  uint32_t time_mult;            /* 52 */
  uint64_t time_offset;          /* 56 */
  uint64_t time_zero;            /* 64 */
  uint32_t size;                 /* 72 */
  uint32_t reserved_1;           /* 76 */
  uint64_t time_cycles;          /* 80 */
  uint64_t time_mask;            /* 88 */
  uint8_t  reserved[928];        /* 96 */
  uint64_t data_head;            /* 1024 */
  uint64_t data_tail;            /* 1032 */
  uint64_t data_offset;          /* 1040 */
  uint64_t data_size;            /* 1048 */
  uint64_t aux_head;             /* 1056 */
  uint64_t aux_tail;             /* 1064 */
  uint64_t aux_offset;           /* 1072 */
  uint64_t aux_size;             /* 1080 */
};
_Static_assert(offsetof(struct pe_mmap_page, data_head) == 1024, "data_head");
_Static_assert(offsetof(struct pe_mmap_page, aux_size) == 1080, "aux_size");

#define PE_CAP_BIT0               (1ull << 0)
#define PE_CAP_BIT0_IS_DEPRECATED (1ull << 1)
#define PE_CAP_USER_RDPMC         (1ull << 2)
#define PE_CAP_USER_TIME          (1ull << 3)
#define PE_CAP_USER_TIME_ZERO     (1ull << 4)
#define PE_CAP_USER_TIME_SHORT    (1ull << 5)

/* ---- records (E1..E19f) ------------------------------------------------ */
struct pe_event_header {
  uint32_t type;
  uint16_t misc;
  uint16_t size;
};

enum {
  PE_RECORD_MMAP = 1, PE_RECORD_LOST = 2, PE_RECORD_COMM = 3,
  PE_RECORD_EXIT = 4, PE_RECORD_THROTTLE = 5, PE_RECORD_UNTHROTTLE = 6,
  PE_RECORD_FORK = 7, PE_RECORD_READ = 8, PE_RECORD_SAMPLE = 9,
  PE_RECORD_MMAP2 = 10, PE_RECORD_AUX = 11, PE_RECORD_ITRACE_START = 12,
  PE_RECORD_LOST_SAMPLES = 13, PE_RECORD_SWITCH = 14,
  PE_RECORD_SWITCH_CPU_WIDE = 15, PE_RECORD_NAMESPACES = 16,
  PE_RECORD_KSYMBOL = 17, PE_RECORD_BPF_EVENT = 18, PE_RECORD_CGROUP = 19,
  PE_RECORD_TEXT_POKE = 20, PE_RECORD_AUX_OUTPUT_HW_ID = 21,
  PE_RECORD_CALLCHAIN_DEFERRED = 22, PE_RECORD_MAX
};

#define PE_RECORD_MISC_CPUMODE_MASK     7u
#define PE_RECORD_MISC_KERNEL           1u
#define PE_RECORD_MISC_USER             2u
#define PE_RECORD_MISC_HYPERVISOR       3u
#define PE_RECORD_MISC_GUEST_KERNEL     4u
#define PE_RECORD_MISC_GUEST_USER       5u
#define PE_RECORD_MISC_MMAP_DATA        (1u << 13)
#define PE_RECORD_MISC_COMM_EXEC        (1u << 13)
#define PE_RECORD_MISC_SWITCH_OUT       (1u << 13)
#define PE_RECORD_MISC_EXACT_IP         (1u << 14)
#define PE_RECORD_MISC_SWITCH_OUT_PREEMPT (1u << 14)
#define PE_RECORD_MISC_MMAP_BUILD_ID    (1u << 14)

/* callchain context markers (E26) */
#define PE_CONTEXT_HV           ((uint64_t)-32)
#define PE_CONTEXT_KERNEL       ((uint64_t)-128)
#define PE_CONTEXT_USER         ((uint64_t)-512)
#define PE_CONTEXT_GUEST        ((uint64_t)-2048)
#define PE_CONTEXT_GUEST_KERNEL ((uint64_t)-2176)
#define PE_CONTEXT_GUEST_USER   ((uint64_t)-2560)
#define PE_CONTEXT_MAX          ((uint64_t)-4095)

/* regs abi (E30) */
enum { PE_SAMPLE_REGS_ABI_NONE = 0, PE_SAMPLE_REGS_ABI_32 = 1, PE_SAMPLE_REGS_ABI_64 = 2 };

/* ---- the ABI tables (abi.c): the one copy of every name <-> number ------
 * The encoder (attr.c), the decoder (records.c), the error messages
 * (errors.c) and core.abi (the Lua view) all read these. */
typedef struct { const char *name; uint64_t bit; } pe_bitname;
extern const pe_bitname pe_sample_bits[];   /* sample_type, NULL-ended */
extern const pe_bitname pe_read_bits[];     /* read_format */
extern const pe_bitname pe_branch_bits[];   /* branch_sample_type */

/* attr fields: how each is stored (kind), where, and how perf prints it */
enum pe_field_kind {
  PE_K_U64, PE_K_U32, PE_K_U16, PE_K_FLAG, PE_K_PRECISE, PE_K_BITS, PE_K_TYPE,
  PE_K_BPTYPE, PE_K_CLOCKID, PE_K_STRPTR, PE_K_AUXBIT
};
typedef struct {
  const char *name;
  enum pe_field_kind kind;
  unsigned off;        /* byte offset in struct pe_attr */
  unsigned size;       /* bytes the field's storage takes */
  int bit;             /* flag bit / aux_action bit */
  int group;           /* union group: fields in one group are exclusive */
  const char *perf;    /* perf -vv label; NULL: perf does not print it */
  unsigned char hex;   /* perf prints it in hex */
  unsigned char modify; /* PERF_EVENT_IOC_MODIFY_ATTRIBUTES may change it */
} pe_fielddesc;
extern const pe_fielddesc pe_attr_fields[];  /* perf's print order, NULL-ended */
const pe_fielddesc *pe_attr_field(const char *name);

typedef struct { const char *name; uint32_t value; } pe_named;
extern const pe_named pe_type_names[];       /* PERF_TYPE_* */

const char *pe_errno_name(int err);          /* "EINVAL"; "E?" when unknown */
const char *pe_context_name(uint64_t ip);    /* PERF_CONTEXT_* as the decoder names it */

struct lua_State;
/* core.abi: the tables above as Lua tables (abi.c) */
void pe_open_abi(struct lua_State *L);

#endif /* PE_ABI_H */
