#pragma once
// Launch parameters of the tile-sparse kernels. The epilogue fields carry the names of nm24::Params, so the
// nm24 epilogue (nm24_common.cuh) serves both.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "nmkit/gpu/detail/tile_heuristics.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit::gpu {
struct WarpStreamLead;  // nmkit/gpu/detail/tile_steps.hpp
}  // namespace nmkit::gpu

namespace nmkit::gpu::tile {

struct TileParams {
  const int32_t* row_ptr;    // (grid_rows + 1)
  const int32_t* col_index;  // (nnz_tiles)
  const int32_t* tile_row;   // (nnz_tiles): the tile row of each stored tile (the stream kernel)
  const int32_t* row_order;  // (grid_rows): tile rows, longest first; CTA i computes row row_order[i / column tiles]
  // The sm90 kernel's work list (tile_block_schedule): blocks longest first, their step ranges, the steps
  // (TileStep as {column, tile[0], tile[1], mask}).
  const int32_t* schedule_block;
  const int32_t* schedule_block_groups;  // (2 x blocks): the 64-row groups of D of each block's two halves
  const int32_t* schedule_step_ptr;
  const int4* schedule_steps;
  const uint16_t* tiles;     // (nnz_tiles, tile_rows, tile_cols), row-major 16-bit values
  const void* b;             // K x C, ldb = K (col-major) or C (row-major)
  const void* c;             // R x C in D's layout, read when beta != 0
  void* d;                   // R x C
  const float* bias;         // R, or null
  int64_t rows, cols, n;     // R, K, C
  int64_t nnz_tiles;         // stored tiles
  int tile_rows, tile_cols;  // 16, 32, 64 or 128
  float alpha, beta;
  Activation activation;
  bool d_col_major;
  bool b_col_major;
  bool b_vector;              // B's leading dimension and address allow 16-byte copies
  bool units_by_token_block;  // sm90: work units in token-block-major order (DeviceTiles::schedule_balanced)
  // sm90, persistent: {units claimed, CTAs retired} of this launch (a slot of unit_claim_pool), zero at launch;
  // null: each CTA takes every gridDim-th unit.
  int32_t* unit_claims;
};

// The tile row and first column of D of CTA `block` in a 1-D grid of grid_rows x column_tiles CTAs: every column
// tile of the longest row first, then the next row's.
struct TileWork {
  int64_t tile_row, n0;
};
__device__ __forceinline__ TileWork tile_work(const TileParams& p, int64_t block, int block_n) {
  const int64_t column_tiles = (p.n + block_n - 1) / block_n;
  return {p.row_order[block / column_tiles], (block % column_tiles) * block_n};
}
inline int64_t tile_grid_size(const TileParams& p, int tile_rows, int block_n) {
  return ceil_div(p.rows, int64_t{tile_rows}) * ceil_div(p.n, int64_t{block_n});
}

// `items` cut into `parts` ranges of equal length (+-1): part i takes [begin(i), begin(i + 1)); with parts <= items
// none is empty. The stream kernels' CTAs or warps over the stored tiles.
struct EvenSplit {
  int64_t items, parts;
  __device__ int64_t begin(int64_t part) const { return part * items / parts; }
  __device__ int64_t part_of(int64_t item) const {
    return ((item + 1) * parts - 1) / items;
  }  // max i: begin(i) <= item
};

// The stream kernel (stream_tile_spmm.cu) for few tokens: the stored tiles split evenly over `ctas` CTAs per
// block of kStreamBlockN tokens; rows shared between CTAs are summed through the workspace.
inline constexpr int kStreamBlockN = 32;
struct StreamWork {
  float* partials;    // stream_partial_floats: (token blocks, ctas, 2) partial tile rows of tile_rows x kStreamBlockN
  int32_t* arrivals;  // (token blocks, grid rows): parts counted per shared tile row; zero between launches
  int ctas;           // CTAs per token block: stream_ctas
  // The warp-stream kernel: the weight's WarpStreamSchedule as its warps' records (ctas x 8 WarpStreamLead), or
  // null for ranges of equal length.
  const WarpStreamLead* leads = nullptr;
};
int stream_max_ctas(int tile_rows, int tile_cols);  // CTAs resident on the current device at once
std::size_t stream_partial_floats(int tile_rows, int64_t max_ctas, int64_t n);
template <class Element, class Out>
void launch_stream(const TileParams& p, const StreamWork& w, cudaStream_t stream);

// The warp-stream kernel (warp_stream_tile_spmm.cu) for few tokens and tiles 32 rows high by 32, 64 or 128 columns
// (taller tiles through the weight's split copy): the stored tiles' 32-column chunks split over `ctas` CTAs per
// token block (by the weight's schedule, or evenly) and evenly over each CTA's warps, each warp streaming its chunks
// through a ring of its own in shared memory; its workspace is the stream kernel's with tile rows of 32 (a slot pair
// per CTA).
bool warp_stream_fits_device();  // the current device gives a CTA the kernel's shared memory (H100/H200: yes; A100: no)
int warp_stream_max_ctas();      // CTAs resident on the current device at once; unsupported where it does not fit
std::size_t warp_stream_partial_floats(int64_t max_ctas, int64_t n);
// overlap: launched with programmatic dependent launch (TileLaunch::overlap_launch).
template <class Element, class Out>
void launch_warp_stream(const TileParams& p, const StreamWork& w, cudaStream_t stream, bool overlap);

// The portable kernel (sm80_tile_spmm.cu): tile_rows 16, 32, 64 or 128.
template <class Element, class Out>
void launch_sm80(const TileParams& p, int tile_rows, cudaStream_t stream);
// The Hopper kernel (sm90_tile_spmm.cu): tile rows and columns 64 or 128, B col-major with K % 8 == 0 and a
// 16-byte aligned base (TMA). A CTA computes 128 rows x block_n tokens; `split` CTAs of a cluster share its K.
// The product launches the kernel without instrumentation; launch_sm90_timeline, the one that records a timeline
// (`timeline`: TileTimeline::kWords per CTA), for f16 only.
template <class Element, class Out>
void launch_sm90(const TileParams& p, const Sm90TileConfig& config, cudaStream_t stream);
void launch_sm90_timeline(const TileParams& p, const Sm90TileConfig& config, uint64_t* timeline, cudaStream_t stream);
// The cluster-wave CTAs of the current device at block_n 32 or 64 (tile_heuristics.hpp), asked once per block_n.
ClusterWaveCtas cluster_wave_ctas(int block_n);
// Persistent sm90 CTAs claim work units from a pair of device counters, {units claimed, CTAs retired}; the last
// CTA of a launch zeroes them again, so no launch needs a memset first. The current device's pool of
// kUnitClaimSlots pairs, allocated (and zeroed) on the first call: plans call it at creation, so that no
// allocation happens at run time (inside a stream capture, say).
inline constexpr int kUnitClaimSlots = 1024;
inline constexpr int kUnitsClaimed = 0, kCtasRetired = 1, kUnitClaimWords = 2;  // the words of a slot
int32_t* unit_claim_pool();

}  // namespace nmkit::gpu::tile
