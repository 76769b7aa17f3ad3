#pragma once
// ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16 (PTX ISA §9.7.14.5.15, "Warp-level matrix load: ldmatrix").
// Lanes 8i..8i+7 give the row addresses of matrix i; register i receives matrix i, lane l holding
// row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 (transposed with .trans). With .x2 lanes 0..15 give the
// addresses (the others' are ignored).
#include <cstdint>

#include "address.cuh"

namespace nmkit::ptx {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address));
}

}  // namespace nmkit::ptx
