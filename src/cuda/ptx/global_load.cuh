#pragma once
// 16-byte loads from global memory through the non-coherent (read-only) path, with the L1 eviction priority
// that says whether a line is worth keeping (PTX ISA §9.7.9.8, "Data Movement: ld", .level::eviction_priority).
// The data must not be written while the kernel runs. sm_70 and later.
#include <cstdint>

namespace nmkit::ptx {

// For data read once (a weight streamed through the SMs): not allocated in L1, so that it evicts nothing there.
__device__ __forceinline__ uint4 ld_global_nc_stream_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// For data other warps of the SM may read again (activations).
__device__ __forceinline__ uint4 ld_global_nc_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// An 8-byte load issued exactly where it stands (volatile): for a value needed long after it can be asked for, so
// that the compiler neither sinks the load to its use nor waits for it early (its answer is waited for at first use).
__device__ __forceinline__ int2 ld_global_nc_early_v2(const void* p) {
  int2 v;
  asm volatile("ld.global.nc.v2.s32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

}  // namespace nmkit::ptx
