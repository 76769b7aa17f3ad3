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

}  // namespace nmkit::ptx
