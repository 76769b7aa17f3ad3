#pragma once
// The packed-tile weight's host-side internals: tile-side limits, row orders, the kernels' schedules and the
// widened and split copies that upload makes. Not part of the public API.
#include <cstdint>
#include <memory>
#include <vector>

#include "nmkit/gpu/detail/tile_steps.hpp"
#include "nmkit/gpu/tile_spmm.hpp"

namespace nmkit::gpu {

// Tile sides the kernels run: 16, 32, 64 or 128 (whole 16 x 16 MMA steps), rows and columns chosen separately.
inline constexpr int kTileSideUnit = 16;
inline constexpr int kMaxKernelTileSide = 128;
inline constexpr int kTileBlockRows = 128;       // rows of D per CTA of the Hopper kernel
inline constexpr int64_t kStreamMaxTokens = 32;  // `automatic` takes stream_mma up to this many tokens
inline constexpr int kMaxStreamCtas = 1 << 20;   // the largest TileLaunch::stream_ctas

// What DeviceTiles::upload makes beside the packed arrays: the kernels' work lists in device memory (empty where
// the weight's tile shape has none) and the copies the Hopper and warp-stream kernels read (null where none).
struct DeviceTileSchedules {
  DeviceBuffer row_order_, tile_row_;                      // tile_rows_longest_first, tile_row_of_tiles
  DeviceBuffer block_, block_groups_, step_ptr_, steps_;   // the Hopper kernel's TileBlockSchedule
  bool balanced = false;                                   // TileBlockSchedule::balanced
  DeviceBuffer warp_stream_leads_;                         // the warp-stream kernel's records, where ctas > 0
  int64_t warp_stream_ctas = 0, warp_stream_rows_cut = 0;  // WarpStreamSchedule: CTAs, tile rows cut over CTAs
  std::shared_ptr<const DeviceTiles> widened;              // sides below kSm90MinTileSide widened (widen_tiles)
  std::shared_ptr<const DeviceTiles> split_rows;           // tiles taller than 32 rows cut (split_tile_rows)

  const int32_t* row_order() const noexcept { return static_cast<const int32_t*>(row_order_.data()); }
  const int32_t* tile_row() const noexcept { return static_cast<const int32_t*>(tile_row_.data()); }
  const int32_t* block() const noexcept { return static_cast<const int32_t*>(block_.data()); }
  const int32_t* block_groups() const noexcept { return static_cast<const int32_t*>(block_groups_.data()); }
  const int32_t* step_ptr() const noexcept { return static_cast<const int32_t*>(step_ptr_.data()); }
  const TileStep* steps() const noexcept { return static_cast<const TileStep*>(steps_.data()); }
  const WarpStreamLead* warp_stream_leads() const noexcept {
    return warp_stream_ctas ? static_cast<const WarpStreamLead*>(warp_stream_leads_.data()) : nullptr;
  }
};
const DeviceTileSchedules& tile_schedules(const DeviceTiles& a) noexcept;
// Whether the plan's sm90 kernel stores D by TMA while the next unit runs (16-bit D, beta 0, no GELU, split 1,
// block_n >= 64); a run keeps the chunked epilogue where D is not 16-byte aligned.
bool tile_plan_defers_store(const TileSpmmPlan& plan) noexcept;

// Throws Error unless row_ptr, col_index and data are consistent with the shape (what upload checks).
void check_packed_tiles(const PackedTiles& p);

// The rows of a CSR-style `ptr` (row i owns [ptr[i], ptr[i+1])) by descending length (ties: ascending row): the
// kernels start the longest rows first, so that a skewed pattern's long rows do not run alone at the end of the
// grid.
std::vector<int32_t> tile_rows_longest_first(const std::vector<int32_t>& row_ptr);
// The tile row of each stored tile of a CSR-style `ptr` (DeviceTiles::tile_row, for the stream kernel).
std::vector<int32_t> tile_row_of_tiles(const std::vector<int32_t>& row_ptr);

// For tile rows of 64 or 128 (unsupported otherwise); p must pass check_packed_tiles.
TileBlockSchedule tile_block_schedule(const PackedTiles& p);
// The tile rows of a weight in 64-row tiles as blocks of two, {first, second} per block (-1: none, for an odd
// count), chosen to share many tile columns: greedily, the row with the most tiles first, each with the unpaired row
// (of the next kPairWindow by tile count) it shares the most columns with, among those whose pair takes no more
// steps than the longest pair of neighbours (rows 2b, 2b + 1: on skewed patterns the longest block bounds the
// product); where neighbours would take as few steps in all, those instead. Every tile row once. On random 4096^2
// patterns at density 0.5 / 0.25 / 0.1 / 0.05, 9 / 13 / 14 / 18 % fewer steps than neighbours (a model);
// all-MiniLM-L6-v2 pruned to 64x64 tiles, 17-21 %.
inline constexpr int kPairWindow = 512;
std::vector<int32_t> pair_tile_rows(const PackedTiles& p);

// Empty (the kernel then cuts the chunks evenly over its CTAs) where there are no chunks or more than fit 32-bit
// indices.
WarpStreamSchedule warp_stream_schedule(const std::vector<int32_t>& row_ptr, int chunks_per_tile, int64_t target_ctas,
                                        int64_t max_ctas);

// The records of every warp of the schedule's CTAs (ctas x kWarpsPerCta), for a weight in tiles of chunks_per_tile
// 32-column chunks stored in CSR order (row_ptr, col_index). s must be non-empty.
std::vector<WarpStreamLead> warp_stream_leads(const WarpStreamSchedule& s, const std::vector<int32_t>& row_ptr,
                                              const std::vector<int32_t>& col_index, int chunks_per_tile);

// The Hopper kernel runs tile sides of 64 and 128. A weight whose tiles are narrower (16 or 32) along a side runs
// it through a widened copy: each tile side below kSm90MinTileSide becomes kSm90MinTileSide, and a wide tile holds
// the small tiles that fall into it with zeros around them. That costs bytes and math on the zeros (up to
// (64 / tile_rows) x (64 / tile_cols) times the small tiles' at low density)
// and wins wherever the portable kernel is the alternative. p must pass check_packed_tiles.
inline constexpr int kSm90MinTileSide = 64;
PackedTiles widen_tiles(const PackedTiles& p);

// The same weight in tiles `tile_rows` high: each stored tile cut into p.tile_rows / tile_rows tiles of the same
// columns, rows past R dropped (the warp-stream kernel's copy of a weight in tiles taller than 32 rows). The bytes
// are the same; tile row i of the result is part i % (p.tile_rows / tile_rows) of p's tile row i / (that ratio).
// p must pass check_packed_tiles; tile_rows must divide p.tile_rows.
PackedTiles split_tile_rows(const PackedTiles& p, int tile_rows);

}  // namespace nmkit::gpu
