#pragma once
// mma.sync m16n8k16 with fp16/bf16 inputs and fp32 accumulators (PTX ISA §9.7.14.5.8, "Matrix Fragments for
// mma.m16n8k16 with floating point type"). sm_80 and later.
//
// Fragments (per lane; g = lane / 4, t = lane % 4):
//   a[4]  : A 16 x 16: a0 (row g, cols 2t, 2t+1), a1 (row g+8), a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8..)
//   b[2]  : B 16 (k) x 8 (n): b0 holds k = 2t, 2t+1 at column n = g; b1 holds k = 2t+8, 2t+9
//   c/d[4]: fp32, d0,d1 (row g, cols 2t, 2t+1), d2,d3 (row g+8)
#include <cstdint>
#include <type_traits>

#include "mma_sp.cuh"  // the element tags MmaF16, MmaBF16

namespace nmkit::ptx {

template <class Element>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<Element, MmaF16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

}  // namespace nmkit::ptx
