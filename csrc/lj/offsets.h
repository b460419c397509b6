/*
 * lj/offsets.h - LuaJIT 2.1's struct offsets and constants (GC64, x86-64),
 * with no include of its own: lj/layout.h (the C readers, in this process
 * or another) and the BPF program that reads a process at its samples
 * (bpf/ljstack.bpf.c) take them from here, so that LuaJIT's layout is
 * written once.  lj/layout.h says what each one is.
 */
#ifndef PE_LJ_OFFSETS_H
#define PE_LJ_OFFSETS_H

#define LJ_L_G 16
#define LJ_L_BASE 32
#define LJ_L_STACK 56
#define LJ_L_CFRAME 80
#define LJ_L_SIZE 88                 /* lua_State.stacksize (slots) */
#define LJ_GCMASK ((1ULL << 47) - 1)
#define LJ_FN_GCT 9
#define LJ_FN_FFID 10
#define LJ_FNL_PC 32
#define LJ_FNC_F 40
#define LJ_FNC_UV0 48
#define LJ_GCT_FUNC 8
#define LJ_GCT_THREAD 6
#define LJ_GCT_TRACE 9
#define LJ_ITYPE_FUNC 0x1fff7u       /* (~LJ_TFUNC) & 0x1ffff */
#define LJ_VMST_INTERP (~0)
#define LJ_VMST_C (~1)
#define LJ_VMST_GC (~2)
#define LJ_T_NSNAP 10
#define LJ_T_SNAP 48
#define LJ_T_SNAPMAP 56
#define LJ_T_SZMCODE 84
#define LJ_T_MCODE 88
#define LJ_SNAP_SIZE 12
#define LJ_SNAP_REF 4
#define LJ_SNAP_MCOFS 6
#define LJ_SNAP_NENT 10
#define LJ_PT_SIZE 104
#define LJ_PT_SIZEBC 12
#define LJ_PT_FIRSTLINE 72
#define LJ_PT_NUMLINE 76
#define LJ_PT_LINEINFO 80
#define LJ_RET_WORDS 64    /* stack words searched for a trace's return address */
/* what a reader of another process needs besides (lj/remote.c) */
#define LJ_GG_G 112                  /* GG_State: the main lua_State at 0, G after it */
#define LJ_L_ENV 72                  /* lua_State.env: its globals table */
#define LJ_CF_L 16                   /* a C frame (L->cframe & ~3): its L, its saved PC */
#define LJ_CF_PC 24
#define LJ_T_STARTPT 64              /* GCtrace.startpt, .traceno */
#define LJ_T_TRACENO 104
#define LJ_PT_CHUNKNAME 64
#define LJ_GCT_STR 4
#define LJ_GCT_PROTO 7
#define LJ_GCT_TAB 11
#define LJ_STR_DATA 24               /* a GCstr's bytes follow it, NUL-terminated */
#define LJ_ITYPE_STR 0x1fffbu
#define LJ_ITYPE_TAB 0x1fff4u
#define LJ_TAB_NODE 40               /* GCtab.node, .hmask; Node: val +0, key +8, 24 bytes */
#define LJ_TAB_HMASK 52
#define LJ_NODE_SIZE 24
#define LJ_NODE_KEY 8
#define LJ_FRAME_CONT 2              /* a frame link's type (low 3 bits) */
#define LJ_FRAME_VARG 3
#define LJ_CURL_MAINTH 176           /* &G->cur_L - &G->mainthref: tmpbuf, tmptv(2), nilnode,
                                        registrytv, uvhead, hookcount(2), hookf, wrapf, panic,
                                        bc_cfunc_int/ext between (2.1, GC64) */
#define LJ_MINSTACK 20               /* LUA_MINSTACK: global_State.bc_cfunc_int's A */

#endif /* PE_LJ_OFFSETS_H */
