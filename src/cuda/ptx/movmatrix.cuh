#pragma once
// movmatrix.sync.aligned.m8n8.trans.b16 (PTX ISA, "Warp-level matrix transpose: movmatrix"; sm_75): transposes an
// 8 x 8 matrix of 16-bit elements held in the mma fragment layout (lane l: row l / 4, elements 2 (l % 4), +1),
// in registers, the result in the same layout.
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t fragment) {
  uint32_t transposed;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(transposed) : "r"(fragment));
  return transposed;
}

}  // namespace nmkit::ptx
