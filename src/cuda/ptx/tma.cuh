#pragma once
// Bulk tensor copies, global -> shared, 2-D to 5-D tiles, completing on an mbarrier
// (PTX ISA §9.7.9.27, "Data Movement: cp.async.bulk.tensor"). sm_90 and later.
#include <cstdint>

namespace nmkit::ptx {

// smem_dst and bar as shared-space addresses (the overload below takes generic pointers).
__device__ __forceinline__ void tma_load_2d(uint32_t smem_dst, const void* tensor_map, uint32_t bar, int32_t inner,
                                            int32_t outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_dst),
      "l"(tensor_map), "r"(bar), "r"(inner), "r"(outer)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t inner,
                                            int32_t outer) {
  tma_load_2d(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst)), tensor_map,
              static_cast<uint32_t>(__cvta_generic_to_shared(bar)), inner, outer);
}

__device__ __forceinline__ void tma_load_3d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(tensor_map), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(tensor_map), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ __forceinline__ void tma_load_5d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], "
      "[%2];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
      "l"(tensor_map), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(c4)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

}  // namespace nmkit::ptx

namespace nmkit::ptx {

// Contiguous bulk copy global -> shared completing on an mbarrier (PTX ISA §9.7.9.25.4.1, cp.async.bulk).
// bytes, source and destination must be multiples of 16.
// smem_dst and bar as shared-space addresses (the overload below takes generic pointers).
__device__ __forceinline__ void bulk_load(uint32_t smem_dst, const void* gmem_src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_dst),
      "l"(gmem_src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  bulk_load(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst)), gmem_src, bytes,
            static_cast<uint32_t>(__cvta_generic_to_shared(bar)));
}

}  // namespace nmkit::ptx

namespace nmkit::ptx {

// Bulk tensor copy, shared -> global, 2-D tile, tracked by this thread's bulk async-groups (PTX ISA §9.7.9.27,
// .global.shared::cta.bulk_group). Elements of the box outside the tensor are not written. The source box must
// be written by the generic proxy before a fence.proxy.async.shared::cta.
__device__ __forceinline__ void tma_store_2d(const void* tensor_map, uint32_t smem_src, int32_t inner, int32_t outer) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(tensor_map),
               "r"(smem_src), "r"(inner), "r"(outer)
               : "memory");
}

// Closes the bulk copies issued so far into one group (PTX ISA §9.7.9.28, cp.async.bulk.commit_group).
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending groups are pending: .read only until their sources have been read (the shared
// buffer may be rewritten), otherwise until their writes are done (PTX ISA §9.7.9.29, cp.async.bulk.wait_group).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace nmkit::ptx
