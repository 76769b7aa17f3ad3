#pragma once
// Tile-sparse SpMM on the GPU: D = act(alpha * A * B + beta * C + bias), A stored as dense tiles (docs/formats.md).
//   DeviceTiles a = DeviceTiles::upload(pack_tiles(compress_tiles(w, mask, 64, 64)));  // once per weight
//   TileSpmmPlan::create(desc, 64, 64).run(stream, a, b, c, d, bias);  // plan once per shape, run per product
#include <memory>

#include "nmkit/format/tile.hpp"
#include "nmkit/gpu/detail/device_buffer.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {
struct DeviceTileSchedules;  // the kernels' work lists and weight copies (detail/tile_schedule.hpp)

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
// A packed tile weight in device memory, with the work lists its kernels read (move-only).
class DeviceTiles {
 public:
  static DeviceTiles upload(const PackedTiles& packed);  // throws Error on inconsistent arrays, or cuda_error
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int tile_rows() const noexcept { return tile_rows_; }
  int tile_cols() const noexcept { return tile_cols_; }
  int64_t nnz_tiles() const noexcept { return nnz_tiles_; }
  DType dtype() const noexcept { return dtype_; }
  // The packed arrays in device memory (PackedTiles' row_ptr, col_index, data).
  const int32_t* row_ptr() const noexcept { return static_cast<const int32_t*>(row_ptr_.data()); }
  const int32_t* col_index() const noexcept { return static_cast<const int32_t*>(col_index_.data()); }
  const void* data() const noexcept { return data_.data(); }

 private:
  friend const DeviceTileSchedules& tile_schedules(const DeviceTiles& a) noexcept;
  DeviceTiles() = default;
  static DeviceTiles upload_arrays(const PackedTiles& packed);  // the arrays and work lists, without the copies
  DeviceBuffer row_ptr_, col_index_, data_;
  std::shared_ptr<DeviceTileSchedules> schedules_;
  int64_t rows_ = 0, cols_ = 0, nnz_tiles_ = 0;
  int tile_rows_ = 0, tile_cols_ = 0;
  DType dtype_ = DType::f16;
};

// sm90_wgmma: Hopper, B col-major, K % 8 == 0; sm80_mma: any; stream_mma, warp_stream_mma (tiles 32 rows high or
// split): C <= 32. automatic: sm90_wgmma (warp_stream_mma per weight: kernel_for), else stream_mma, else sm80_mma.
enum class TileKernel : uint8_t { automatic, sm80_mma, sm90_wgmma, stream_mma, warp_stream_mma };
const char* kernel_name(TileKernel k) noexcept;

// What a user may choose of a plan's launch; 0 leaves a field to the plan (by shape and device).
struct TileLaunch {
  int block_n = 0;             // sm90: tokens per CTA, 32, 64, 128 or 256
  int split = 0;               // sm90: CTAs of a cluster that share a block's K, 1..8
  bool persistent = true;      // sm90: one CTA per SM slot, walking the work units (split 1 only)
  int stream_ctas = 0;         // stream kernels: CTAs per 32-token block, 1..2^20
  bool overlap_launch = true;  // warp-stream on sm_90: start as the kernel before ends (it must not write the weight)
};

class TileSpmmPlan {
 public:
  // Validates desc (B dense: desc.ldb 0), the tile shape, the kernel and launch; throws Error (invalid_argument,
  // unsupported).
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
  // The launch resolved (off sm90: block_n 0, split 1, not persistent); stream_ctas: the most per token block.
  const TileLaunch& launch() const noexcept { return launch_; }
  int64_t stream_ctas(const DeviceTiles& a) const;  // the stream kernels' CTAs per 32-token block for `a`
  std::size_t workspace_bytes() const noexcept { return workspace_ ? workspace_->size() : 0; }

 private:
  friend bool tile_plan_defers_store(const TileSpmmPlan& plan) noexcept;  // detail/tile_schedule.hpp
  SpmmDesc desc_;
  TileLaunch launch_;  // stream_ctas: the stream kernels' most CTAs per token block (0: no stream kernel)
  TileKernel kernel_ = TileKernel::sm80_mma;
  TileKernel stream_kernel_ = TileKernel::automatic;  // the stream kernel the workspace serves (automatic: none)
  int tile_rows_ = 0, tile_cols_ = 0;
  bool deferred_store_ = false, stream_forced_ = false;
  std::shared_ptr<const DeviceBuffer> workspace_;
  std::size_t partial_floats() const;
  bool takes_warp_stream_schedule(const DeviceTiles& a) const noexcept;
};
}  // namespace nmkit::gpu
