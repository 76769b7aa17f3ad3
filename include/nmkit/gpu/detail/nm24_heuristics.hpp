#pragma once
// The choices an nm24 or V:N:M plan makes by shape, as pure functions of the shape and of device facts passed in:
// the plans query the device once and call these; the tests call them with any device they like.
#include <cstdint>
#include <span>

#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu::nm24 {

struct DeviceFacts {
  int sm_count = 132;
  int64_t l2_bytes = 50 << 20;
};

// An n-tile width the sm90 heuristic may take, and the math rate one tile of it reaches relative to the others of
// its kernel (narrow tiles issue small, less efficient wgmma; the gathering producer pays per row).
struct BlockNChoice {
  int block_n;
  double one_wave_efficiency;    // where the grid takes one wave of the SMs or less
  double multi_wave_efficiency;  // where it takes more (each SM runs several tiles, persistent where it can)
};
// The n-tiles of each sm90 kernel. The 2:4 and 8-bit kernels' multi-wave values are fitted to widths timed against
// one another in the same rounds (f16 and e4m3, 47 shapes at T = 136-8192, H100): over several waves n192 and n128
// fall well below n256's rate per column, while one wave of n192 still beats two of n64 (11008x4096 at
// T = 136-160). B row-major takes whole 64-column TMA boxes; the gathering kernels lose more on narrow tiles than
// the 2:4 kernel (the producer's copies and fill are per row) and use one rate for both (not measured over several
// waves).
inline constexpr BlockNChoice kColMajorBlockN[] = {{256, 1.0, 1.0}, {192, 0.97, 0.8}, {128, 0.92, 0.8},
                                                   {64, 0.8, 0.6},  {32, 0.6, 0.4},   {16, 0.4, 0.2}};
inline constexpr BlockNChoice kRowMajorBlockN[] = {{256, 1.0, 1.0}, {192, 0.97, 0.8}, {128, 0.92, 0.8}, {64, 0.8, 0.6}};
inline constexpr BlockNChoice kGatherOneTileBlockN[] = {{256, 1.0, 1.0}, {128, 0.75, 0.75}, {64, 0.45, 0.45}};
inline constexpr BlockNChoice kGatherTwoTilesBlockN[] = {{128, 1.0, 1.0}, {64, 0.6, 0.6}};

// Whether the n-tile choice may count on split-K (the plan then splits by sm90_split): the 2:4 and 8-bit kernels
// with B col-major build it for n-tiles up to kMaxSplitBlockN, the V:N:M row gather for n-tiles of 64 (its narrowest),
// where no schedule or split was pinned.
enum class SplitK : bool { off, by_shape };
inline constexpr int kMaxSplitBlockN = 64;

// The width whose waves of tiles finish soonest. A tile costs the larger of its math (at its width's one-wave or
// multi-wave rate) and its k-tile rounds (the pipeline's per-round floor, which binds narrow tiles), split-K dividing
// that among its CTAs; the whole product costs at least reading the weight. Ties go to the narrowest width that covers
// C. k_tile: the elements of K a pipeline round moves (64 for 16-bit, 128 for 8-bit codes).
int sm90_block_n(int64_t rows, int64_t cols, int64_t n, int sm_count, std::span<const BlockNChoice> choices,
                 SplitK split_k = SplitK::off, int k_tile = 64);

// Row tiles per raster group of the 2:4 kernel: a wave then reuses ~16 row tiles of A and ~8 column tiles of B
// from L2 instead of streaming A from HBM per column tile.
inline constexpr int kSm90GroupRows = 16;
// The raster group of the gathering kernel (K' = cols condensed columns): every row block reads its own rows of
// B, so taller groups keep more of B in L2, as long as the group's rows of A fit in half of it.
int sm90_gather_group_rows(int64_t cols, int64_t l2_bytes);

// The sm90 schedule for `tiles` CTA tiles of width block_n. `final_in_registers`: the epilogue can be completed in
// registers (16-bit D, beta 0, no GELU, D's stride a multiple of 8). Staged unless the register epilogue can run;
// persistent where there are more tiles than SMs.
Sm90Schedule sm90_schedule(int64_t tiles, int block_n, bool final_in_registers, int sm_count);

// Split-K for grids under a wave: CTAs per tile (a cluster, each a share of the k_tiles) so that `tiles` tiles fill
// more of the SMs; 1 where the tiles already take half of them, and never below kMinSplitKTiles k-tiles per CTA.
// Clusters of 2, or the largest of 4 and 8 whose CTAs all fit in half the SMs (on 132 SMs: 8 up to 8 row tiles, 4
// up to 16): at 8 and 16 row tiles clusters of 4 took 0.71-0.95 of the time of clusters of 2, at 8 row tiles
// clusters of 8 0.69-0.85 (H100, small_grid_variants.txt); where they took more than half the SMs, clusters of 4
// (32 row tiles) ran no faster than no split and clusters of 8 (16 row tiles) lost 27-38 % to clusters of 2.
inline constexpr int kMaxClusterCtas = 8;  // the portable cluster size: the largest split-K of any Hopper kernel
inline constexpr int kMaxAutoSplit = 8;
inline constexpr int kMinSplitKTiles = 4;
// And only where the split saves more k-tile rounds (k_tiles x (1 - 1/split)) than its fixed cost, the cluster's
// launch, the partial sums through distributed shared memory and two cluster syncs: about 3 us, 13 rounds of
// ~0.23 us. At K = 768 (12 k-tiles) no split took 0.80-0.93 of the time of splits of 2 and 3; at 64 and 128
// k-tiles splits of 8 took 0.54 and 0.31 of no split's (H100, small_grid_variants.txt).
inline constexpr double kSplitCostKTiles = 13.0;
int sm90_split(int64_t tiles, int64_t k_tiles, int sm_count);

// The skinny kernel (sm80_mma_sp_skinny): its column tile is the narrowest of 8 and 16 that covers C, 16 beyond
// (H100, 768x768 and 1024x1024, B staged in chunks: at C = 64 16 took 0.82-0.84 of the sm90 kernel's time, 32
// 1.13-1.22; B by pairs: at C = 32 8 and 16 0.85-0.86, 32 1.04; at C = 64 16 0.98-1.04, 8 1.12-1.15, 64
// 1.46-1.54). A CTA takes 32 rows, two slabs sharing every B fragment (half of B's reads from L2), where the grid of
// 32-row CTAs still has one for every two SMs; else 16, for twice the CTAs (H100: at 3072 and 8192 rows 32-row CTAs
// took 0.84-0.96 of the time of 16-row ones, at 768 and 1024 rows either was within 4 %).
inline constexpr int kSkinnyWarps = 8;    // a CTA's warps, which split its K
inline constexpr int kSkinnyMmaCols = 8;  // columns of one mma.sp m16n8k32
int skinny_block_n(int64_t n);
// k-blocks a skinny warp loads before it multiplies them: four, or two where a CTA's 16 x 8 tiles (slabs x column
// tiles) number 8 or more and the B registers of four would spill.
constexpr int skinny_batch(int slabs, int tiles_n) { return slabs * tiles_n >= 8 ? 2 : 4; }
// The skinny kernel's split-K: the fewest CTAs (up to a cluster of 8) over which each warp's k-blocks of K = cols
// fit one batch of loads, a CTA's time being one round trip of its loads per batch.
int skinny_split(int64_t cols, int block_m, int block_n);
int skinny_block_m(int64_t rows, int64_t n, int sm_count);
// Where an automatic plan takes the skinny kernel on Hopper: its CTA's time is one round trip of its loads only
// while every warp loads its k-blocks in one batch, and it pays where the sm90 kernel's tiles leave most SMs idle.
// - Unsplit, K up to 8 warps x 4 k-blocks x 32 = 1024, C up to 64, R x C up to 1024 x 64: it took 0.77-0.95 of
//   the sm90 kernel's time at C = 1 and 16 (768x768, 1024x1024, 3072x768; 4096x1024 and 8192x1024 at C = 1), 0.85
//   at C = 32 and 0.82-0.84 at C = 64 (768x768, 1024x1024); at C = 128 0.99-1.00, C = 256 1.27-1.42, 8192x1024x16
//   1.28, 3072x768 at C = 32 and 64 1.14-1.27 (B by pairs at C <= 32, by chunks at C = 64).
// - Split over a cluster (K up to 8 x 1024), weights up to 4096 x 1024 and R x C up to 2048: 0.81-0.93 at
//   768x3072x1, 1024x4096x1 and 128x8192 (C = 1, 16); 768x3072x16 1.01, 1024x4096x16 1.35, 1280x8192x1 1.20, and
//   1.3-3.1 on the 4096-row and larger weights, whose HBM stream the sm90 kernel keeps fuller (H100).
inline constexpr int64_t kSkinnyMaxK = 1024;
inline constexpr int64_t kSkinnyMaxTokens = 64;
inline constexpr int64_t kSkinnyMaxOutputs = 1024 * 64;
inline constexpr int64_t kSkinnySplitMaxK = kMaxClusterCtas * kSkinnyMaxK;
inline constexpr int64_t kSkinnySplitMaxWeights = 4096 * 1024;
inline constexpr int64_t kSkinnySplitMaxOutputs = 2048;
bool skinny_takes(int64_t rows, int64_t cols, int64_t n);
// The skinny kernel's rules count 16-bit k-blocks of 32 values: a k-block of 64 8-bit codes is the same 64 bytes of
// B, so K codes count as the 16-bit K of as many k-blocks (and as many packed weight bytes).
constexpr int64_t skinny_cols_of_8bit(int64_t cols) { return (cols + 1) / 2; }
// Where an automatic 8-bit plan takes the skinny kernel: the 16-bit rule over skinny_cols_of_8bit.
bool skinny_takes_8bit(int64_t rows, int64_t cols, int64_t n);
// Where an automatic V:N:M plan takes the skinny kernel, which gathers B's elements through the table while it stages
// them (any B layout, x read in place), over the condensed R x K' weight (condensed_cols = K'); H100, f16, 128:2:8
// unless said, ms. B col-major: at C <= 16 always, the sm90 kernel's element gather being slower on every weight
// (4096 x 2048 at C = 1 / 8 / 16 0.012 / 0.013 / 0.023 against 0.049-0.057; 11008 x 2048 0.027-0.060 against
// 0.050-0.061; 4096 x 5504 0.036-0.086 against 0.125-0.146). B row-major: against the row gather at C = 8 (x^T's
// rows are padded to 8 tokens, and a layer transposes x for it), only on small condensed weights: 4096 x 2048 at
// C = 1 / 8 0.012 / 0.013 against 0.016, at C = 16 0.023; 4096 x 1024 (2:16) at C = 1 / 16 0.009 / 0.012 against
// 0.014; 1024 x 2048 0.011-0.013 against 0.010; 768 x 384 0.006-0.007 against 0.008; but 11008 x 2048 and
// 4096 x 5504 0.027-0.039 against 0.021-0.028 (the row gather's pipeline keeps a large weight's HBM stream
// fuller, as the 2:4 rule finds).
inline constexpr int64_t kVnmSkinnyMaxTokens = 16;
inline constexpr int64_t kVnmSkinnyMaxWeights = 4096 * 1024;        // B row-major: R x K' up to kVnmSkinnyMaxTokens
inline constexpr int64_t kVnmSkinnyNarrowTokens = 8;                // one column tile: its staging holds fewer
inline constexpr int64_t kVnmSkinnyMaxNarrowWeights = 4096 * 2048;  // B row-major: up to kVnmSkinnyNarrowTokens
inline constexpr int kSkinnyMaxGatheredBlockN = 16;                 // the gathering staging's widest column tile
inline constexpr int kSkinnyMax8BitBlockN = 16;  // 8-bit codes: the column tiles skinny_block_n picks, no wider
bool vnm_skinny_takes(int64_t rows, int64_t condensed_cols, int64_t n, bool b_col_major);

}  // namespace nmkit::gpu::nm24
