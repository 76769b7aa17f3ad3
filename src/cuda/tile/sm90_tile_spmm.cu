// The Hopper tile kernel's product instantiations (sm90_tile_kernel.cuh, without instrumentation) and its
// host-side helpers: the unit-claim pool and the cluster waves the plan's split heuristic reads.
#include <atomic>
#include <mutex>
#include <vector>

#include "sm90_tile_kernel.cuh"

namespace nmkit::gpu::tile {

int32_t* unit_claim_slot() {
  static std::atomic<uint32_t> next_slot{0};
  return unit_claim_pool() + next_slot.fetch_add(1, std::memory_order_relaxed) % kUnitClaimSlots * kUnitClaimWords;
}

// How many CTAs of a split-K launch at block_n 32 or 64 (clusters of `split`, two CTAs per SM) run at once: a
// cluster needs its SMs within one GPC, so fewer than the CTA slots do (H200: 30 clusters of 8, 240 CTAs, against
// 264 slots). Asked once per block_n, for every split, of the current device.
ClusterWaveCtas cluster_wave_ctas(int block_n) {
  require(block_n == 32 || block_n == 64, ErrorCode::invalid_argument, "sm90 tile: cluster waves at block_n 32 or 64");
  static std::mutex mutex;
  static ClusterWaveCtas cached[2] = {};
  const std::lock_guard<std::mutex> lock(mutex);
  ClusterWaveCtas& ctas = cached[block_n == 64];
  if (ctas[1] > 0) return ctas;
  const auto query = [&]<int kBlockN>(int split) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(split));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = Shape<kBlockN, false>::kSmemBytes;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(split), cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    NMKIT_CUDA_CHECK(
        cudaOccupancyMaxActiveClusters(&clusters, ready_kernel<__half, __half, kBlockN, false, NoTimeline>(), &config));
    return int64_t{clusters} * split;
  };
  for (int split = 1; split <= kMaxSplit; ++split)
    ctas[static_cast<std::size_t>(split)] =
        block_n == 64 ? query.template operator()<64>(split) : query.template operator()<32>(split);
  return ctas;
}

int32_t* unit_claim_pool() {
  static std::mutex mutex;
  static std::vector<int32_t*> pools;  // per device, for the process's lifetime
  int device = 0;
  NMKIT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (pools.size() <= static_cast<std::size_t>(device)) pools.resize(static_cast<std::size_t>(device) + 1, nullptr);
  int32_t*& pool = pools[static_cast<std::size_t>(device)];
  if (!pool) {
    constexpr std::size_t kBytes = kUnitClaimSlots * kUnitClaimWords * sizeof(int32_t);
    NMKIT_CUDA_CHECK(cudaMalloc(&pool, kBytes));
    NMKIT_CUDA_CHECK(cudaMemset(pool, 0, kBytes));
  }
  return pool;
}

template <class Element, class Out>
void launch_sm90(const TileParams& p, const Sm90TileConfig& config, cudaStream_t stream) {
  launch_with<Element, Out>(p, config, NoTimeline{}, stream);
}

template void launch_sm90<__half, __half>(const TileParams&, const Sm90TileConfig&, cudaStream_t);
template void launch_sm90<__half, float>(const TileParams&, const Sm90TileConfig&, cudaStream_t);
template void launch_sm90<__nv_bfloat16, __nv_bfloat16>(const TileParams&, const Sm90TileConfig&, cudaStream_t);
template void launch_sm90<__nv_bfloat16, float>(const TileParams&, const Sm90TileConfig&, cudaStream_t);

}  // namespace nmkit::gpu::tile
