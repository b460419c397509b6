/*
 * cdrain.c - the C baseline of bench/records: the same drain protocol as
 * csrc/ring.c (acquire load of data_head, records straddling the end copied
 * contiguous, release store of data_tail) and a parse of the fields the Lua
 * loop reads (ip, pid, tid, time, cpu, period) for sample_type
 * IP|TID|TIME|CPU|PERIOD.  Loaded through the LuaJIT FFI by bench.lua with
 * the address of the event's mmap'ed user page.
 */
#include <stdint.h>
#include <string.h>

struct hdr { uint32_t type; uint16_t misc, size; };

struct sample {             /* IP|TID|TIME|CPU|PERIOD after the header */
  uint64_t ip;
  uint32_t pid, tid;
  uint64_t time;
  uint32_t cpu, res;
  uint64_t period;
};

/* drains the ring at `page`; returns the records seen, *sum a checksum of
 * the parsed fields so the work cannot be optimised away */
uint64_t cdrain(void *page, uint64_t *sum)
{
  unsigned char *pg = (unsigned char *)page;
  uint64_t *head_p = (uint64_t *)(pg + 1024), *tail_p = (uint64_t *)(pg + 1032);
  uint64_t off = *(uint64_t *)(pg + 1040), size = *(uint64_t *)(pg + 1048);
  unsigned char *base = pg + off, buf[65536];
  uint64_t head = __atomic_load_n(head_p, __ATOMIC_ACQUIRE);
  uint64_t tail = *tail_p, n = 0, s = 0;
  while (tail < head) {
    struct hdr h;
    const unsigned char *rec;
    size_t o = (size_t)(tail & (size - 1));
    memcpy(&h, base + o, sizeof h);
    if (h.size < 8 || h.size > head - tail) break;
    if (o + h.size <= size) {
      rec = base + o;
    } else {
      size_t first = (size_t)(size - o);
      memcpy(buf, base + o, first);
      memcpy(buf + first, base, h.size - first);
      rec = buf;
    }
    if (h.type == 9 && h.size >= 8 + sizeof(struct sample)) {
      struct sample sm;
      memcpy(&sm, rec + 8, sizeof sm);
      s += sm.ip + sm.pid + sm.tid + sm.time + sm.cpu + sm.period;
    }
    tail += h.size;
    n++;
  }
  __atomic_store_n(tail_p, tail, __ATOMIC_RELEASE);
  *sum = s;
  return n;
}
