// The tile plan's heuristics (detail/tile_heuristics.hpp): host code without CUDA calls.
#include "nmkit/gpu/detail/tile_heuristics.hpp"

#include <algorithm>

#include "nmkit/gpu/detail/tile_schedule.hpp"

namespace nmkit::gpu::tile {

int sm90_block_n(int64_t n) { return n > 128 ? 256 : n > 64 ? 128 : n > 32 ? 64 : 32; }

Sm90TileConfig sm90_tile_config(int64_t rows, int64_t cols, int64_t n, int tile_cols, int sm_count,
                                const ClusterWaveCtas& waves) {
  Sm90TileConfig c;
  c.block_n = sm90_block_n(n);
  // Split K across a cluster when the grid would leave most CTA slots idle, as long as every CTA keeps a few tile
  // columns. Token blocks of up to 64 (two CTAs per SM) take the widest split, of any size up to 8, whose clusters
  // all run at once (4096^2 weights at C = 32, H200: split 7, 224 CTAs, beat 4 by 5-15 %, and 8 needs a second
  // wave). Wider blocks double the split while the grid stays under a quarter of the slots.
  const int64_t units = ceil_div(rows, int64_t{kSm90BlockRows}) * ceil_div(n, int64_t{c.block_n});
  const int64_t grid_cols = ceil_div(cols, int64_t{tile_cols});
  const int64_t slots = int64_t{sm_count} * sm90_ctas_per_sm(c.block_n);
  if (sm90_ctas_per_sm(c.block_n) == 1) {
    while (c.split < kMaxClusterSplit && units * c.split * 2 <= slots / 2 && grid_cols >= 4 * c.split * 2) c.split *= 2;
  } else if (units * 4 <= slots) {
    for (int split = 2; split <= kMaxClusterSplit && grid_cols >= 4 * split; ++split)
      if (units * split <= waves[static_cast<std::size_t>(split)]) c.split = split;
  }
  return c;
}

Sm90TileConfig sm90_launch_config(const Sm90TileConfig& by_shape, const TileLaunch& launch, bool outputs_final) {
  Sm90TileConfig c;
  c.block_n = launch.block_n ? launch.block_n : by_shape.block_n;
  c.split = launch.split ? launch.split : by_shape.split;
  c.persistent = launch.persistent && c.split == 1;
  c.deferred_store = outputs_final && c.split == 1 && c.block_n >= 64;  // 64: one whole TMA box of a 128-byte line
  return c;
}

int64_t sm90_grid_ctas(int64_t units, int split, bool persistent, int block_n, int sm_count) {
  const int64_t resident = int64_t{sm_count} * sm90_ctas_per_sm(block_n);
  return persistent && split == 1 ? std::min<int64_t>(units, resident) : units * split;
}

bool sm90_claims_units(int64_t units, int64_t grid_ctas, int split, bool persistent, bool balanced) {
  return persistent && split == 1 && units > grid_ctas && !balanced;
}

TileKernel automatic_tile_kernel(bool sm90_possible, int64_t n) {
  // The stream kernel beats the portable one wherever C is small (a grid that fills the GPU, not one CTA per tile
  // row: 1.1-7.2x at C = 32), but not the Hopper kernel.
  return sm90_possible ? TileKernel::sm90_wgmma : n <= kStreamMaxTokens ? TileKernel::stream_mma : TileKernel::sm80_mma;
}

int64_t stream_ctas(int64_t nnz_tiles, int max_ctas) {
  if (nnz_tiles == 0) return 1;  // only empty rows to write
  return std::clamp<int64_t>(ceil_div(nnz_tiles, int64_t{kStreamMinTilesPerCta}), 1,
                             std::min<int64_t>(max_ctas, nnz_tiles));
}

int64_t warp_stream_ctas(int64_t nnz_tiles, int tile_cols, int max_ctas) {
  if (nnz_tiles == 0) return 1;  // only empty rows to write
  const int64_t chunks = nnz_tiles * (tile_cols / kWarpStreamChunkCols);
  return std::clamp<int64_t>(ceil_div(chunks, int64_t{kWarpStreamWarps} * kWarpStreamMinChunksPerWarp), 1,
                             std::min<int64_t>(max_ctas, chunks));
}

}  // namespace nmkit::gpu::tile
