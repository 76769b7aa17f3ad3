#pragma once
// Bulk tensor copy, global -> shared, 2-D tile, completing on an mbarrier
// (PTX ISA §9.7.9.27, "Data Movement: cp.async.bulk.tensor"). sm_90 and later.
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ void tma_load_2d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t inner,
                                            int32_t outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(tensor_map), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(inner), "r"(outer)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(tensor_map), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

}  // namespace nmkit::ptx

namespace nmkit::ptx {

// Contiguous bulk copy global -> shared completing on an mbarrier (PTX ISA §9.7.9.25.4.1, cp.async.bulk).
// bytes, source and destination must be multiples of 16.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
               "l"(gmem_src), "r"(bytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
}

}  // namespace nmkit::ptx

namespace nmkit::ptx {

// The 2-D tile copy, written to the same shared-memory offset of every CTA in `cta_mask` and completing on the
// mbarrier at the same offset in each (PTX ISA §9.7.9.27, .multicast::cluster).
__device__ __forceinline__ void tma_load_2d_multicast(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t inner,
                                                      int32_t outer, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4}], "
      "[%2], %5;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(tensor_map), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(inner), "r"(outer), "h"(cta_mask)
      : "memory");
}

}  // namespace nmkit::ptx
