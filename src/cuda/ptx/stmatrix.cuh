#pragma once
// stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA §9.7.14.5.16, "Warp-level matrix store: stmatrix";
// sm_90). The mirror of ldmatrix: register i holds matrix i in the mma fragment layout (lane l: row l / 4,
// elements 2 (l % 4) and 2 (l % 4) + 1), and lanes 8i..8i+7 give the shared addresses of its 8 rows of 16 bytes
// (of its columns with .trans).
#include <cstdint>

namespace nmkit::ptx {

// The memory clobbers keep these ordered against the fences and barrier arrivals that publish them.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_address, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

__device__ __forceinline__ void stmatrix_x4_trans(uint32_t smem_address, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

}  // namespace nmkit::ptx
