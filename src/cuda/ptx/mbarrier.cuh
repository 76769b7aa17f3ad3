#pragma once
// mbarrier in shared memory (PTX ISA §9.7.13.15, "Parallel Synchronization and Communication: mbarrier").
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(arrivals));
}

// Makes barrier initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::); }

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile(
      "mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))));
}

// Arrives and adds `bytes` to the transaction count that async copies will complete. `bar` as a shared-space
// address: a loop that keeps its stages' addresses in 32 bits does not rebuild generic pointers every round.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes));
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  mbarrier_arrive_expect_tx(static_cast<uint32_t>(__cvta_generic_to_shared(bar)), bytes);
}

// The try_wait spin loop around one form of the instruction (scoped labels, so it can be inlined many times).
#define NMKIT_MBARRIER_WAIT_LOOP(TRY_WAIT) \
  "{\n.reg .pred done;\nwait_loop:\n" TRY_WAIT " done, [%0], %1;\n@!done bra wait_loop;\n}\n"

// Spins until the phase with parity `phase` has completed. The memory clobber keeps the compiler from moving
// the reads of what the phase delivered above the wait.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(NMKIT_MBARRIER_WAIT_LOOP("mbarrier.try_wait.parity.shared::cta.b64")::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(phase)
               : "memory");
}

// The same wait for a warp with nothing else to do: each try_wait may suspend the thread for up to
// `suspend_ns` (the hardware wakes it when the phase completes), so a long wait costs the SM's schedulers and
// the barrier unit a few polls instead of a tight loop.
__device__ __forceinline__ void mbarrier_wait_suspended(uint64_t* bar, uint32_t phase, uint32_t suspend_ns = 1000000) {
  asm volatile(
      "{\n.reg .pred done;\nwait_loop:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra wait_loop;\n}\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
      "r"(phase), "r"(suspend_ns)
      : "memory");
}

}  // namespace nmkit::ptx
