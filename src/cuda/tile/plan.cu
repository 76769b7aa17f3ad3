// Host side of the tile-sparse SpMM: device weights, plan creation (validation, kernel choice) and run().
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "../common/check.cuh"
#include "../nm24/nm24_common.cuh"
#include "../nm24/sm90_epilogue.cuh"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/detail/tile_timeline.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "tile_common.cuh"

namespace nmkit::gpu {
namespace {

// The kernels' parameters for weight w (the plan's own weight or its widened copy) and the run's operands.
tile::TileParams tile_params(const SpmmDesc& desc, const DeviceTiles& w, const void* b, const void* c, void* d,
                             const float* bias) {
  const DeviceTileSchedules& s = tile_schedules(w);
  tile::TileParams p{};
  p.row_ptr = w.row_ptr(), p.col_index = w.col_index(), p.tile_row = s.tile_row(), p.row_order = s.row_order();
  p.schedule_block = s.block(), p.schedule_block_groups = s.block_groups();
  p.schedule_step_ptr = s.step_ptr();
  p.schedule_steps = reinterpret_cast<const int4*>(s.steps());
  p.units_by_token_block = s.balanced;
  p.tiles = static_cast<const uint16_t*>(w.data());
  p.b = b, p.c = c, p.d = d, p.bias = desc.bias ? bias : nullptr;
  p.rows = desc.rows, p.cols = desc.cols, p.n = desc.n, p.nnz_tiles = w.nnz_tiles();
  p.tile_rows = w.tile_rows(), p.tile_cols = w.tile_cols();
  p.alpha = desc.alpha, p.beta = desc.beta, p.activation = desc.activation;
  p.d_col_major = desc.d_layout == Layout::col_major, p.b_col_major = desc.b_layout == Layout::col_major;
  p.b_vector = nm24::b_vector_loads(desc, b);
  return p;
}

}  // namespace

const DeviceTileSchedules& tile_schedules(const DeviceTiles& a) noexcept {
  static const DeviceTileSchedules kNone;  // a moved-from weight's: no work lists, no copies
  return a.schedules_ ? *a.schedules_ : kNone;
}

bool tile_plan_defers_store(const TileSpmmPlan& plan) noexcept { return plan.deferred_store_; }

const char* kernel_name(TileKernel k) noexcept {
  switch (k) {
    case TileKernel::automatic:
      return "automatic";
    case TileKernel::sm80_mma:
      return "sm80_mma";
    case TileKernel::sm90_wgmma:
      return "sm90_wgmma";
    case TileKernel::stream_mma:
      return "stream_mma";
    case TileKernel::warp_stream_mma:
      return "warp_stream_mma";
  }
  return "?";
}

DeviceTiles DeviceTiles::upload(const PackedTiles& packed) {
  check_packed_tiles(packed);
  DeviceTiles w = upload_arrays(packed);
  if ((packed.tile_rows < kSm90MinTileSide || packed.tile_cols < kSm90MinTileSide) && nm24::sm90_compiled() &&
      nm24::device_is_sm90())  // sides below 64: the Hopper kernel's copy
    w.schedules_->widened = std::make_shared<const DeviceTiles>(upload_arrays(widen_tiles(packed)));
  if (packed.tile_rows > tile::kWarpStreamTileRows && tile::warp_stream_runs(packed.tile_rows, packed.tile_cols) &&
      tile::warp_stream_fits_device())  // the warp-stream kernel's copy
    w.schedules_->split_rows =
        std::make_shared<const DeviceTiles>(upload_arrays(split_tile_rows(packed, tile::kWarpStreamTileRows)));
  return w;
}

DeviceTiles DeviceTiles::upload_arrays(const PackedTiles& packed) {
  DeviceTiles w;
  w.rows_ = packed.rows, w.cols_ = packed.cols, w.tile_rows_ = packed.tile_rows, w.tile_cols_ = packed.tile_cols;
  w.nnz_tiles_ = packed.nnz_tiles();
  w.dtype_ = packed.dtype;
  w.schedules_ = std::make_shared<DeviceTileSchedules>();
  DeviceTileSchedules& s = *w.schedules_;
  const auto upload_vector = [](DeviceBuffer& buffer, const auto& v) {  // at least one element: a valid pointer
    buffer = DeviceBuffer(std::max<std::size_t>(v.size(), 1) * sizeof(v[0]));
    if (!v.empty()) buffer.copy_from_host(v.data(), v.size() * sizeof(v[0]));
  };
  upload_vector(w.row_ptr_, packed.row_ptr);
  upload_vector(w.col_index_, packed.col_index);
  upload_vector(s.row_order_, tile_rows_longest_first(packed.row_ptr));
  upload_vector(s.tile_row_, tile_row_of_tiles(packed.row_ptr));
  upload_vector(w.data_, packed.data);
  if (packed.tile_rows >= kSm90MinTileSide && packed.tile_cols >= kSm90MinTileSide) {  // the Hopper kernel's work list
    const TileBlockSchedule schedule = tile_block_schedule(packed);
    upload_vector(s.block_, schedule.block);
    upload_vector(s.block_groups_, schedule.block_groups);
    upload_vector(s.step_ptr_, schedule.step_ptr);
    upload_vector(s.steps_, schedule.steps);
    s.balanced = schedule.balanced();
  }
  if (packed.tile_rows == tile::kWarpStreamTileRows && tile::warp_stream_runs(packed.tile_rows, packed.tile_cols) &&
      w.nnz_tiles_ > 0 && tile::warp_stream_fits_device()) {
    // The warp-stream kernel's CTA ranges, for as many CTAs as its plans launch by default on this device.
    const int chunks_per_tile = packed.tile_cols / tile::kWarpStreamChunkCols;
    const int max_ctas = tile::warp_stream_max_ctas();
    const WarpStreamSchedule schedule = warp_stream_schedule(
        packed.row_ptr, chunks_per_tile, tile::warp_stream_ctas(w.nnz_tiles_, packed.tile_cols, max_ctas), max_ctas);
    if (schedule.ctas() > 0) {
      upload_vector(s.warp_stream_leads_,
                    gpu::warp_stream_leads(schedule, packed.row_ptr, packed.col_index, chunks_per_tile));
      s.warp_stream_ctas = schedule.ctas();
      for (std::size_t r = 0; r < schedule.row_ctas.size(); r += 2) s.warp_stream_rows_cut += schedule.row_ctas[r] >= 0;
    }
  }
  return w;
}

TileSpmmPlan TileSpmmPlan::create(const SpmmDesc& desc, int tile_rows, int tile_cols, TileKernel kernel,
                                  const TileLaunch& launch) {
  const int block_n = launch.block_n, split = launch.split;
  nm24::check_desc(desc, "tile plan");
  require(nm24::b_leading_dim(desc) == (desc.b_layout == Layout::col_major ? desc.cols : desc.n),
          ErrorCode::unsupported, "tile plan: the tile kernels read a dense B (ldb 0, or K col-major, C row-major)");
  require(tile_kernel_supports(tile_rows, tile_cols), ErrorCode::unsupported, [&] {
    return "tile plan: the kernels run tile sides 16, 32, 64 or 128, got " + std::to_string(tile_rows) + "x" +
           std::to_string(tile_cols);
  });
  require(
      block_n == 0 || block_n == 32 || block_n == 64 || block_n == 128 || block_n == 256, ErrorCode::invalid_argument,
      [&] { return "tile plan: block_n must be 0 (by shape), 32, 64, 128 or 256, got " + std::to_string(block_n); });
  require(split >= 0 && split <= 8, ErrorCode::invalid_argument,
          [&] { return "tile plan: split must be 0 (by shape) or 1..8, got " + std::to_string(split); });
  require(launch.stream_ctas >= 0 && launch.stream_ctas <= kMaxStreamCtas, ErrorCode::invalid_argument, [&] {
    return "tile plan: stream_ctas must be 0 (by device) or 1.." + std::to_string(kMaxStreamCtas) + ", got " +
           std::to_string(launch.stream_ctas);
  });
  TileSpmmPlan plan;
  plan.desc_ = desc, plan.tile_rows_ = tile_rows, plan.tile_cols_ = tile_cols;
  // Tile sides below 64 run the sm90 kernel on the weight's widened copy (widen_tiles).
  const bool sm90_possible =
      nm24::sm90_compiled() && nm24::device_is_sm90() && desc.b_layout == Layout::col_major && desc.cols % 8 == 0;
  require(kernel != TileKernel::sm90_wgmma || sm90_possible, ErrorCode::unsupported,
          "tile plan: the sm90 wgmma kernel needs an sm_90 device, a build with sm_90a, B col-major and K % 8 == 0");
  // Tiles 32, 64 or 128 rows high at C <= 32: the warp-stream kernel (taller tiles through the weight's copy in
  // tiles 32 rows high) beats the Hopper one, on weights whose schedule cuts rows over CTAs too (1.01-1.50x its
  // speed); run() takes it for every weight that has a schedule (kernel_for).
  const bool warp_stream_tiles = tile::warp_stream_runs(tile_rows, tile_cols);
  const bool warp_stream_by_weight = kernel == TileKernel::automatic && sm90_possible && warp_stream_tiles &&
                                     desc.n <= tile::kStreamBlockN && tile::warp_stream_fits_device();
  if (kernel == TileKernel::automatic) kernel = tile::automatic_tile_kernel(sm90_possible, desc.n);
  require(kernel != TileKernel::warp_stream_mma || warp_stream_tiles, ErrorCode::unsupported, [&] {
    return "tile plan: the warp-stream kernel takes tiles 32, 64 or 128 rows high (taller than " +
           std::to_string(tile::kWarpStreamTileRows) +
           " through the weight's split copy) and 32, 64 or 128 columns, got " + std::to_string(tile_rows) + "x" +
           std::to_string(tile_cols);
  });
  plan.kernel_ = kernel;
  plan.launch_ = {.block_n = 0,
                  .split = 1,
                  .persistent = false,
                  .stream_ctas = 0,
                  .overlap_launch = launch.overlap_launch && nm24::device_is_sm90()};
  plan.stream_kernel_ = kernel == TileKernel::stream_mma || kernel == TileKernel::warp_stream_mma ? kernel
                        : warp_stream_by_weight ? TileKernel::warp_stream_mma
                                                : TileKernel::automatic;
  if (plan.stream_kernel_ != TileKernel::automatic) {
    // The workspace: a partial tile row per CTA end and token block, then a counter per tile row and token block
    // (zero; each launch leaves them zero).
    plan.launch_.stream_ctas = launch.stream_ctas ? launch.stream_ctas
                               : plan.stream_kernel_ == TileKernel::warp_stream_mma
                                   ? tile::warp_stream_max_ctas()
                                   : tile::stream_max_ctas(tile_rows, tile_cols);
    plan.stream_forced_ = launch.stream_ctas != 0;
    const std::size_t partial_bytes = plan.partial_floats() * sizeof(float);
    const int stream_tile_rows =
        plan.stream_kernel_ == TileKernel::warp_stream_mma ? tile::kWarpStreamTileRows : tile_rows;
    const std::size_t counter_bytes = static_cast<std::size_t>(ceil_div(desc.n, int64_t{tile::kStreamBlockN}) *
                                                               ceil_div(desc.rows, int64_t{stream_tile_rows})) *
                                      sizeof(int32_t);
    auto workspace = std::make_shared<DeviceBuffer>(std::max<std::size_t>(partial_bytes + counter_bytes, 1));
    NMKIT_CUDA_CHECK(cudaMemset(workspace->data(), 0, workspace->size()));
    NMKIT_CUDA_CHECK(cudaDeviceSynchronize());  // zero before any stream, blocking or not, runs the plan
    plan.workspace_ = std::move(workspace);
  }
  if (plan.kernel_ == TileKernel::sm90_wgmma) {
    const int sm_count = nm24::device_facts().sm_count, by_shape_n = tile::sm90_block_n(desc.n);
    const tile::ClusterWaveCtas waves =
        tile::sm90_ctas_per_sm(by_shape_n) == 2 ? tile::cluster_wave_ctas(by_shape_n) : tile::ClusterWaveCtas{};
    const int64_t d_stride = desc.d_layout == Layout::col_major ? desc.rows : desc.n;
    static_assert(sm90_epilogue::kLineElements == 64, "the deferred store's boxes are 64 tokens (heuristics.cpp)");
    const tile::Sm90TileConfig config = tile::sm90_launch_config(
        tile::sm90_tile_config(desc.rows, desc.cols, desc.n, std::max(tile_cols, kSm90MinTileSide), sm_count, waves),
        launch,
        sm90_epilogue::outputs_final_in_registers(desc.out_dtype != DType::f32, desc.beta, desc.activation, d_stride));
    plan.launch_.block_n = config.block_n, plan.launch_.split = config.split;
    plan.launch_.persistent = config.persistent, plan.deferred_store_ = config.deferred_store;
    if (config.persistent) tile::unit_claim_pool();  // allocated now rather than in a run (a stream capture, say)
  }
  return plan;
}

namespace {
// The weight the warp-stream kernel reads: itself in tiles 32 rows high, else its split copy (null where it has none).
const DeviceTiles* warp_stream_weight(const DeviceTiles& a) noexcept {
  return a.tile_rows() == tile::kWarpStreamTileRows ? &a : tile_schedules(a).split_rows.get();
}
}  // namespace

bool TileSpmmPlan::takes_warp_stream_schedule(const DeviceTiles& a) const noexcept {
  const DeviceTiles* w = warp_stream_weight(a);
  if (stream_kernel_ != TileKernel::warp_stream_mma || stream_forced_ || !w) return false;
  const int64_t ctas = tile_schedules(*w).warp_stream_ctas;
  return ctas > 0 && ctas <= launch_.stream_ctas;
}

TileKernel TileSpmmPlan::kernel_for(const DeviceTiles& a) const noexcept {
  const bool by_weight = kernel_ == TileKernel::sm90_wgmma && stream_kernel_ == TileKernel::warp_stream_mma;
  return by_weight && takes_warp_stream_schedule(a) ? TileKernel::warp_stream_mma : kernel_;
}

int64_t TileSpmmPlan::stream_ctas(const DeviceTiles& a) const {
  const bool warp_stream = kernel_for(a) == TileKernel::warp_stream_mma;
  const DeviceTiles* w = warp_stream ? warp_stream_weight(a) : &a;  // the weight the kernel reads
  const int64_t nnz_tiles = w ? w->nnz_tiles() : a.nnz_tiles();
  if (stream_forced_) return std::clamp<int64_t>(launch_.stream_ctas, 1, std::max<int64_t>(nnz_tiles, 1));
  if (!warp_stream) return tile::stream_ctas(nnz_tiles, launch_.stream_ctas);
  return takes_warp_stream_schedule(a) ? tile_schedules(*w).warp_stream_ctas
                                       : tile::warp_stream_ctas(nnz_tiles, tile_cols_, launch_.stream_ctas);
}

std::size_t TileSpmmPlan::partial_floats() const {
  return stream_kernel_ == TileKernel::warp_stream_mma
             ? tile::warp_stream_partial_floats(launch_.stream_ctas, desc_.n)
             : tile::stream_partial_floats(tile_rows_, launch_.stream_ctas, desc_.n);
}

namespace {
void check_weight(const SpmmDesc& desc_, int tile_rows_, int tile_cols_, const DeviceTiles& a) {
  require(a.rows() == desc_.rows && a.cols() == desc_.cols && a.dtype() == desc_.dtype && a.tile_rows() == tile_rows_ &&
              a.tile_cols() == tile_cols_,
          ErrorCode::invalid_argument, [&] {
            return "tile run: weight is " + std::to_string(a.rows()) + "x" + std::to_string(a.cols()) + " " +
                   dtype_name(a.dtype()) + " in " + std::to_string(a.tile_rows()) + "x" +
                   std::to_string(a.tile_cols()) + " tiles, the plan was made for " + std::to_string(desc_.rows) + "x" +
                   std::to_string(desc_.cols) + " " + dtype_name(desc_.dtype) + " in " + std::to_string(tile_rows_) +
                   "x" + std::to_string(tile_cols_) + " tiles";
          });
}

// The weight the Hopper kernel reads for `a`: itself, or for sides below 64 its widened copy (made at upload on an
// sm90 device; null where there is none).
const DeviceTiles* sm90_weight(const DeviceTiles& a) noexcept {
  const bool small_tiles = a.tile_rows() < kSm90MinTileSide || a.tile_cols() < kSm90MinTileSide;
  return small_tiles ? tile_schedules(a).widened.get() : &a;
}

// The deferred store's tensor map needs a 16-byte aligned D; otherwise this run keeps the chunked epilogue.
tile::Sm90TileConfig sm90_config(const TileSpmmPlan& plan, const void* d) {
  const TileLaunch& launch = plan.launch();
  return {launch.block_n, launch.split, launch.persistent, tile_plan_defers_store(plan) && nm24::aligned16(d)};
}
}  // namespace

void TileSpmmPlan::run(Stream stream, const DeviceTiles& a, const void* b, const void* c, void* d,
                       const float* bias) const {
  check_weight(desc_, tile_rows_, tile_cols_, a);
  if (desc_.n == 0) return;
  nm24::check_operands(desc_, b, c, d, bias, "tile run");
  const TileKernel kernel = kernel_for(a);
  if (kernel == TileKernel::stream_mma || kernel == TileKernel::warp_stream_mma) {
    const DeviceTiles* weight = kernel == TileKernel::warp_stream_mma ? warp_stream_weight(a) : &a;
    require(weight != nullptr, ErrorCode::unsupported, [&] {
      return "tile run: the warp-stream kernel needs the weight in tiles 32 rows high, and this weight of " +
             std::to_string(a.tile_rows()) +
             "-row tiles has no split copy (made at upload where the device fits the kernel)";
    });
    const tile::TileParams p = tile_params(desc_, *weight, b, c, d, bias);
    auto* partials = static_cast<float*>(workspace_->data());  // then the counters (create() sizes both)
    tile::StreamWork work{partials, reinterpret_cast<int32_t*>(partials + partial_floats()),
                          static_cast<int>(stream_ctas(a))};
    // The warp-stream kernel takes the weight's schedule (its warps' records) unless the plan fixes the CTAs.
    if (kernel == TileKernel::warp_stream_mma && takes_warp_stream_schedule(a))
      work.leads = tile_schedules(*weight).warp_stream_leads();
    nm24::dispatch_types(desc_, [&]<class Element, class Out>() {
      // Overlapping launches order themselves by the stream; the legacy default stream's implicit order with
      // other streams is not theirs to keep.
      if (kernel == TileKernel::warp_stream_mma)
        tile::launch_warp_stream<Element, Out>(p, work, stream, launch_.overlap_launch && stream != nullptr);
      else
        tile::launch_stream<Element, Out>(p, work, stream);
    });
    return;
  }
  // The Hopper kernel's tensor map needs a 16-byte aligned B, and small tiles the widened copy; otherwise this run
  // takes the portable kernel.
  const DeviceTiles* hopper = kernel == TileKernel::sm90_wgmma && nm24::aligned16(b) ? sm90_weight(a) : nullptr;
  const tile::TileParams p = tile_params(desc_, hopper ? *hopper : a, b, c, d, bias);
  nm24::dispatch_types(desc_, [&]<class Element, class Out>() {
    if (hopper)
      tile::launch_sm90<Element, Out>(p, sm90_config(*this, d), stream);
    else
      tile::launch_sm80<Element, Out>(p, tile_rows_, stream);
  });
}

void run_tile_plan_with_timeline(const TileSpmmPlan& plan, Stream stream, const DeviceTiles& a, const void* b,
                                 const void* c, void* d, const float* bias, uint64_t* timeline) {
  const SpmmDesc& desc = plan.desc();
  check_weight(desc, plan.tile_rows(), plan.tile_cols(), a);
  if (desc.n == 0) return;
  nm24::check_operands(desc, b, c, d, bias, "tile timeline run");
  const DeviceTiles* hopper = nm24::aligned16(b) ? sm90_weight(a) : nullptr;
  require(plan.kernel_for(a) == TileKernel::sm90_wgmma && hopper && desc.dtype == DType::f16 &&
              desc.out_dtype == DType::f16 && timeline,
          ErrorCode::unsupported,
          "tile timeline run: needs a plan that runs the sm90 kernel on this weight, f16 A, B and D, a 16-byte "
          "aligned B and a timeline buffer");
  tile::launch_sm90_timeline(tile_params(desc, *hopper, b, c, d, bias), sm90_config(plan, d), timeline, stream);
}

}  // namespace nmkit::gpu
