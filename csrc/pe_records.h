/*
 * pe_records.h - the record decoder (records.c) and the ring (ring.c).
 *
 * The decoder is pure: it reads one record from (pointer, length) with the
 * layout described by a pe_decode_cfg and never looks past length.  The
 * ring code hands it contiguous records; core.decode_record hands it Lua
 * strings (synthetic buffers, fuzzing).
 */
#ifndef PE_RECORDS_H
#define PE_RECORDS_H

#include "pe_core.h"

typedef struct pe_decode_cfg {
  uint64_t sample_type;
  uint64_t read_format;
  uint64_t branch_sample_type;
  uint64_t regs_user;          /* sample_regs_user mask */
  uint64_t regs_intr;          /* sample_regs_intr mask */
  int sample_id_all;
} pe_decode_cfg;

/* The decode description of an event's attr. */
void pe_decode_cfg_from_attr(pe_decode_cfg *c, const struct pe_attr *a);

/* The decode description from a table's sample_type, read_format,
 * branch_sample_type (numbers, name tables or "a|b" strings),
 * sample_regs_user, sample_regs_intr and sample_id_all (boolean) fields;
 * absent fields are 0.  t must be an absolute index. */
void pe_decode_cfg_from_table(lua_State *L, int t, pe_decode_cfg *c);

/* Bytes of the sample_id trailer non-SAMPLE records carry (E4). */
size_t pe_sample_id_size(uint64_t sample_type);

/* Decodes rec[0..len) (len must be the header's size) and pushes the record
 * table: returns 1.  On a malformed record pushes an error message instead
 * and returns 0.  Never reads outside rec[0..len). */
int pe_decode_record(lua_State *L, const unsigned char *rec, size_t len,
                     const pe_decode_cfg *cfg);

/* The lower-case name of a record type, or NULL when unknown. */
const char *pe_record_type_name(uint32_t type);

/* core.decode_record(bytes, opts) */
int pe_l_decode_record(lua_State *L);

/* ring.c: next record of ev's ring (see ring.c), for the LuaJIT fast path */
int pe_ring_next(pe_event *ev, const unsigned char **rec);
int pe_ring_ready(lua_State *L, pe_event *ev);   /* ring.c: the state pe_ring_next needs */

#endif /* PE_RECORDS_H */
