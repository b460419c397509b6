/*
 * perfdata.c - the C helpers of perf_event.perfdata (the perf.data writer
 * behind `luaperf record -o file.data`), in core._private:
 *
 *   pd_next(ev)            -> the next record of ev's ring as the kernel
 *                             wrote it (a string of header.size bytes), or
 *                             nil at the end of the pass; decode_current(ev)
 *                             then decodes that same record
 *   pd_pack(size, v, ...)  -> the values as little-endian integers of size
 *                             1, 2, 4 or 8 bytes each (64-bit values as
 *                             pe_to_u64 takes them), concatenated
 *   pd_attr(ev)            -> the attr ev was opened with, as bytes: cut
 *                             to the smallest published size (VER0..VER8)
 *                             holding every nonzero byte, attr.size set to
 *                             it, so a perf built against an older header
 *                             reads it (perf 6.1 refuses a larger size)
 *   pd_synth(pid, sample_type, sample_id_all [, data])
 *                          -> the records perf record synthesizes for a
 *                             running process: a COMM per thread of
 *                             /proc/PID/task and an MMAP2 per executable
 *                             mapping of /proc/PID/maps (data: every file
 *                             mapping, the others with misc MMAP_DATA, as
 *                             perf does for an attr with mmap_data) (a list of strings;
 *                             sample_id trailers zero but for pid/tid)
 *   pd_build_id(path)      -> the GNU build-id note of an ELF file (or of
 *                             a notes file such as /sys/kernel/notes) as
 *                             raw bytes, or nil when it has none
 *
 * perf.data itself (layout, feature sections) is written in Lua.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/sysmacros.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pe_core.h"
#include "pe_records.h"

static int l_pd_next(lua_State *L)
{
  pe_event *ev = pe_check_event(L, 1);
  const unsigned char *p;
  int n;
  if (!ev->scratch) return luaL_error(L, "pd_next(%s): the event has no ring", pe_event_name(L, 1));
  n = pe_ring_next(ev, &p);
  if (n == 0) return 0;
  if (n == -1) {
    lua_getfield(L, lua_upvalueindex(1), "ring_error");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    return luaL_error(L, "records(%s): %s", pe_event_name(L, 1), lua_tostring(L, -1));
  }
  if (n < 0) return luaL_error(L, "records(%s): no ring", pe_event_name(L, 1));
  lua_pushlstring(L, (const char *)p, (size_t)n);
  return 1;
}

static int l_pd_attr(lua_State *L)
{
  static const size_t sizes[] = {
    PE_ATTR_SIZE_VER0, PE_ATTR_SIZE_VER1, PE_ATTR_SIZE_VER2, PE_ATTR_SIZE_VER3,
    PE_ATTR_SIZE_VER4, PE_ATTR_SIZE_VER5, PE_ATTR_SIZE_VER6, PE_ATTR_SIZE_VER7,
    PE_ATTR_SIZE_VER8
  };
  pe_event *ev = pe_check_event(L, 1);
  struct pe_attr a = ev->attr;
  const unsigned char *b = (const unsigned char *)&a;
  size_t used = sizeof a, i, size = sizeof a;
  while (used > 0 && b[used - 1] == 0) used--;
  for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    if (sizes[i] >= used) { size = sizes[i]; break; }
  }
  a.size = (uint32_t)size;
  lua_pushlstring(L, (const char *)&a, size);
  return 1;
}

static int l_pd_pack(lua_State *L)
{
  int size = pe_check_int(L, 1, "pd_pack size", 1, 8);
  int top = lua_gettop(L), i, k;
  luaL_Buffer b;
  if (size != 1 && size != 2 && size != 4 && size != 8)
    return luaL_argerror(L, 1, "size must be 1, 2, 4 or 8");
  luaL_buffinit(L, &b);
  for (i = 2; i <= top; i++) {
    uint64_t v;
    char out[8];
    if (lua_type(L, i) == LUA_TNUMBER && lua_tonumber(L, i) < 0) {
      v = (uint64_t)(int64_t)lua_tonumber(L, i);       /* -1 as a pid */
    } else {
      v = pe_check_u64(L, i);
    }
    for (k = 0; k < size; k++) out[k] = (char)((v >> (8 * k)) & 0xff);
    luaL_addlstring(&b, out, (size_t)size);
  }
  luaL_pushresult(&b);
  return 1;
}

/* appends the sample_id trailer (zeros but for pid/tid) to b */
static void add_trailer(luaL_Buffer *b, uint64_t st, int sid_all, uint32_t pid, uint32_t tid)
{
  static const uint64_t zero_after[] = { PE_SAMPLE_TIME, PE_SAMPLE_ID, PE_SAMPLE_STREAM_ID,
                                         PE_SAMPLE_CPU, PE_SAMPLE_IDENTIFIER };
  uint64_t z = 0;
  size_t i;
  if (!sid_all) return;
  if (st & PE_SAMPLE_TID) {
    luaL_addlstring(b, (const char *)&pid, 4);
    luaL_addlstring(b, (const char *)&tid, 4);
  }
  for (i = 0; i < sizeof zero_after / sizeof zero_after[0]; i++)
    if (st & zero_after[i]) luaL_addlstring(b, (const char *)&z, 8);
}

/* pushes one record: header, the fixed body, a NUL-padded string (to 8) */
static void push_rec(lua_State *L, uint32_t type, uint16_t misc, const void *body, size_t blen,
                     const char *str, uint64_t st, int sid_all, uint32_t pid, uint32_t tid)
{
  luaL_Buffer b;
  struct pe_event_header h;
  size_t slen = strlen(str) + 1, pad = (8 - slen % 8) % 8;
  static const char zeros[8];
  h.type = type;
  h.misc = misc;
  h.size = (uint16_t)(sizeof h + blen + slen + pad + (sid_all ? pe_sample_id_size(st) : 0));
  luaL_buffinit(L, &b);
  luaL_addlstring(&b, (const char *)&h, sizeof h);
  luaL_addlstring(&b, (const char *)body, blen);
  luaL_addlstring(&b, str, slen);
  luaL_addlstring(&b, zeros, pad);
  add_trailer(&b, st, sid_all, pid, tid);
  luaL_pushresult(&b);
}

static int l_pd_synth(lua_State *L)
{
  int pid = pe_check_int(L, 1, "pd_synth pid", 1, 0x7fffffff);
  uint64_t st = pe_check_u64(L, 2);
  int sid_all = lua_toboolean(L, 3);
  int data = lua_toboolean(L, 4);
  char path[64], line[4352];
  DIR *d;
  FILE *f;
  struct dirent *de;
  int n = 0;
  lua_newtable(L);
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  d = opendir(path);
  if (!d) return 1;
  while ((de = readdir(d)) != NULL) {
    int tid = atoi(de->d_name);
    char comm[32] = "";
    uint32_t body[2];
    if (tid <= 0) continue;
    snprintf(path, sizeof path, "/proc/%d/task/%d/comm", pid, tid);
    f = fopen(path, "re");
    if (!f) continue;
    if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
    fclose(f);
    body[0] = (uint32_t)pid;
    body[1] = (uint32_t)tid;
    push_rec(L, PE_RECORD_COMM, 0, body, sizeof body, comm, st, sid_all, body[0], body[1]);
    lua_rawseti(L, -2, ++n);
  }
  closedir(d);
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  f = fopen(path, "re");
  if (!f) return 1;
  while (fgets(line, sizeof line, f)) {
    unsigned long long start, end, pgoff, ino;
    unsigned maj, min;
    char perms[8];
    int name_at = 0;
    struct {
      uint32_t pid, tid;
      uint64_t addr, len, pgoff;
      uint32_t maj, min;
      uint64_t ino, ino_gen;
      uint32_t prot, flags;
    } m;
    line[strcspn(line, "\n")] = 0;
    if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &pgoff, &maj, &min,
               &ino, &name_at) < 7 || name_at == 0)
      continue;
    if (perms[2] == 'x') {
      if (line[name_at] != '/' && line[name_at] != '[') continue;
    } else if (!data || line[name_at] != '/') {
      continue;
    }
    memset(&m, 0, sizeof m);
    m.pid = m.tid = (uint32_t)pid;
    m.addr = start;
    m.len = end - start;
    m.pgoff = pgoff;
    m.maj = maj;
    m.min = min;
    m.ino = ino;
    m.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
             (perms[2] == 'x' ? PROT_EXEC : 0);
    m.flags = perms[3] == 's' ? MAP_SHARED : MAP_PRIVATE;
    push_rec(L, PE_RECORD_MMAP2, PE_RECORD_MISC_USER | (perms[2] == 'x' ? 0 : PE_RECORD_MISC_MMAP_DATA),
             &m, sizeof m, line + name_at, st, sid_all, m.pid, m.tid);
    lua_rawseti(L, -2, ++n);
  }
  fclose(f);
  return 1;
}

/* the build-id in the notes [p, p+len) of an ELF file; 0 if none */
static size_t note_build_id(const unsigned char *p, size_t len, unsigned char *out)
{
  size_t off = 0;
  while (off + sizeof(Elf64_Nhdr) <= len) {
    Elf64_Nhdr nh;
    size_t name_sz, desc_sz;
    memcpy(&nh, p + off, sizeof nh);
    name_sz = (nh.n_namesz + 3u) & ~3u;
    desc_sz = (nh.n_descsz + 3u) & ~3u;
    off += sizeof nh;
    if (off + name_sz + desc_sz > len) break;
    if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && memcmp(p + off, "GNU", 4) == 0 &&
        nh.n_descsz > 0 && nh.n_descsz <= 20) {
      memcpy(out, p + off + name_sz, nh.n_descsz);
      return nh.n_descsz;
    }
    off += name_sz + desc_sz;
  }
  return 0;
}

static int l_pd_build_id(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  Elf64_Ehdr eh;
  unsigned char id[20];
  size_t idlen = 0;
  int i;
  if (fd < 0) return 0;
  if (strncmp(path, "/sys/", 5) == 0) {  /* a bare notes file */
    unsigned char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    idlen = n > 0 ? note_build_id(buf, (size_t)n, id) : 0;
    if (idlen == 0) return 0;
    lua_pushlstring(L, (const char *)id, idlen);
    return 1;
  }
  if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 256) {
    close(fd);
    return 0;
  }
  for (i = 0; i < eh.e_phnum && idlen == 0; i++) {
    Elf64_Phdr ph;
    unsigned char buf[1024];
    if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) != (ssize_t)sizeof ph)
      break;
    if (ph.p_type != PT_NOTE || ph.p_filesz == 0 || ph.p_filesz > sizeof buf) continue;
    if (pread(fd, buf, ph.p_filesz, (off_t)ph.p_offset) != (ssize_t)ph.p_filesz) continue;
    idlen = note_build_id(buf, ph.p_filesz, id);
  }
  close(fd);
  if (idlen == 0) return 0;
  lua_pushlstring(L, (const char *)id, idlen);
  return 1;
}

void pe_open_perfdata(lua_State *L)
{
  int mod = lua_gettop(L);
  pe_push_private(L, mod);
  lua_pushvalue(L, -1);                  /* pd_next finds ring_error there */
  lua_pushcclosure(L, l_pd_next, 1);
  lua_setfield(L, -2, "pd_next");
  lua_pushcfunction(L, l_pd_pack);
  lua_setfield(L, -2, "pd_pack");
  lua_pushcfunction(L, l_pd_attr);
  lua_setfield(L, -2, "pd_attr");
  lua_pushcfunction(L, l_pd_synth);
  lua_setfield(L, -2, "pd_synth");
  lua_pushcfunction(L, l_pd_build_id);
  lua_setfield(L, -2, "pd_build_id");
  lua_pop(L, 1);
}
