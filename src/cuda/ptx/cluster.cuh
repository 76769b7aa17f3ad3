#pragma once
// Thread-block clusters (PTX ISA §9.7.13.4 barrier.cluster, §9.7.9.13 mapa, §10.x %cluster_ctarank) and the
// cluster-scope forms of mbarrier arrive/wait (§9.7.13.15), sm_90.
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster arrives (release) and waits (acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of `local` (a shared variable) in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t map_to_rank(const void* local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}

// Arrives on an mbarrier of another CTA of the cluster (address from map_to_rank), releasing at cluster scope.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

// Waits for the phase with parity `phase`, acquiring what other CTAs of the cluster released.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t phase) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_loop:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_loop;\n"
      "}\n" ::"r"(address),
      "r"(phase)
      : "memory");
}

}  // namespace nmkit::ptx
