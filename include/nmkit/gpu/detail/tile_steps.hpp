#pragma once
// The packed-tile kernels' precomputed work lists, as DeviceTiles holds them: the Hopper kernel's block steps
// (TileStep, TileBlockSchedule) and the warp-stream kernel's CTA ranges and warp records (WarpStreamSchedule,
// WarpStreamLead). Made by detail/tile_schedule.hpp's builders at upload. Not part of the public API.
#include <cstdint>
#include <vector>

namespace nmkit::gpu {

// The Hopper kernel's work list, built once at upload so that its producer walks no lists per step. A 128-row
// block (kTileBlockRows: one 128-row tile row or two 64-row ones) computes one step per tile column that any of
// its rows stores, in ascending column order; a step names the stored tile that feeds each consumer warpgroup
// (the block's first and second 64 rows). Each step costs a slab of x whether one or both rows use it, so the two
// 64-row tile rows of a block are not neighbours but pairs that share many tile columns (pair_tile_rows). Byte
// layout: docs/formats.md.
struct TileStep {
  int32_t column;   // tile column
  int32_t tile[2];  // packed tile index for rows 0-63 / 64-127, -1 where that tile row stores none; a 128-row
                    // tile feeds both halves and is named twice
  int32_t mask;     // bit w: consumer warpgroup w has a tile in this step
  bool operator==(const TileStep&) const = default;
};
static_assert(sizeof(TileStep) == 16, "one 16-byte load per step");
struct TileBlockSchedule {
  // (2 x blocks): the 64-row groups of D (rows 64 g .. 64 g + 63) that the block's first and second 64 rows are;
  // a group >= ceil(R / 64) (a block of one 64-row tile row) stands for no rows
  std::vector<int32_t> block_groups;
  std::vector<int32_t> block;     // (blocks): the 128-row block at position i, most steps first
  std::vector<int32_t> step_ptr;  // (blocks + 1): position i owns steps [step_ptr[i], step_ptr[i + 1])
  std::vector<TileStep> steps;

  // No block has more than kBalancedStepRatio times the mean number of steps. The Hopper kernel then hands out
  // work units token block by token block, so that the CTAs running at once share x slabs in L2; otherwise the
  // longest blocks of all token blocks first, so that skewed rows do not start last (token block order gained
  // 5-11 % on the benchmark's uniform patterns, whose ratio stays under 1.3, and lost 5-15 % on its skewed ones,
  // 1.4 and above).
  static constexpr double kBalancedStepRatio = 1.35;
  bool balanced() const noexcept;
};

// The warp-stream kernel's CTA ranges over a weight's 32-column chunks (tile rows of 32, CSR order), made at upload.
// A range costs its chunks plus kCutCost where it starts or ends inside a tile row: such a row is summed through
// the workspace at the kernel's end (its parts stored, a fence, an arrival, the parts loaded), a whole row is
// not. The ranges are contiguous, at most max_ctas of them, and their largest cost is the least that allows that,
// but never below (1 + kRowSlack) times the even share of target_ctas (chunks / target_ctas): at that bound the
// ranges take whole rows wherever the CTAs left allow, and rows are cut only where they must be (a row longer
// than the bound, or uneven rows that whole-row ranges would spread over more than max_ctas CTAs). A range that
// ends inside a row holds at least kMinCutChunks chunks, so that a row is not cut into many small parts. 4096^2 at
// C = 32, 32x32 tiles, density 0.5: 17 us with one tile row per CTA against 22 us with the chunks cut evenly.
// Byte layout: docs/formats.md.
struct WarpStreamSchedule {
  static constexpr double kRowSlack = 0.25;
  static constexpr int64_t kCutCost = 24;       // chunks: a cut row's sum, ~1.4 us at ~0.06 us per chunk
  static constexpr int64_t kMinCutChunks = 16;  // two per warp
  std::vector<int32_t> cta_begin;               // (ctas + 1): CTA i takes chunks [cta_begin[i], cta_begin[i + 1])
  // (2 x tile rows): for a tile row that several CTAs hold, {2 x its first CTA + 1 if that CTA's range starts
  // before the row, its last CTA}; {-1, -1} for a row that one CTA holds or that stores no tile
  std::vector<int32_t> row_ctas;
  int64_t ctas() const noexcept { return cta_begin.empty() ? 0 : static_cast<int64_t>(cta_begin.size()) - 1; }
};

// What a warp of the warp-stream kernel needs before its first copies, for a weight's schedule: one 64-byte record
// per warp, so that its prologue is one load rather than a chain of them (its CTA's range start, then its tiles'
// columns, then the rows at its range's ends). Byte layout: docs/formats.md.
struct WarpStreamLead {
  static constexpr int kWarpsPerCta = 8;  // the kernel's warps per CTA
  static constexpr int kChunks = 3;       // the kernel's chunks in flight per warp (its ring's stages)
  int32_t begin, end;  // the warp's chunks [begin, end): an even share of its CTA's range (begin = end: none)
  int32_t ends_cta;    // 1 where end is its CTA's end (the CTA's last warp with chunks), else 0
  int32_t before_row, after_row,
      last_row;  // tile rows of the chunks just before and after the range and of its last (-1: none)
  int32_t first_row_ctas[2], last_row_ctas[2];  // the schedule's row_ctas pairs of the range's first and last rows
  int32_t column[kChunks], row[kChunks];  // tile column and tile row of the range's first chunks (0, -1 past its end)
};
static_assert(sizeof(WarpStreamLead) == 64, "one 64-byte record per warp");

}  // namespace nmkit::gpu
