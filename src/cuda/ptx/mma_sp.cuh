#pragma once
// mma.sp::ordered_metadata m16n8k32 with fp16/bf16 inputs and fp32 accumulators
// (PTX ISA §9.7.14.6, "Multiply-and-Accumulate Instruction: mma.sp"). sm_80 and later.
//
// Fragments (per lane; g = lane / 4, t = lane % 4):
//   a[4]  : compressed A, 16 x 16 halves: a0 (row g, cols 2t..2t+1), a1 (row g+8), a2 (row g, cols 2t+8..),
//           a3 (row g+8, cols 2t+8..); compressed column j is slot j % 2 of logical group j / 2.
//   b[4]  : B, 32 (k) x 8 (n): b_i holds k = 2t + 8i, 2t + 8i + 1 at column n = g.
//   e     : metadata; lanes with t in {0, 1} (selector 0) supply it: bits [0,16) row g, bits [16,32) row g+8,
//           each covering logical k [16 * (t % 2), +16), one nibble per group of 4, lower index in the low 2 bits.
//   c/d[4]: fp32, d0,d1 (row g, cols 2t, 2t+1), d2,d3 (row g+8).
#include <cstdint>
#include <type_traits>

namespace nmkit::ptx {

struct MmaF16 {};
struct MmaBF16 {};

template <class Element>
__device__ __forceinline__ void mma_sp_m16n8k32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[4],
                                                uint32_t e) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<Element, MmaF16>) {
    asm volatile(
        "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
  } else {
    asm volatile(
        "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
  }
#endif
}

}  // namespace nmkit::ptx
