#pragma once
// Thread-block clusters (PTX ISA §9.7.13.4 barrier.cluster, §9.7.9.13 mapa, §10 %cluster_ctarank), sm_90.
// The cluster-scope forms of mbarrier arrive/wait live with the other mbarrier wrappers (mbarrier.cuh).
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

}  // namespace nmkit::ptx
