#pragma once
// A 16-byte global store (PTX ISA §9.7.9.10 st, state space .global, vector .v4). Written out because NVVM splits
// `*reinterpret_cast<uint4*>(p) = v` into four 4-byte stores where it cannot prove p 16-byte aligned (a row or
// column offset by a runtime leading dimension), and four narrow stores cost four times the store wavefronts.
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ void st_global_v4_b32(void* address, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

}  // namespace nmkit::ptx
