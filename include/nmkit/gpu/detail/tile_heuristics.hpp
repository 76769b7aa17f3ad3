#pragma once
// The tile plan's choices as pure functions of the problem and of device facts passed in (no CUDA calls): which
// kernel, the Hopper kernel's token block, split and grid, the stream kernels' CTAs. Host code
// (src/cuda/tile/heuristics.cpp), tested without a GPU (tests/cpu/test_tile_heuristics.cpp). Not part of the
// public API.
#include <array>
#include <cstdint>

#include "nmkit/gpu/detail/nm24_heuristics.hpp"
#include "nmkit/gpu/tile_spmm.hpp"

namespace nmkit::gpu::tile {

inline constexpr int kMaxClusterSplit = nm24::kMaxClusterCtas;  // the Hopper kernel's largest split
inline constexpr int kSm90BlockRows = 128;                      // rows of D per work unit of the Hopper kernel

// The Hopper kernel's configuration for one plan.
struct Sm90TileConfig {
  int block_n = 256;       // 32, 64, 128 or 256
  int split = 1;           // 1..8
  bool persistent = true;  // one CTA per slot over all units (split == 1 only)
  // Each unit's 16-bit outputs staged for one producer lane to store by TMA (split == 1, block_n >= 64, D final in
  // registers: sm90_epilogue::outputs_final_in_registers); otherwise each consumer warpgroup writes its rows.
  bool deferred_store = false;
};

// Hopper CTAs per SM: token blocks of up to 64 (decode-sized C) need few accumulators and short pipelines, and
// their grids are small (split K over clusters), so two share an SM; wider blocks take the whole SM.
constexpr int sm90_ctas_per_sm(int block_n) { return block_n <= 64 ? 2 : 1; }

// The narrowest token block that covers C: at C <= 32 a 64-token x box would carry half zeros per step.
int sm90_block_n(int64_t n);

// For split 0..kMaxClusterSplit (the index), how many CTAs of clusters of that many run at once at one block_n
// (cudaOccupancyMaxActiveClusters x split): a cluster needs its SMs within one GPC, so fewer than the CTA slots.
using ClusterWaveCtas = std::array<int64_t, kMaxClusterSplit + 1>;

// block_n and split by shape on a device of sm_count SMs; `waves` at sm90_block_n(n), read only where that block
// runs two CTAs per SM. persistent and deferred_store as the launch's defaults (sm90_launch_config resolves them).
Sm90TileConfig sm90_tile_config(int64_t rows, int64_t cols, int64_t n, int tile_cols, int sm_count,
                                const ClusterWaveCtas& waves);
// What a plan launches: `launch`'s block_n and split where set, else `by_shape`'s; persistent only at split 1; the
// deferred store where D is final in registers (16-bit, beta 0, no GELU) at split 1 and block_n >= 64.
Sm90TileConfig sm90_launch_config(const Sm90TileConfig& by_shape, const TileLaunch& launch, bool outputs_final);

// The Hopper kernel's grid: one CTA per unit and split, or, persistent at split 1, one per CTA slot at most.
int64_t sm90_grid_ctas(int64_t units, int split, bool persistent, int block_n, int sm_count);
// Persistent CTAs claim units from a counter only where blocks differ in length (the longest first) and there are
// more units than CTAs: on balanced schedules the static stride was 1-6 % faster.
bool sm90_claims_units(int64_t units, int64_t grid_ctas, int split, bool persistent, bool balanced);

// The kernel `automatic` resolves to for a plan (before any per-weight choice): the Hopper kernel where it can
// run, else the stream kernel up to kStreamMaxTokens tokens, else the portable one.
TileKernel automatic_tile_kernel(bool sm90_possible, int64_t n);

inline constexpr int kStreamMinTilesPerCta = 1;  // at low density more CTAs of one tile beat fewer of two
// The stream kernel's CTAs per token block: at most one per tile and max_ctas; 1 for a weight with no tiles.
int64_t stream_ctas(int64_t nnz_tiles, int max_ctas);

inline constexpr int kWarpStreamTileRows = 32;
inline constexpr int kWarpStreamChunkCols = 32;        // the columns a warp streams at a time
inline constexpr int kWarpStreamWarps = 8;             // warps per CTA (WarpStreamLead::kWarpsPerCta)
inline constexpr int kWarpStreamMinChunksPerWarp = 2;  // fewer, longer ranges share fewer rows
// The tile shapes the warp-stream kernel runs: its own (tile rows of 32) or through the weight's split copy.
constexpr bool warp_stream_runs(int tile_rows, int tile_cols) {
  return tile_rows % kWarpStreamTileRows == 0 && tile_cols % kWarpStreamChunkCols == 0;
}
// The warp-stream kernel's CTAs for a weight of nnz_tiles tiles without a schedule: kWarpStreamMinChunksPerWarp
// chunks per warp, at most one CTA per chunk and max_ctas.
int64_t warp_stream_ctas(int64_t nnz_tiles, int tile_cols, int max_ctas);

}  // namespace nmkit::gpu::tile
