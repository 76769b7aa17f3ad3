#pragma once
// Thread-block clusters (PTX ISA §9.7.13.4 barrier.cluster, §9.7.9.13 mapa, §9.7.9.8 ld.shared::cluster,
// §10 %cluster_ctarank / %cluster_nctarank), sm_90.
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The number of CTAs in this CTA's cluster (1 for a launch without clusters).
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t count;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(count));
  return count;
}

// Every thread of every CTA of the cluster arrives (release) and waits (acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The same barrier without the arrival's release: for a last barrier that only keeps each CTA alive while the others
// read its shared memory (their ld.shared::cluster results already consumed). In SASS a cluster-scope release is a
// GPU-scope memory barrier, which would first wait for every global store of the CTA (the tile just written).
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// The shared::cluster address of `local` (a shared variable) in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t map_to_rank(const void* local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}

// A 32-bit word at a shared::cluster address (map_to_rank): a float or int32 sum, bit for bit.
__device__ __forceinline__ uint32_t ld_shared_cluster_b32(uint32_t address) {
  uint32_t v;
  asm volatile("ld.shared::cluster.b32 %0, [%1];\n" : "=r"(v) : "r"(address) : "memory");
  return v;
}

// Four floats at a shared::cluster address (map_to_rank), PTX ISA §9.7.9.8 ld with the .shared::cluster space.
__device__ __forceinline__ float4 ld_shared_cluster_f32x4(uint32_t address) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

}  // namespace nmkit::ptx
