#pragma once
// Tile-sparse SpMM on the GPU (seed 003): D = act(alpha * A * B + beta * C + bias), A stored as dense tiles.
//
//   PackedTiles p = pack_tiles(compress_tiles(w, mask, 64, 64));   // once per weight, host side
//   DeviceTiles a = DeviceTiles::upload(p);                        // once per weight
//   TileSpmmPlan plan = TileSpmmPlan::create(desc, 64, 64);        // once per shape
//   plan.run(stream, a, b, c, d, bias);                            // one launch: no allocation, search or sync
//
// The logical format stores tiles by tile column (CSC); a CTA computes a tile row, so pack_tiles reorders them
// by tile row (CSR of tiles), each tile still row-major and contiguous. Byte layout: docs/formats.md.
#include <cstdint>
#include <memory>
#include <vector>

#include "nmkit/format/tile.hpp"
#include "nmkit/gpu/device_buffer.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {

// Tile sides the kernels run: 16, 32, 64 or 128 (whole 16 x 16 MMA steps), rows and columns chosen separately.
inline constexpr int kTileSideUnit = 16;
inline constexpr int kMaxKernelTileSide = 128;
inline constexpr int kTileBlockRows = 128;  // rows of D per CTA of the Hopper kernel
bool tile_kernel_supports(int tile_rows, int tile_cols) noexcept;

struct PackedTiles {
  int64_t rows = 0, cols = 0;  // logical R, K
  int tile_rows = 64, tile_cols = 64;
  DType dtype = DType::f16;
  std::vector<int32_t> row_ptr;    // (grid_rows + 1): tile row i owns tiles [row_ptr[i], row_ptr[i+1])
  std::vector<int32_t> col_index;  // (nnz_tiles): tile-column index, strictly ascending within a tile row
  std::vector<uint16_t> data;      // (nnz_tiles, tile_rows, tile_cols) 16-bit values, each tile row-major
  int64_t grid_rows() const noexcept { return ceil_div(rows, tile_rows); }
  int64_t grid_cols() const noexcept { return ceil_div(cols, tile_cols); }
  int64_t nnz_tiles() const noexcept { return static_cast<int64_t>(col_index.size()); }
};

// Validates the tile matrix (ptr monotone and complete, indices in range and ascending, zero padding) and
// reorders it by tile row. Throws Error naming what is wrong; unsupported for f32 values or tile sides the
// kernels do not run.
PackedTiles pack_tiles(const TileMatrix& a);
TileMatrix unpack_tiles(const PackedTiles& p);  // the inverse (tests, inspection)
// Throws Error unless row_ptr, col_index and data are consistent with the shape (what upload checks).
void check_packed_tiles(const PackedTiles& p);
// The rows of a CSR-style `ptr` (row i owns [ptr[i], ptr[i+1])) by descending length (ties: ascending row): the
// kernels start the longest rows first, so that a skewed pattern's long rows do not run alone at the end of the
// grid.
std::vector<int32_t> tile_rows_longest_first(const std::vector<int32_t>& row_ptr);
// The tile row of each stored tile of a CSR-style `ptr` (DeviceTiles::tile_row, for the stream kernel).
std::vector<int32_t> tile_row_of_tiles(const std::vector<int32_t>& row_ptr);

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
// Empty (the kernel then cuts the chunks evenly over its CTAs) where there are no chunks or more than fit 32-bit
// indices.
WarpStreamSchedule warp_stream_schedule(const std::vector<int32_t>& row_ptr, int chunks_per_tile, int64_t target_ctas,
                                        int64_t max_ctas);

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

class DeviceTiles {
 public:
  // Checks the packed arrays' consistency (sizes, row_ptr, col_index) before uploading.
  static DeviceTiles upload(const PackedTiles& packed);
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int tile_rows() const noexcept { return tile_rows_; }
  int tile_cols() const noexcept { return tile_cols_; }
  int64_t nnz_tiles() const noexcept { return nnz_tiles_; }
  DType dtype() const noexcept { return dtype_; }
  const int32_t* row_ptr() const noexcept { return static_cast<const int32_t*>(row_ptr_.data()); }
  const int32_t* col_index() const noexcept { return static_cast<const int32_t*>(col_index_.data()); }
  const int32_t* row_order() const noexcept { return static_cast<const int32_t*>(row_order_.data()); }
  // (nnz_tiles): the tile row of each stored tile, so that the stream kernel finds its tiles' rows without a search.
  const int32_t* tile_row() const noexcept { return static_cast<const int32_t*>(tile_row_.data()); }
  // tile_block_schedule's arrays (empty buffers unless both tile sides are 64 or 128).
  const int32_t* schedule_block() const noexcept { return static_cast<const int32_t*>(schedule_block_.data()); }
  const int32_t* schedule_block_groups() const noexcept {
    return static_cast<const int32_t*>(schedule_block_groups_.data());
  }
  const int32_t* schedule_step_ptr() const noexcept { return static_cast<const int32_t*>(schedule_step_ptr_.data()); }
  const TileStep* schedule_steps() const noexcept { return static_cast<const TileStep*>(schedule_steps_.data()); }
  bool schedule_balanced() const noexcept { return schedule_balanced_; }  // TileBlockSchedule::balanced
  // The warp-stream schedule for the current device's CTA count, as its warps' records (warp_stream_leads; tile
  // rows of 32 only; 0 CTAs and a null pointer otherwise, or where the schedule is empty).
  int64_t warp_stream_ctas() const noexcept { return warp_stream_ctas_; }
  int64_t warp_stream_rows_cut() const noexcept { return warp_stream_rows_cut_; }  // rows that several CTAs hold
  const WarpStreamLead* warp_stream_leads() const noexcept {
    return warp_stream_ctas_ ? static_cast<const WarpStreamLead*>(warp_stream_leads_.data()) : nullptr;
  }
  // widen_tiles' copy on the device, for the Hopper kernel: uploaded beside the weight when a tile side is below
  // 64 and the current device runs the sm90 kernel; null otherwise.
  const DeviceTiles* widened() const noexcept { return widened_.get(); }
  // split_tile_rows' copy in tiles 32 rows high (with its warp-stream schedule), for the warp-stream kernel:
  // uploaded beside a weight of tiles 64 or 128 rows high and 32, 64 or 128 columns when the current device fits
  // that kernel (twice the weight's device memory); null otherwise.
  const DeviceTiles* split_rows() const noexcept { return split_rows_.get(); }
  const void* data() const noexcept { return data_.data(); }

 private:
  DeviceTiles() = default;
  static DeviceTiles upload_arrays(const PackedTiles& packed);  // the arrays and schedules, without the copies
  DeviceBuffer row_ptr_, col_index_, data_, row_order_, tile_row_;
  DeviceBuffer schedule_block_, schedule_block_groups_, schedule_step_ptr_, schedule_steps_;
  bool schedule_balanced_ = false;
  DeviceBuffer warp_stream_leads_;
  int64_t warp_stream_ctas_ = 0, warp_stream_rows_cut_ = 0;
  std::shared_ptr<const DeviceTiles> widened_, split_rows_;
  int64_t rows_ = 0, cols_ = 0, nnz_tiles_ = 0;
  int tile_rows_ = 0, tile_cols_ = 0;
  DType dtype_ = DType::f16;
};

// sm90_wgmma: TMA-staged wgmma on each stored tile (B col-major, K % 8 == 0, an sm_90 device; tile sides of 64
// or 128 natively, 16 and 32 through the weight's widened copy), with split-K across a cluster for small grids;
// sm80_mma: mma.sync, every tile shape and layout, a CTA per tile row and 128 tokens;
// stream_mma: mma.sync, every tile shape and layout, for few tokens: the stored tiles split evenly over a grid that
// fills the GPU, 32 tokens per CTA, rows that CTAs share summed through the plan's workspace;
// warp_stream_mma: mma.sync for few tokens on tiles 32 rows high (32, 64 or 128 columns; tiles 64 or 128 rows high
// through the weight's split copy, DeviceTiles::split_rows), every layout: the stored tiles' 32-column chunks split
// over the CTAs of a grid that fills the GPU (whole tile rows per CTA by the weight's WarpStreamSchedule, else evenly)
// and evenly over each CTA's warps, each streaming its chunks through a ring of its own in shared memory, 32 tokens per
// warp, rows that warps share summed in shared memory, rows that CTAs share through the plan's workspace; it needs 166
// KiB of shared memory per CTA (H100, H200; not A100: plans refuse it there). `automatic` takes sm90_wgmma where it
// applies, else stream_mma for C <= kStreamMaxTokens, else sm80_mma; where it takes sm90_wgmma for tiles 32, 64 or 128
// rows high (32, 64 or 128 columns) and C <= 32, a weight that has a warp-stream schedule (DeviceTiles::upload makes
// one, for taller tiles on their split copy, where the device fits the kernel) runs warp_stream_mma instead, which is
// faster there on every weight (TileSpmmPlan::kernel_for).
enum class TileKernel : uint8_t { automatic, sm80_mma, sm90_wgmma, stream_mma, warp_stream_mma };
inline constexpr int64_t kStreamMaxTokens = 32;
inline constexpr int kMaxStreamCtas = 1 << 20;
const char* kernel_name(TileKernel k) noexcept;

// The sm90 kernel's launch: a CTA computes 128 rows of D for block_n tokens (32, 64, 128 or 256; 0 = by C); `split`
// CTAs of a cluster share its tile columns (1..8; 0 = by grid size); `persistent` runs one CTA per SM (two at
// block_n <= 64) over the work units (striding where the weight's blocks are balanced, else claiming the next
// unit from a device counter), false one CTA per unit (ignored when split > 1); persistent is the default because
// its producer streams the next unit's steps while the last unit's outputs are stored.
// `deferred_store`: where D is f16/bf16 and final in registers (beta == 0, activation none or relu), split == 1,
// block_n >= 64 and D's stride a multiple of 8 elements (and, at run time, D 16-byte aligned), the consumers stage
// each unit's outputs (64 tokens at a time, two buffers in turn) and one producer lane has them stored by TMA
// while the next unit runs; false keeps the chunked epilogue on the consumers' critical path (an ablation).
// `timeline` (diagnosis, sm90 kernel only; null in normal use): a device buffer of grid x TileTimeline::kWords
// words where each CTA records SM clock cycles at the points below (nmkit_bench --tile-timeline reads it).
// `stream_ctas` (stream and warp-stream kernels): CTAs per 32-token block, each (each warp) taking an equal range
// of the stored tiles (0: as many as the device holds at once, at most one per stored tile, or two 32-column chunks
// per warp; the warp-stream kernel then takes the weight's schedule, if it has one).
// `overlap_launch` (warp-stream kernel, sm_90 devices, any stream but the legacy default one): launched with
// programmatic dependent launch, so that in a stream of dependent products (the layers of a model) its CTAs start
// and load their share of the weight while the kernel before it finishes, and wait for it before they read B or
// C or write anything. So the kernel launched just before run() on the stream must not write the weight (nmkit's
// uploads are copies, not kernels). The environment variable NMKIT_OVERLAP_LAUNCH=0|1, where set, overrides it.
struct TileLaunch {
  int block_n = 0;
  int split = 0;
  bool persistent = true;
  bool deferred_store = true;
  uint64_t* timeline = nullptr;
  int stream_ctas = 0;
  bool overlap_launch = true;
};

// One CTA's words of a TileLaunch::timeline: clock64() values (globaltimer ns for kStartNs); slots past what a
// CTA reached stay as the caller filled them.
struct TileTimeline {
  static constexpr int kSteps = 128;                   // pipeline steps recorded, counted over all of the CTA's units
  static constexpr int kUnits = 32;                    // work units recorded
  static constexpr int kStartNs = 0;                   // %globaltimer when the CTA started
  static constexpr int kStart = 1;                     // clock64 when the CTA started
  static constexpr int kPosted = 2;                    // [kSteps] the producer issued the step's copies
  static constexpr int kArrived = kPosted + kSteps;    // [kSteps] consumer warpgroup 0 saw the step's data land
  static constexpr int kUnitDone = kArrived + kSteps;  // [kUnits] consumer warpgroup 0 wrote the unit's rows
  static constexpr int kIssued = kUnitDone + kUnits;   // [kSteps] the producer issued the step's last copy
  static constexpr int kEndNs = kIssued + kSteps;      // %globaltimer when the CTA's last write was done
  static constexpr int kMathDone = kEndNs + 1;         // [kUnits] consumer warpgroup 0's last wgmma of the unit done
  static constexpr int kFirstPartStaged = kMathDone + kUnits;  // [kUnits] ... and the unit's first output part staged
  static constexpr int kEnd = kFirstPartStaged + kUnits;       // clock64 when kEndNs was taken
  static constexpr int kWords = kEnd + 1;
};

// What a TileLaunch::timeline recorded, averaged over the CTAs (0 where nothing was recorded). Cycles become
// microseconds at each CTA's own clock, measured over its life (the global timer against clock64 between its start
// and its end), where it recorded both; at `us_per_cycle` otherwise. Under load the SMs hold well below their
// nominal clock (H200: ~1.6 GHz against 1.98), so the nominal one understates every time by as much. A unit
// counts only if its end-of-unit step is among the recorded steps: where the record ran out
// inside a unit, its epilogue would be measured from a mid-unit step.
struct TileTimelineSummary {
  int64_t ctas = 0;                              // CTAs that recorded a start
  int64_t units_counted = 0;                     // units whose main loop and epilogue are in the means below
  double start_spread_us = 0;                    // the last CTA start after the first (global timer)
  double units_per_cta = 0, steps_per_unit = 0;  // steps: those with data
  double prologue_us = 0;                        // CTA start -> its first post
  double copy_latency_us = 0;                    // a step posted -> its data landed for consumer warpgroup 0
  double copy_issue_us = 0;                      // a step posted -> its last copy issued
  double post_gap_us = 0;                        // a step's last copy issued -> the next step posted
  double step_us = 0;                            // between two steps of a unit landing
  double main_loop_us = 0;                       // a unit's first step landed -> its end-of-unit step
  double epilogue_us = 0;                        // the end-of-unit step -> the unit written (or staged)
  double math_drain_us = 0;                      // the end-of-unit step -> the unit's last wgmma done
  double first_part_us = 0;                      // the last wgmma done -> the first part staged (deferred store)
  double other_parts_us = 0;                     // the first part staged -> the unit staged
  double next_unit_wait_us = 0;                  // the unit written -> the next unit's first step landed
  double end_first_us = 0, end_mean_us = 0, end_last_us = 0;  // CTA ends after the first start (global timer)
  double clock_ghz = 0;                                       // the SMs' clock over the CTAs' lives, where measured
};
// `words`: grid x TileTimeline::kWords, as the launch left them (zero-filled before it).
TileTimelineSummary summarize_tile_timeline(const std::vector<uint64_t>& words, double us_per_cycle);

class TileSpmmPlan {
 public:
  // Validates the description, the tile shape and the kernel's requirements, and fixes the launch configuration
  // (TileLaunch: chosen by shape unless forced).
  static TileSpmmPlan create(const SpmmDesc& desc, int tile_rows, int tile_cols,
                             TileKernel kernel = TileKernel::automatic, const TileLaunch& launch = {});
  // Same contract as Nm24SpmmPlan::run; the weight must match the plan's shape, dtype and tile shape.
  // A plan of the stream kernel owns a workspace (partial sums and counters; workspace_bytes()), which its copies
  // share: its runs must not overlap in time, so run it on one stream, or make one plan per concurrent stream.
  void run(Stream stream, const DeviceTiles& a, const void* b, const void* c, void* d,
           const float* bias = nullptr) const;

  const SpmmDesc& desc() const noexcept { return desc_; }
  TileKernel kernel() const noexcept { return kernel_; }
  // The kernel that run() launches for weight `a`: kernel(), or warp_stream_mma where `automatic` left the choice to
  // the weight (above).
  TileKernel kernel_for(const DeviceTiles& a) const noexcept;
  int tile_rows() const noexcept { return tile_rows_; }
  int tile_cols() const noexcept { return tile_cols_; }
  // The sm90 kernel's tokens per CTA and split-K factor (CTAs of a cluster sharing a tile row's columns).
  int block_n() const noexcept { return block_n_; }
  int split() const noexcept { return split_; }
  bool persistent() const noexcept { return persistent_; }
  // Whether the sm90 kernel stores D by the deferred path (TileLaunch::deferred_store, where it applies).
  bool deferred_store() const noexcept { return deferred_store_; }
  uint64_t* timeline() const noexcept { return timeline_; }
  // Whether the warp-stream kernel is launched overlapping the kernel before it (TileLaunch::overlap_launch, or the
  // environment's override, on an sm_90 device); run() still launches it plainly on the legacy default stream.
  bool overlap_launch() const noexcept { return overlap_launch_; }
  // The stream kernels' CTAs per 32-token block for weight `a` (what run() launches): the weight's warp-stream
  // schedule where the warp-stream kernel takes it, else by its stored tiles.
  int64_t stream_ctas(const DeviceTiles& a) const;
  std::size_t workspace_bytes() const noexcept { return workspace_ ? workspace_->size() : 0; }

 private:
  SpmmDesc desc_;
  TileKernel kernel_ = TileKernel::sm80_mma;
  int tile_rows_ = 0, tile_cols_ = 0;
  int block_n_ = 0, split_ = 1;
  bool persistent_ = false;
  bool deferred_store_ = false;
  uint64_t* timeline_ = nullptr;
  bool overlap_launch_ = false;
  // The stream kernel the workspace serves (automatic: none). A Hopper plan with a warp-stream workspace is one that
  // `automatic` left to the weight: warp_stream_mma for weights with a warp-stream schedule (kernel_for).
  TileKernel stream_kernel_ = TileKernel::automatic;
  int stream_max_ctas_ = 0;  // the stream kernels: CTAs resident at once, or TileLaunch::stream_ctas
  bool stream_forced_ = false;
  std::shared_ptr<const DeviceBuffer> workspace_;  // the stream kernels: partial tile rows, then the row counters
  std::size_t partial_floats() const;              // the workspace's partial tile rows
  bool takes_warp_stream_schedule(const DeviceTiles& a) const noexcept;
};

}  // namespace nmkit::gpu
