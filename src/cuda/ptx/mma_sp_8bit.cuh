#pragma once
// mma.sp::ordered_metadata m16n8k64 on int8 codes (PTX ISA §9.7.14.6, "Multiply-and-Accumulate Instruction:
// mma.sp"), int32 accumulators, exact (no .satfinite: the 8-bit plan bounds K so that no sum can overflow). sm_80 and
// later. (Its .e4m3 / .e5m2 forms are sm_89's; Hopper runs them as a software emulation, so the skinny kernel widens
// fp8 codes to f16 itself.)
//
// Fragments (per lane; g = lane / 4, t = lane % 4):
//   a[4]  : compressed A, 16 x 32 bytes: register u + 2h holds stored bytes 16h + 4t .. +3 of row 8u + g
//           (nm24_layout_8bit.hpp packs a weight so that each register is one 128-byte core matrix).
//   b[4]  : B, 64 (k) x 8 (n) codes: b_i holds k = 16i + 4t .. +3 of column g (one ldmatrix.x4 row per 16 k).
//   e     : metadata, every lane (selector 0): row g + 8 (t % 2), logical k 32 (t / 2) .. +31, a nibble per group.
//   c/d[4]: d0,d1 (row g, cols 2t, 2t+1), d2,d3 (row g+8).
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ void mma_sp_m16n8k64_s8(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[4],
                                                   uint32_t e) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k64.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
#endif
}

}  // namespace nmkit::ptx
