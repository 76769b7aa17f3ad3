#pragma once
// cp.async.cg.shared.global (16 bytes, zero-filled past src_bytes) and its group fences
// (PTX ISA §9.7.9.25, "Data Movement: cp.async"). sm_80 and later.
#include <cstdint>

#include "address.cuh"

namespace nmkit::ptx {

// Copies src_bytes (0 or 16) from global to shared and zero-fills the rest of the 16 bytes.
__device__ __forceinline__ void cp_async_16(uint32_t smem_address, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address), "l"(gmem), "r"(src_bytes));
}

// The same copy at compile-time byte offsets from both addresses ([reg+imm] operands), so that copies stepping
// through a tile from one base stay one instruction each (ptxas otherwise may keep a base register per offset).
template <int kDstOffset, int kSrcOffset>
__device__ __forceinline__ void cp_async_16_at(uint32_t smem_address, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0+%3], [%1+%4], 16, %2;\n" ::"r"(smem_address), "l"(gmem), "r"(src_bytes),
               "n"(kDstOffset), "n"(kSrcOffset));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Arrives on an mbarrier once all of this thread's earlier cp.async copies have landed (PTX ISA §9.7.9.25.4,
// cp.async.mbarrier.arrive). .noinc: the arrival is one of those the barrier was initialised to expect.
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
}

}  // namespace nmkit::ptx
