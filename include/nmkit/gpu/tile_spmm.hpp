#pragma once
// Tile-sparse SpMM on the GPU: D = act(alpha * A * B + beta * C + bias), A stored as dense tiles (docs/formats.md).
//   DeviceTiles a = DeviceTiles::upload(pack_tiles(compress_tiles(w, mask, 64, 64)));  // once per weight
//   TileSpmmPlan::create(desc, 64, 64).run(stream, a, b, c, d, bias);  // plan once per shape, run per product
#include "nmkit/format/tile.hpp"
#include "nmkit/gpu/detail/tile_steps.hpp"
#include "nmkit/gpu/device_buffer.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {
bool tile_kernel_supports(int tile_rows, int tile_cols) noexcept;  // each side 16, 32, 64 or 128
// A tile matrix ordered by tile row (CSR of tiles), each tile row-major and contiguous.
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

// Validates `a` (ptr monotone and complete, indices in range and ascending, zero padding) and reorders it by tile
// row. Throws Error naming what is wrong; unsupported for f32 values or tile shapes the kernels do not run.
PackedTiles pack_tiles(const TileMatrix& a);
TileMatrix unpack_tiles(const PackedTiles& p);  // the inverse (tests, inspection)
// A packed tile weight in device memory with its kernels' schedules and copies (move-only).
class DeviceTiles {
 public:
  static DeviceTiles upload(const PackedTiles& packed);  // throws Error on inconsistent arrays, or cuda_error
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int tile_rows() const noexcept { return tile_rows_; }
  int tile_cols() const noexcept { return tile_cols_; }
  int64_t nnz_tiles() const noexcept { return nnz_tiles_; }
  DType dtype() const noexcept { return dtype_; }
  const int32_t* row_ptr() const noexcept { return static_cast<const int32_t*>(row_ptr_.data()); }
  const int32_t* col_index() const noexcept { return static_cast<const int32_t*>(col_index_.data()); }
  const void* data() const noexcept { return data_.data(); }
  // Kernel internals (detail/tile_schedule.hpp), empty or null where the weight has none.
  const int32_t* row_order() const noexcept { return static_cast<const int32_t*>(row_order_.data()); }
  const int32_t* tile_row() const noexcept { return static_cast<const int32_t*>(tile_row_.data()); }
  const int32_t* schedule_block() const noexcept { return static_cast<const int32_t*>(schedule_block_.data()); }
  const int32_t* schedule_block_groups() const noexcept {
    return static_cast<const int32_t*>(schedule_block_groups_.data());
  }
  const int32_t* schedule_step_ptr() const noexcept { return static_cast<const int32_t*>(schedule_step_ptr_.data()); }
  const TileStep* schedule_steps() const noexcept { return static_cast<const TileStep*>(schedule_steps_.data()); }
  bool schedule_balanced() const noexcept { return schedule_balanced_; }
  int64_t warp_stream_ctas() const noexcept { return warp_stream_ctas_; }
  int64_t warp_stream_rows_cut() const noexcept { return warp_stream_rows_cut_; }
  const WarpStreamLead* warp_stream_leads() const noexcept {
    return warp_stream_ctas_ ? static_cast<const WarpStreamLead*>(warp_stream_leads_.data()) : nullptr;
  }
  const DeviceTiles* widened() const noexcept { return widened_.get(); }
  const DeviceTiles* split_rows() const noexcept { return split_rows_.get(); }

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

// sm90_wgmma: Hopper, B col-major, K % 8 == 0; sm80_mma: any; stream_mma, warp_stream_mma (tiles 32 rows high or
// split): C <= 32. automatic: sm90_wgmma (warp_stream_mma per weight: kernel_for), else stream_mma, else sm80_mma.
enum class TileKernel : uint8_t { automatic, sm80_mma, sm90_wgmma, stream_mma, warp_stream_mma };
const char* kernel_name(TileKernel k) noexcept;

// Launch options (0: by shape and device). overlap_launch: the kernel before run() must not write the weight.
struct TileLaunch {
  int block_n = 0, split = 0;                     // sm90: tokens per CTA (32..256), split-K CTAs per cluster (1..8)
  bool persistent = true, deferred_store = true;  // sm90: one CTA per SM; D stored by TMA while the next unit runs
  uint64_t* timeline = nullptr;                   // diagnosis only (detail/tile_timeline.hpp); else null
  int stream_ctas = 0;                            // stream kernels: CTAs per 32-token block (0..2^20)
  bool overlap_launch = true;  // warp-stream: programmatic dependent launch (NMKIT_OVERLAP_LAUNCH=0|1 overrides)
};

class TileSpmmPlan {
 public:
  // Validates desc, the tile shape, the kernel and launch; throws Error (invalid_argument, unsupported).
  static TileSpmmPlan create(const SpmmDesc& desc, int tile_rows, int tile_cols,
                             TileKernel kernel = TileKernel::automatic, const TileLaunch& launch = {});
  // As Nm24SpmmPlan::run; `a` must match shape, dtype and tiles. A workspace plan's runs must not overlap.
  void run(Stream stream, const DeviceTiles& a, const void* b, const void* c, void* d,
           const float* bias = nullptr) const;
  const SpmmDesc& desc() const noexcept { return desc_; }
  TileKernel kernel() const noexcept { return kernel_; }
  TileKernel kernel_for(const DeviceTiles& a) const noexcept;  // what run() launches for `a`
  int tile_rows() const noexcept { return tile_rows_; }
  int tile_cols() const noexcept { return tile_cols_; }
  int block_n() const noexcept { return block_n_; }  // block_n() .. overlap_launch(): the resolved TileLaunch
  int split() const noexcept { return split_; }
  bool persistent() const noexcept { return persistent_; }
  bool deferred_store() const noexcept { return deferred_store_; }
  uint64_t* timeline() const noexcept { return timeline_; }
  bool overlap_launch() const noexcept { return overlap_launch_; }
  int64_t stream_ctas(const DeviceTiles& a) const;  // the stream kernels' CTAs per 32-token block for `a`
  std::size_t workspace_bytes() const noexcept { return workspace_ ? workspace_->size() : 0; }

 private:
  SpmmDesc desc_;
  TileKernel kernel_ = TileKernel::sm80_mma;
  int tile_rows_ = 0, tile_cols_ = 0, block_n_ = 0, split_ = 1;
  bool persistent_ = false, deferred_store_ = false;
  uint64_t* timeline_ = nullptr;
  bool overlap_launch_ = false;
  TileKernel stream_kernel_ = TileKernel::automatic;  // the stream kernel the workspace serves (automatic: none)
  int stream_max_ctas_ = 0;
  bool stream_forced_ = false;
  std::shared_ptr<const DeviceBuffer> workspace_;
  std::size_t partial_floats() const;
  bool takes_warp_stream_schedule(const DeviceTiles& a) const noexcept;
};
}  // namespace nmkit::gpu
