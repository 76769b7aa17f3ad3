#pragma once
// Warpgroup MMA plumbing (PTX ISA §9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"), sm_90a:
// the shared-memory matrix descriptor (§9.7.15.5.1) and the fence / commit / wait instructions.
#include <cstdint>

#include "address.cuh"

namespace nmkit::ptx {

// Swizzle modes of the descriptor's bits [62, 64).
enum class SmemSwizzle : uint64_t { none = 0, bytes128 = 1, bytes64 = 2, bytes32 = 3 };

// A descriptor from its fields: start address, leading and stride byte offsets (16-byte units, 14 bits each) and
// swizzle mode; what the offsets mean depends on the operand's major-ness and swizzle (§9.7.15.5.1.2).
__device__ __forceinline__ uint64_t make_smem_desc(uint32_t smem_address, uint32_t leading_bytes, uint32_t stride_bytes,
                                                   SmemSwizzle swizzle) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_address & 0x3ffff) >> 4);        // start address, bits [0, 14)
  desc |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3fff) << 16;  // leading byte offset, bits [16, 30)
  desc |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3fff) << 32;   // stride byte offset, bits [32, 46)
  desc |= static_cast<uint64_t>(swizzle) << 62;                        // swizzle mode, bits [62, 64)
  return desc;
}

// Descriptor of a K-major operand tile: rows of 128 bytes (64 halves) swizzled in 1024-byte atoms of
// 8 rows. Leading byte offset is unused with swizzling (16: one unit); stride byte offset = one atom (8 rows).
__device__ __forceinline__ uint64_t make_smem_desc_k_major_sw128(uint32_t smem_address) {
  constexpr uint32_t kAtomBytes = 8 * 128;
  return make_smem_desc(smem_address, 16, kAtomBytes, SmemSwizzle::bytes128);
}

// Descriptor of an MN-major operand tile (B row-major, N contiguous) with the 128-byte swizzle: atoms of
// 64 N-elements x 8 K-rows (one 128-byte row per k); `mn_atom_stride` bytes between atoms along N (leading
// byte offset), `k_group_stride` bytes between groups of 8 k-rows (stride byte offset).
__device__ __forceinline__ uint64_t make_smem_desc_mn_major_sw128(uint32_t smem_address, uint32_t mn_atom_stride,
                                                                  uint32_t k_group_stride) {
  return make_smem_desc(smem_address, mn_atom_stride, k_group_stride, SmemSwizzle::bytes128);
}

// Descriptor of a K-major operand tile without swizzle: core matrices of 8 rows x 16 bytes, each 128 contiguous
// bytes; `k_stride` bytes between core matrices adjacent along K (leading byte offset), `row_group_stride` between
// those adjacent along M/N (stride byte offset).
__device__ __forceinline__ uint64_t make_smem_desc_k_major_interleave(uint32_t smem_address, uint32_t k_stride,
                                                                      uint32_t row_group_stride) {
  return make_smem_desc(smem_address, k_stride, row_group_stride, SmemSwizzle::none);
}

// Orders this thread's generic-proxy shared-memory accesses (st.shared, cp.async) before later async-proxy
// ones (wgmma, TMA) (PTX ISA §9.7.13.4, membar/fence: fence.proxy.async).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The start address is in 16-byte units: moving along K inside a swizzled row adds bytes / 16.
__device__ __forceinline__ uint64_t advance_smem_desc(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int kCount>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

template <int kCount>
__device__ __forceinline__ void fence_registers(int32_t (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Register reallocation between warpgroups (PTX ISA §9.7.17.x, setmaxnreg).
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace nmkit::ptx
