/*
 * petarget.c - a small shared library whose functions the specs probe:
 * uprobes count calls of pet_work exactly, execute breakpoints trap on it,
 * data breakpoints watch pet_cell, and pet_spin burns CPU inside a known
 * function for sampling/callchain tests.
 */
#include <stdint.h>

volatile uint64_t pet_cell[4] __attribute__((aligned(64)));
volatile uint64_t pet_sink;

__attribute__((noinline)) uint64_t pet_work(uint64_t x)
{
  pet_sink += x;
  return pet_sink;
}

/* calls pet_work n times */
__attribute__((noinline)) uint64_t pet_call(uint64_t n)
{
  uint64_t i, s = 0;
  for (i = 0; i < n; i++) s += pet_work(i);
  return s;
}

/* n writes then n reads of pet_cell[0] */
__attribute__((noinline)) uint64_t pet_touch(uint64_t writes, uint64_t reads)
{
  uint64_t i, s = 0;
  for (i = 0; i < writes; i++) pet_cell[0] = i;
  for (i = 0; i < reads; i++) s += pet_cell[0];
  return s;
}

__attribute__((noinline)) uint64_t pet_spin_inner(uint64_t iters)
{
  uint64_t i, x = 1;
  for (i = 0; i < iters; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return x;
}

/* burns CPU in pet_spin_inner, called from pet_spin */
__attribute__((noinline)) uint64_t pet_spin(uint64_t iters)
{
  return pet_spin_inner(iters) + 1;
}

/* address helpers for the specs (no FFI needed on PUC Lua) */
uintptr_t pet_addr_work(void) { return (uintptr_t)&pet_work; }
uintptr_t pet_addr_cell(void) { return (uintptr_t)&pet_cell[0]; }
