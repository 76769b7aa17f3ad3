// The nm24 and V:N:M plans' shape heuristics (host only, no device queries).
#include "nmkit/gpu/detail/nm24_heuristics.hpp"

#include <algorithm>
#include <utility>

#include "nmkit/gpu/detail/nm24_layout.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit::gpu::nm24 {
namespace {

constexpr double kSmMathRate = 6.5e12;           // dense-equivalent FLOP/s of one SM in the wgmma.sp kernel
constexpr double kMemoryBandwidth = 4.0e12;      // bytes/s from HBM
constexpr double kPackedBytesPerWeight = 1.125;  // 2:4 fp16: half the values plus 4 bits a stored value
constexpr double kTieTolerance = 0.01;
// A CTA's pipeline round when its math is short (the producer's wait, copies and arrive, the consumers' release):
// narrow n-tiles on the H200 ran 0.27-0.29 us a k-tile whatever their width (models suite, small_grid_variants.txt).
constexpr double kKTileRoundSeconds = 0.27e-6;
// Split-K's measured gain over no split, fixed costs included: clusters of 2 (two k-tiles a stage) ~0.66 of the
// unsplit time (0.85 with one k-tile a stage, times 0.70-0.83 for the second k-tile: H200), clusters of 4 ~0.82 of
// clusters of 2 at 8 row tiles, clusters of 8 ~0.80 (H100, small_grid_variants). Not half: a split CTA's rounds
// cost more than a plain one's.
constexpr double split_time_ratio(int split) { return split >= 4 ? 0.55 : split > 1 ? 0.66 : 1.0; }

// On the V:N:M suite 64 rows per group gained up to 14 % at 2:32, and lost 6-12 % where 64 row tiles of A
// overflowed L2 (36864x12288x4096 at 2:8).
constexpr int kMaxGatherGroupRows = 64;
constexpr double kGatherGroupL2Share = 0.5;

// The register epilogue stores 64-column parts of the tile: n-tiles of 16 and 32 (decode) keep the staged one.
constexpr int kRegisterEpiloguePart = 64;

}  // namespace

int sm90_block_n(int64_t rows, int64_t cols, int64_t n, int sm_count, std::span<const BlockNChoice> choices,
                 SplitK split_k, int k_tile) {
  const int64_t row_tiles = ceil_div(rows, kPackRowAlign), k_tiles = ceil_div(cols, int64_t{k_tile});
  const double weight_time =
      static_cast<double>(rows) * static_cast<double>(cols) * kPackedBytesPerWeight / kMemoryBandwidth;
  const double rounds_time = static_cast<double>(k_tiles) * kKTileRoundSeconds;
  int best = choices.front().block_n;
  double best_cost = 1e300;
  for (const BlockNChoice& c : choices) {
    const int64_t tiles = row_tiles * ceil_div(n, c.block_n);
    const int split =
        split_k == SplitK::by_shape && c.block_n <= kMaxSplitBlockN ? sm90_split(tiles, k_tiles, sm_count) : 1;
    // Split-K runs only where its CTAs still fit in one wave (sm90_split), so the CTAs decide the rate.
    const int64_t ctas = tiles * split;
    const double efficiency = ctas > sm_count ? c.multi_wave_efficiency : c.one_wave_efficiency;
    const double tile_math = 2.0 * kPackRowAlign * c.block_n * static_cast<double>(cols) / (kSmMathRate * efficiency);
    const double tile_time = std::max(tile_math, rounds_time) * split_time_ratio(split);
    const double cost = std::max(static_cast<double>(ceil_div(ctas, int64_t{sm_count})) * tile_time, weight_time);
    // Ties (typically when reading A or the rounds bind) go to the narrowest tile that still covers C, else to the
    // narrowest: less math on padding and less shared-memory traffic for the same time.
    const bool tie = cost <= best_cost * (1 + kTieTolerance) && cost >= best_cost * (1 - kTieTolerance);
    const auto rank = [n](int block_n) { return std::pair{block_n < n, block_n}; };
    if ((!tie && cost < best_cost) || (tie && rank(c.block_n) < rank(best)))
      best_cost = std::min(cost, best_cost), best = c.block_n;
  }
  return best;
}

int sm90_gather_group_rows(int64_t cols, int64_t l2_bytes) {
  const double a_row_tile_bytes =
      static_cast<double>(kPackRowAlign) * static_cast<double>(cols) * kPackedBytesPerWeight;
  int rows = kMaxGatherGroupRows;
  while (rows > kSm90GroupRows && rows * a_row_tile_bytes > kGatherGroupL2Share * static_cast<double>(l2_bytes))
    rows /= 2;
  return rows;
}

Sm90Schedule sm90_schedule(int64_t tiles, int block_n, bool final_in_registers, int sm_count) {
  if (block_n % kRegisterEpiloguePart != 0 || !final_in_registers) return Sm90Schedule::staged;
  // Persistent CTAs pay off where there are more tiles than SMs: the next tile's first copies stream in while the
  // last tile's outputs are stored (0-3 % faster with two output parts in flight per warpgroup).
  return tiles > sm_count ? Sm90Schedule::persistent : Sm90Schedule::registers;
}

int sm90_split(int64_t tiles, int64_t k_tiles, int sm_count) {
  if (tiles <= 0 || 2 * tiles >= sm_count) return 1;
  // The largest cluster (2, 4, ... kMaxAutoSplit) whose CTAs all fit in half the SMs, clusters of 2 at least.
  int64_t by_grid = 2;
  while (2 * by_grid <= kMaxAutoSplit && 2 * (2 * by_grid) * tiles <= sm_count) by_grid *= 2;
  const int64_t split = std::min(by_grid, k_tiles / kMinSplitKTiles);
  // The rounds saved grow with the split, so where the largest one does not pay, none does.
  const double rounds_saved = static_cast<double>(k_tiles) * (1.0 - 1.0 / static_cast<double>(split));
  return split > 1 && rounds_saved > kSplitCostKTiles ? static_cast<int>(split) : 1;
}

int skinny_block_n(int64_t n) { return n <= 8 ? 8 : 16; }

int skinny_block_m(int64_t rows, int64_t n, int sm_count) {
  const int64_t block_n = skinny_block_n(n), column_tiles = (std::max<int64_t>(n, 1) + block_n - 1) / block_n;
  const int64_t ctas_of_32_rows = (rows + 2 * kSlabRows - 1) / (2 * kSlabRows) * column_tiles;
  return 2 * ctas_of_32_rows >= sm_count ? 2 * kSlabRows : kSlabRows;
}

int skinny_split(int64_t cols, int block_m, int block_n) {
  const int64_t kblocks = (cols + kFragmentK - 1) / kFragmentK;
  const int64_t per_cta = int64_t{kSkinnyWarps} * skinny_batch(block_m / kSlabRows, block_n / kSkinnyMmaCols);
  return static_cast<int>(std::clamp<int64_t>((kblocks + per_cta - 1) / per_cta, 1, kMaxClusterCtas));
}

bool skinny_takes(int64_t rows, int64_t cols, int64_t n) {
  if (n > kSkinnyMaxTokens) return false;
  if (cols <= kSkinnyMaxK) return rows * n <= kSkinnyMaxOutputs;
  return cols <= kSkinnySplitMaxK && rows * cols <= kSkinnySplitMaxWeights && rows * n <= kSkinnySplitMaxOutputs;
}

bool skinny_takes_8bit(int64_t rows, int64_t cols, int64_t n) {
  return skinny_takes(rows, skinny_cols_of_8bit(cols), n);
}

bool vnm_skinny_takes(int64_t rows, int64_t condensed_cols, int64_t n, bool b_col_major) {
  if (condensed_cols > kSkinnySplitMaxK) return false;  // a warp's k-blocks in one batch, over a cluster of 8
  if (b_col_major) return n <= kVnmSkinnyMaxTokens;
  const int64_t weights = rows * condensed_cols;
  return n <= kVnmSkinnyNarrowTokens ? weights <= kVnmSkinnyMaxNarrowWeights
                                     : n <= kVnmSkinnyMaxTokens && weights <= kVnmSkinnyMaxWeights;
}

}  // namespace nmkit::gpu::nm24
