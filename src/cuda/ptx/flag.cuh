#pragma once
// Counters and flags between the CTAs of one grid, at GPU scope: an atomic add with acquire-release semantics, a
// relaxed store and load, and a release store / acquire load (PTX ISA §9.7.13.5 "atom", §9.7.9.8 "ld" and §9.7.9.10
// "st", their .acq_rel / .acquire / .release / .relaxed qualifiers with .gpu scope; their meaning in §8, "Memory
// Consistency Model"). A release publishes everything its thread wrote before it, and, through a CTA barrier before
// it, what the barrier's other threads wrote; an acquire that reads a released value (or, for an atomic, any later
// value of the same counter) orders its thread's later reads, and through a barrier after it its CTA's, after
// those writes. sm_70 and later.
namespace nmkit::ptx {

__device__ __forceinline__ void st_release_gpu(int* flag, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
}

__device__ __forceinline__ void st_relaxed_gpu(int* flag, int value) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
}

// Returns the value before the add.
__device__ __forceinline__ int atom_add_acq_rel_gpu(int* counter, int value) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(value) : "memory");
  return old;
}

__device__ __forceinline__ int ld_acquire_gpu(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

}  // namespace nmkit::ptx
