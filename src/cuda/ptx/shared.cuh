#pragma once
// Shared-memory loads and stores through 32-bit shared addresses (PTX ISA §9.7.9.9 ld and
// §9.7.9.10 st, state space .shared). Used where a pointer would be generic: a buffer found at run time loses its
// address space, and ptxas then builds 64-bit generic addresses for every access.
#include <cstdint>

#include "address.cuh"

namespace nmkit::ptx {

// The memory clobbers keep these ordered against the mbarrier operations around them.
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t address) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(address) : "memory");
  return v;
}

__device__ __forceinline__ uint2 ld_shared_v2_b32(uint32_t address) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(address) : "memory");
  return v;
}

__device__ __forceinline__ uint4 ld_shared_v4_b32(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

__device__ __forceinline__ void st_shared_b16(uint32_t address, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" : : "r"(address), "h"(v) : "memory");
}

}  // namespace nmkit::ptx
