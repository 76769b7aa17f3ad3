#pragma once
// The split-K epilogue of the Hopper kernels (2:4, V:N:M and tiles): the CTAs of a cluster each hold a partial
// 128 x kBlockN tile in their two consumer warpgroups' accumulators. Each stages its partial tile in its own (then
// idle) pipeline memory, a 64 x kBlockN tile per warpgroup, and every CTA writes a share of D from the sum of the
// cluster's staged tiles, read through distributed shared memory: no workspace and no second launch. A launch
// without split is a cluster of one. The two halves go to their own rows of D (m0 and m0 + 64 for 2:4; a tile
// block's halves are paired tile rows, not neighbours: tile_block_schedule).
#include <cstdint>

#include "../ptx/cluster.cuh"
#include "nmkit/gpu/detail/nm24_heuristics.hpp"
#include "sm90_epilogue.cuh"

namespace nmkit::gpu::sm90_epilogue {

struct BlockRows {
  int64_t first[2];  // the first row of D of the block's first and second 64 rows
  // Half h's (a runtime index without a local-memory copy of the array).
  __device__ __forceinline__ int64_t of(int half) const { return half == 0 ? first[0] : first[1]; }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Called by all 256 consumer threads (consumer_thread = 0..255) of every CTA of the cluster; the cluster's other
// threads (the producer warpgroup) must meet its two cluster barriers with ptx::cluster_sync() and
// ptx::cluster_sync_relaxed().
template <class Out, int kBlockN, int kAccumulators, class P>
__device__ __forceinline__ void write_cluster_sum(const P& p, float* staging, const float (&acc)[kAccumulators],
                                                  const BlockRows& rows, int64_t n0, int consumer_thread) {
  using Half = EpilogueTile<kWarpgroupRows, kBlockN>;
  static_assert(Half::kBytes % 16 == 0, "each half's tile 16-byte aligned");
  const uint32_t split = ptx::cluster_nctarank(), rank = ptx::cluster_ctarank();
  const int warpgroup = consumer_thread / 128, thread_in_group = consumer_thread % 128;
  const auto half_tile = [&](int half) { return Half{p.d_col_major, staging + half * (Half::kBytes / 4)}; };
  consumer_sync();  // both warpgroups are done with the pipeline memory the partial tile overwrites
  stage_accumulators(p, half_tile(warpgroup), acc, rank == 0 ? p.bias : nullptr, rows.of(warpgroup), 0, 0,
                     thread_in_group);
  ptx::cluster_sync();  // every CTA's partial tile is staged
  const auto sum_of_cluster = [split](const float* staged) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (uint32_t r = 0; r < nm24::kMaxClusterCtas; ++r)
      if (r < split) {
        const float4 v = ptx::ld_shared_cluster_f32x4(ptx::map_to_rank(staged, r));
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
    return sum;
  };
#pragma unroll
  for (int half = 0; half < 2; ++half)
    write_tile<Out>(p, half_tile(half), rows.first[half], n0,
                    static_cast<int>(rank) * kEpilogueThreads + consumer_thread,
                    static_cast<int>(split) * kEpilogueThreads, sum_of_cluster);
  ptx::cluster_sync_relaxed();  // no CTA leaves while another still reads its tile
}
#endif

}  // namespace nmkit::gpu::sm90_epilogue
