// Host side of the nm24 SpMM: device weights, plan creation (validation, kernel choice) and run().
#include <cuda_runtime.h>

#include <algorithm>
#include <span>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <ostream>

#include "../common/check.cuh"
#include "nmkit/gpu/detail/device_buffer.hpp"
#include "nm24_common.cuh"
#include "sm90_epilogue.cuh"

namespace nmkit::gpu {
namespace nm24 {

DeviceFacts device_facts() {
  int device = 0, sms = 0, l2_bytes = 0;
  NMKIT_CUDA_CHECK(cudaGetDevice(&device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  return {sms, l2_bytes};
}

void check_desc(const SpmmDesc& desc, const char* who) {
  require(desc.rows >= 1 && desc.cols >= 1 && desc.n >= 0, ErrorCode::invalid_argument, [&] {
    return std::string(who) + ": shape must be R >= 1, K >= 1, C >= 0, got " + std::to_string(desc.rows) + "x" +
           std::to_string(desc.cols) + "x" + std::to_string(desc.n);
  });
  require(desc.dtype == DType::f16 || desc.dtype == DType::bf16, ErrorCode::unsupported,
          [&] { return std::string(who) + ": A and B must be f16 or bf16, got " + dtype_name(desc.dtype); });
  require(desc.out_dtype == desc.dtype || desc.out_dtype == DType::f32, ErrorCode::unsupported, [&] {
    return std::string(who) + ": output dtype must be the input dtype or f32, got " + dtype_name(desc.out_dtype);
  });
  check_b_shape(desc, who);
}

void check_b_shape(const SpmmDesc& desc, const char* who) {
  require(desc.n <= kMaxTokens, ErrorCode::unsupported,
          [&] { return std::string(who) + ": C is at most 2^30 columns (tokens), got " + std::to_string(desc.n); });
  const bool col_major = desc.b_layout == Layout::col_major;
  require(desc.ldb == 0 || desc.ldb >= (col_major ? desc.cols : desc.n), ErrorCode::invalid_argument, [&] {
    return std::string(who) + ": ldb must be 0 (dense) or at least " + (col_major ? "K" : "C") + " = " +
           std::to_string(col_major ? desc.cols : desc.n) + " (B " + layout_name(desc.b_layout) + "), got " +
           std::to_string(desc.ldb);
  });
  require(b_leading_dim(desc) <= kMaxLeadingDim, ErrorCode::unsupported, [&] {
    return std::string(who) + ": B's leading dimension is at most 2^31 - 1 elements, got " +
           std::to_string(b_leading_dim(desc));
  });
}

int64_t b_leading_dim(const SpmmDesc& desc) {
  if (desc.ldb != 0) return desc.ldb;
  return desc.b_layout == Layout::col_major ? desc.cols : desc.n;
}

void check_options(const Nm24Options& options, const char* who) {
  const int n = options.block_n;
  const bool skinny = options.kernel == Nm24Kernel::sm80_mma_sp_skinny;
  if (skinny) {
    require(n == 0 || n == 8 || n == 16 || n == 32 || n == 64, ErrorCode::invalid_argument, [&] {
      return std::string(who) + ": the skinny kernel's block_n must be 8, 16, 32 or 64 (0: by shape), got " +
             std::to_string(n);
    });
    require(options.block_m == 0 || options.block_m == 16 || options.block_m == 32, ErrorCode::invalid_argument, [&] {
      return std::string(who) + ": the skinny kernel's block_m must be 16 or 32 (0: by shape), got " +
             std::to_string(options.block_m);
    });
  } else {
    require(n == 0 || n == 256 || n == 192 || n == 128 || n == 64 || n == 32 || n == 16, ErrorCode::invalid_argument,
            [&] {
              return std::string(who) + ": block_n must be 256, 192, 128, 64, 32 or 16 (0: by shape), got " +
                     std::to_string(n);
            });
    require(options.block_m == 0, ErrorCode::unsupported,
            [&] { return std::string(who) + ": block_m can only be chosen for the skinny kernel"; });
  }
  require(options.split >= 0 && options.split <= kMaxClusterCtas, ErrorCode::invalid_argument, [&] {
    return std::string(who) + ": split must be 1..8 CTAs per tile (0: by shape), got " + std::to_string(options.split);
  });
  require(options.raster_rows >= 0 && options.raster_rows <= kMaxRasterRows, ErrorCode::invalid_argument, [&] {
    return std::string(who) + ": raster_rows must be a row-tile count in 1..1024 (0: by shape), got " +
           std::to_string(options.raster_rows);
  });
  const bool portable = options.kernel == Nm24Kernel::sm80_mma_sp || skinny;
  require(!portable || ((skinny || n == 0) && options.schedule == Sm90Schedule::automatic && options.raster_rows == 0 &&
                        (skinny || options.split <= 1)),
          ErrorCode::unsupported, [&] {
            return std::string(who) +
                   ": the schedule and the raster can only be chosen for the sm90 kernel, block_n for the sm90 and "
                   "skinny kernels, split-K for those two";
          });
}

void check_operands(const SpmmDesc& desc, const void* b, const void* c, const void* d, const float* bias,
                    const char* who) {
  require(b != nullptr && d != nullptr, ErrorCode::invalid_argument,
          [&] { return std::string(who) + ": B and D must not be null"; });
  require(desc.beta == 0.0f || c != nullptr, ErrorCode::invalid_argument,
          [&] { return std::string(who) + ": beta != 0 needs C"; });
  require(!desc.bias || bias != nullptr, ErrorCode::invalid_argument,
          [&] { return std::string(who) + ": the plan has a bias but none was given"; });
  const std::size_t out_size = dtype_size(desc.out_dtype);
  require(reinterpret_cast<uintptr_t>(d) % out_size == 0 && reinterpret_cast<uintptr_t>(c) % out_size == 0 &&
              reinterpret_cast<uintptr_t>(b) % 2 == 0,
          ErrorCode::invalid_argument,
          [&] { return std::string(who) + ": B, C and D must be aligned to their element size"; });
}

Params make_params(const SpmmDesc& desc, const DeviceNm24& a, const void* b, const void* c, void* d,
                   const float* bias) {
  return {static_cast<const uint32_t*>(a.values()),
          static_cast<const uint32_t*>(a.metadata()),
          b,
          c,
          d,
          desc.bias ? bias : nullptr,
          desc.rows,
          desc.cols,
          desc.n,
          a.cols_padded() / kFragmentK,
          desc.alpha,
          desc.beta,
          desc.activation,
          desc.d_layout == Layout::col_major,
          desc.b_layout == Layout::col_major,
          static_cast<int32_t>(b_leading_dim(desc))};
}

// Overlapping launches of the sm90 sparse kernel are the default: the producers wait for the kernel before them at
// their start and the consumers say launch_dependents when their last tile is done, which keeps the plain
// launch's code; chains of dependent decode products ran 8-9 % faster. A trigger earlier in the kernel lost 3-15 %:
// the next kernel's CTAs took SMs this one still needed.
void choose_sm90_schedule(const SpmmDesc& desc, const Nm24Options& options, int64_t k_tiles, bool split_k_built,
                          KernelConfig& config) {
  config.register_epilogue = false, config.persistent_ctas = 0, config.raster_rows = 0, config.split = 1;
  config.overlap_launch = config.kernel == Nm24Kernel::sm90_wgmma_sp && options.overlap_launch;
  if (config.kernel != Nm24Kernel::sm90_wgmma_sp) {
    const bool skinny = config.kernel == Nm24Kernel::sm80_mma_sp_skinny;
    require((options.block_n == 0 || skinny) && options.schedule == Sm90Schedule::automatic &&
                options.raster_rows == 0 && (options.split <= 1 || skinny),
            ErrorCode::unsupported,
            "nm24 plan: the schedule and the raster can only be chosen for the sm90 kernel, block_n for the sm90 and "
            "skinny kernels, split-K for those two");
    return;
  }
  config.raster_rows = options.raster_rows;
  const int64_t d_stride = desc.d_layout == Layout::col_major ? desc.rows : desc.n;
  const bool final_in_registers =
      sm90_epilogue::outputs_final_in_registers(desc.out_dtype != DType::f32, desc.beta, desc.activation, d_stride);
  const int sms = device_facts().sm_count;
  const int64_t tiles = ceil_div(desc.rows, config.block_m) * ceil_div(desc.n, config.block_n);
  // Split-K takes the staged epilogue (the cluster sums its partial tiles in the stages): chosen by shape only where
  // no other schedule was pinned.
  const bool split_by_shape = split_k_built && options.schedule == Sm90Schedule::automatic;
  config.split = options.split > 0 ? options.split : split_by_shape ? sm90_split(tiles, k_tiles, sms) : 1;
  require(config.split == 1 || split_k_built, ErrorCode::unsupported, [&] {
    return "plan: split-K is built for the 2:4 and fp8 kernels with B col-major and n-tiles of 16, 32 or 64, and for "
           "the V:N:M row gather (B row-major, V a multiple of 128) with n-tiles of 64; this plan has block_n " +
           std::to_string(config.block_n);
  });
  require(config.split <= k_tiles, ErrorCode::unsupported, [&] {
    return "nm24 plan: split-K of " + std::to_string(config.split) + " needs as many k-tiles of 64, K has " +
           std::to_string(k_tiles);
  });
  require(config.split == 1 || options.schedule == Sm90Schedule::automatic || options.schedule == Sm90Schedule::staged,
          ErrorCode::unsupported, "nm24 plan: split-K runs the staged schedule only");
  if (config.split > 1) return;
  const Sm90Schedule fitting = sm90_schedule(tiles, config.block_n, final_in_registers, sms);
  const Sm90Schedule chosen = options.schedule == Sm90Schedule::automatic ? fitting : options.schedule;
  require(chosen == Sm90Schedule::staged || fitting != Sm90Schedule::staged, ErrorCode::unsupported, [&] {
    return std::string("nm24 plan: the ") + schedule_name(chosen) +
           " schedule needs a 16-bit D with a stride that is a multiple of 8, beta 0, no GELU and block_n a "
           "multiple of 64";
  });
  config.register_epilogue = chosen != Sm90Schedule::staged;
  if (chosen == Sm90Schedule::persistent) config.persistent_ctas = sms;
}

void take_tile_shape(const TileShape& t, KernelConfig& config) {
  config.block_m = t.block_m, config.block_n = t.block_n, config.block_k = t.block_k, config.stages = t.stages;
  config.threads = t.threads, config.smem_bytes = t.smem_bytes;
}

KernelConfig config_of(Nm24Kernel kernel, const TileShape& t) {
  KernelConfig config;
  config.kernel = kernel;
  take_tile_shape(t, config);
  return config;
}

bool sm90_choice_pinned(const Nm24Options& options) {
  return options.block_n != 0 || options.schedule != Sm90Schedule::automatic || options.raster_rows != 0 ||
         options.split != 0;
}

KernelConfig skinny_config(const SpmmDesc& desc, int64_t cols, const Nm24Options& options, bool sm90_device,
                           const char* who) {
  const TileShape t = skinny_tile_shape(
      options.block_m != 0 ? options.block_m : skinny_block_m(desc.rows, desc.n, device_facts().sm_count),
      options.block_n != 0 ? options.block_n : skinny_block_n(desc.n));
  KernelConfig config = config_of(Nm24Kernel::sm80_mma_sp_skinny, t);
  choose_sm90_schedule(desc, options, ceil_div(cols, int64_t{kPackKAlign}), /*split_k_built=*/false, config);
  // Its split-K sums through a cluster's shared memory, and it waits for the kernel before it too: both sm_90's.
  config.split = options.split > 0 ? options.split : sm90_device ? skinny_split(cols, t.block_m, t.block_n) : 1;
  require(config.split == 1 || sm90_device, ErrorCode::unsupported, [&] {
    return std::string(who) + ": the skinny kernel's split-K needs thread-block clusters (an sm_90 device)";
  });
  config.overlap_launch = sm90_device && options.overlap_launch;
  return config;
}

bool sm90_config_takes_tokens(const SpmmDesc& desc, KernelConfig& config, bool b_element_gather) {
  if (config.kernel != Nm24Kernel::sm90_wgmma_sp) return true;
  if (!b_element_gather && b_leading_dim(desc) % 8 != 0) return false;  // B by TMA or 16-byte copies
  const int64_t d_stride = desc.d_layout == Layout::col_major ? desc.rows : desc.n;
  if (!sm90_epilogue::outputs_final_in_registers(desc.out_dtype != DType::f32, desc.beta, desc.activation, d_stride))
    config.register_epilogue = false, config.persistent_ctas = 0;
  return true;
}

void apply_sm90_schedule(const KernelConfig& config, const void* d, Params& p) {
  if (config.raster_rows > 0) p.group_rows = config.raster_rows;
  p.register_epilogue = config.register_epilogue && aligned16(d);
  p.persistent_ctas = p.register_epilogue ? config.persistent_ctas : 0;
}

// Overlapping launches order themselves by the stream; the legacy default stream's implicit order with other
// streams is not theirs to keep.
LaunchOn launch_on(const KernelConfig& config, cudaStream_t stream) {
  return {stream, config.overlap_launch && stream != nullptr, config.split};
}

// B col-major also needs K % 8 == 0: a 16-byte chunk across K would read the gap past a column (any bits, NaN
// too), which the zero padding of A does not cancel. Chunks across C feed only outputs past C.
bool b_vector_loads(const SpmmDesc& desc, const void* b) {
  return aligned16(b) && b_leading_dim(desc) % 8 == 0 && (desc.b_layout == Layout::row_major || desc.cols % 8 == 0);
}

SkinnyB skinny_b_path(const SpmmDesc& desc, const void* b) {
  if (desc.b_layout != Layout::col_major) return SkinnyB::elements;
  if (b_vector_loads(desc, b)) return SkinnyB::chunks;
  const bool pairs = b_leading_dim(desc) % 2 == 0 && reinterpret_cast<uintptr_t>(b) % 4 == 0;
  return pairs ? SkinnyB::pairs : SkinnyB::elements;
}

bool device_is_sm90() {
  int device = 0, major = 0, minor = 0;
  NMKIT_CUDA_CHECK(cudaGetDevice(&device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

bool sm90_compiled() {
#if defined(NMKIT_HAVE_SM90A)
  return true;
#else
  return false;
#endif
}

}  // namespace nm24

const char* schedule_name(Sm90Schedule s) noexcept {
  switch (s) {
    case Sm90Schedule::automatic:
      return "automatic";
    case Sm90Schedule::staged:
      return "staged";
    case Sm90Schedule::registers:
      return "registers";
    case Sm90Schedule::persistent:
      return "persistent";
  }
  return "?";
}

const char* kernel_name(Nm24Kernel k) noexcept {
  switch (k) {
    case Nm24Kernel::automatic:
      return "automatic";
    case Nm24Kernel::sm80_mma_sp:
      return "sm80_mma_sp";
    case Nm24Kernel::sm90_wgmma_sp:
      return "sm90_wgmma_sp";
    case Nm24Kernel::sm80_mma_sp_skinny:
      return "sm80_mma_sp_skinny";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, const KernelConfig& c) {
  os << kernel_name(c.kernel) << " tile " << c.block_m << "x" << c.block_n << "x" << c.block_k << " stages " << c.stages
     << " threads " << c.threads << " smem " << c.smem_bytes << " B"
     << (c.register_epilogue ? " register epilogue" : "") << (c.overlap_launch ? " overlapped launch" : "");
  if (c.persistent_ctas > 0) os << " persistent " << c.persistent_ctas << " CTAs";
  if (c.raster_rows > 0) os << " raster " << c.raster_rows << " row tiles";
  if (c.split > 1) os << " split-K " << c.split;
  return os;
}

DeviceNm24 DeviceNm24::allocate(int64_t rows, int64_t cols, DType dtype) {
  require(rows >= 1 && cols >= 1 && (dtype == DType::f16 || dtype == DType::bf16), ErrorCode::invalid_argument,
          "DeviceNm24::allocate: needs R, K >= 1 and f16 or bf16");
  DeviceNm24 w;
  w.rows_ = rows, w.cols_ = cols, w.dtype_ = dtype;
  w.rows_padded_ = round_up(rows, kPackRowAlign), w.cols_padded_ = round_up(cols, kPackKAlign);
  // Two bytes per stored value (half of the padded R x K); a 1 KiB metadata tile per 8 KiB value tile.
  const auto value_bytes = static_cast<std::size_t>(w.rows_padded_ * w.cols_padded_);
  w.values_ = DeviceBuffer(value_bytes);
  w.metadata_ = DeviceBuffer(value_bytes / kTileValueBytes * kTileMetaBytes);
  return w;
}

DeviceNm24 DeviceNm24::upload(const PackedNm24& packed) {
  DeviceNm24 w = allocate(packed.rows, packed.cols, packed.dtype);
  require(w.rows_padded_ == packed.rows_padded && w.cols_padded_ == packed.cols_padded &&
              packed.values.size() * sizeof(uint32_t) == w.value_bytes() &&
              packed.metadata.size() * sizeof(uint32_t) == w.metadata_bytes(),
          ErrorCode::invalid_argument, "DeviceNm24::upload: packed arrays do not match the padded shape");
  w.values_.copy_from_host(packed.values.data(), w.value_bytes());
  w.metadata_.copy_from_host(packed.metadata.data(), w.metadata_bytes());
  return w;
}

Nm24SpmmPlan Nm24SpmmPlan::create(const SpmmDesc& desc, const Nm24Options& options) {
  nm24::check_desc(desc, "nm24 plan");
  nm24::check_options(options, "nm24 plan");

  Nm24SpmmPlan plan;
  plan.desc_ = desc;
  // TMA reads B along its contiguous dimension: K for B col-major, C for B row-major (16-byte row strides).
  const bool b_col_major = desc.b_layout == Layout::col_major;
  const bool sm90_device = nm24::sm90_compiled() && nm24::device_is_sm90();
  const bool sm90_possible = sm90_device && nm24::b_leading_dim(desc) % 8 == 0;
  Nm24Kernel kernel = options.kernel;
  // The skinny kernel where it was measured faster (on Hopper), unless a choice of the sm90 kernel was pinned.
  if (kernel == Nm24Kernel::automatic && sm90_device && !nm24::sm90_choice_pinned(options) &&
      nm24::skinny_takes(desc.rows, desc.cols, desc.n))
    kernel = Nm24Kernel::sm80_mma_sp_skinny;
  if (kernel == Nm24Kernel::automatic) kernel = sm90_possible ? Nm24Kernel::sm90_wgmma_sp : Nm24Kernel::sm80_mma_sp;
  require(kernel != Nm24Kernel::sm90_wgmma_sp || sm90_possible, ErrorCode::unsupported,
          "nm24 plan: the sm90 wgmma.sp kernel needs an sm_90 device, a build with sm_90a, and B's leading dimension "
          "(ldb, else K for B col-major or C for B row-major) a multiple of 8");
  require(options.block_n == 0 || b_col_major || options.block_n % 64 == 0, ErrorCode::unsupported, [&] {
    return "nm24 plan: with B row-major the sm90 kernel's block_n is 64, 128, 192 or 256, got " +
           std::to_string(options.block_n);
  });
  const nm24::SplitK split_by_shape = b_col_major && options.schedule == Sm90Schedule::automatic && options.split == 0
                                          ? nm24::SplitK::by_shape
                                          : nm24::SplitK::off;
  const std::span<const nm24::BlockNChoice> choices = b_col_major
                                                          ? std::span<const nm24::BlockNChoice>(nm24::kColMajorBlockN)
                                                          : std::span<const nm24::BlockNChoice>(nm24::kRowMajorBlockN);
  if (kernel == Nm24Kernel::sm80_mma_sp_skinny) {
    plan.config_ = nm24::skinny_config(desc, desc.cols, options, sm90_device, "nm24 plan");
    return plan;
  }
  nm24::TileShape t = nm24::sm80_tile_shape();
  if (kernel == Nm24Kernel::sm90_wgmma_sp)
    t = nm24::sm90_tile_shape(
        options.block_n != 0
            ? options.block_n
            : nm24::sm90_block_n(desc.rows, desc.cols, desc.n, nm24::device_facts().sm_count, choices, split_by_shape));
  plan.config_ = nm24::config_of(kernel, t);
  const bool split_k_built = kernel == Nm24Kernel::sm90_wgmma_sp && b_col_major && t.block_n <= nm24::kMaxSplitBlockN;
  nm24::choose_sm90_schedule(desc, options, ceil_div(desc.cols, int64_t{kPackKAlign}), split_k_built, plan.config_);
  if (plan.config_.split > 1) nm24::take_tile_shape(nm24::sm90_tile_shape(t.block_n, /*split_k=*/true), plan.config_);
  return plan;
}

Nm24SpmmPlan Nm24SpmmPlan::for_tokens(int64_t n, int64_t ldb) const {
  require(n >= 0, ErrorCode::invalid_argument, [&] { return "nm24 plan: C must be >= 0, got " + std::to_string(n); });
  Nm24SpmmPlan plan = *this;
  plan.desc_.n = n, plan.desc_.ldb = ldb;
  nm24::check_b_shape(plan.desc_, "nm24 plan");
  if (!nm24::sm90_config_takes_tokens(plan.desc_, plan.config_)) {
    const nm24::TileShape t = nm24::sm80_tile_shape();
    plan.config_ = nm24::config_of(Nm24Kernel::sm80_mma_sp, t);
  }
  return plan;
}

namespace {

// Everything a description fixes that can change the best tile.
std::string autotune_key(const SpmmDesc& d) {
  std::ostringstream key;
  key << d.rows << 'x' << d.cols << 'x' << d.n << ' ' << dtype_name(d.dtype) << ' ' << dtype_name(d.out_dtype) << ' '
      << layout_name(d.d_layout) << ' ' << (d.beta != 0.0f) << d.bias << static_cast<int>(d.activation);
  return key.str();
}

constexpr int kAutotuneWarmup = 1;
constexpr int kAutotuneRuns = 3;

}  // namespace

Nm24SpmmPlan Nm24SpmmPlan::autotune(const SpmmDesc& desc) {
  const Nm24SpmmPlan heuristic = create(desc);
  if (heuristic.config().kernel != Nm24Kernel::sm90_wgmma_sp || desc.n == 0) return heuristic;
  static std::mutex mutex;
  static std::map<std::string, int> cache;
  const std::string key = autotune_key(desc);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = cache.find(key); it != cache.end())
      return create(desc, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = it->second});
  }
  // Non-zero operands (constant patterns; valid 2:4 metadata) in temporary buffers.
  DeviceNm24 a = DeviceNm24::allocate(desc.rows, desc.cols, desc.dtype);
  constexpr int kHalfPattern = 0x3c, kMetadataPattern = 0x44;  // ~1.06 in f16; indices (0, 1) in every group
  NMKIT_CUDA_CHECK(cudaMemset(a.values(), kHalfPattern, a.value_bytes()));
  NMKIT_CUDA_CHECK(cudaMemset(a.metadata(), kMetadataPattern, a.metadata_bytes()));
  const std::size_t b_bytes = static_cast<std::size_t>(desc.cols * desc.n) * dtype_size(desc.dtype);
  const std::size_t out_bytes = static_cast<std::size_t>(desc.rows * desc.n) * dtype_size(desc.out_dtype);
  const std::size_t bias_bytes = static_cast<std::size_t>(desc.rows) * sizeof(float);
  const DeviceBuffer b_buffer(b_bytes), c_buffer(out_bytes), d_buffer(out_bytes), bias_buffer(bias_bytes);
  void *b = b_buffer.data(), *c = c_buffer.data(), *d = d_buffer.data(), *bias = bias_buffer.data();
  NMKIT_CUDA_CHECK(cudaMemset(b, kHalfPattern, b_bytes));
  NMKIT_CUDA_CHECK(cudaMemset(c, 0, out_bytes));
  NMKIT_CUDA_CHECK(cudaMemset(bias, 0, bias_bytes));
  struct Event {  // destroyed on every path out, a thrown error included
    cudaEvent_t event = nullptr;
    Event() { NMKIT_CUDA_CHECK(cudaEventCreate(&event)); }
    ~Event() { cudaEventDestroy(event); }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
  };
  const Event start_event, stop_event;
  cudaEvent_t start = start_event.event, stop = stop_event.event;
  int best = heuristic.config().block_n;
  float best_ms = 1e30f;
  for (int block_n : {256, 192, 128, 64, 32, 16}) {
    if (desc.b_layout == Layout::row_major && block_n % 64 != 0) continue;  // whole MN-major boxes only
    const Nm24SpmmPlan candidate = create(desc, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = block_n});
    for (int i = 0; i < kAutotuneWarmup; ++i) candidate.run(nullptr, a, b, c, d, static_cast<const float*>(bias));
    float times[kAutotuneRuns];
    for (float& t : times) {
      NMKIT_CUDA_CHECK(cudaEventRecord(start));
      candidate.run(nullptr, a, b, c, d, static_cast<const float*>(bias));
      NMKIT_CUDA_CHECK(cudaEventRecord(stop));
      NMKIT_CUDA_CHECK(cudaEventSynchronize(stop));
      NMKIT_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    }
    std::sort(times, times + kAutotuneRuns);
    if (times[kAutotuneRuns / 2] < best_ms) best_ms = times[kAutotuneRuns / 2], best = block_n;
  }
  {
    const std::lock_guard<std::mutex> lock(mutex);
    cache[key] = best;
  }
  return create(desc, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = best});
}

void Nm24SpmmPlan::run(Stream stream, const DeviceNm24& a, const void* b, const void* c, void* d,
                       const float* bias) const {
  require(a.rows() == desc_.rows && a.cols() == desc_.cols && a.dtype() == desc_.dtype, ErrorCode::invalid_argument,
          [&] {
            return "nm24 run: weight is " + std::to_string(a.rows()) + "x" + std::to_string(a.cols()) + " " +
                   dtype_name(a.dtype()) + ", the plan was made for " + std::to_string(desc_.rows) + "x" +
                   std::to_string(desc_.cols) + " " + dtype_name(desc_.dtype);
          });
  if (desc_.n == 0) return;
  nm24::check_operands(desc_, b, c, d, bias, "nm24 run");

  nm24::Params p = nm24::make_params(desc_, a, b, c, d, bias);
  nm24::apply_sm90_schedule(config_, d, p);
  const bool vector_b = nm24::b_vector_loads(desc_, b);
  // The sm90 kernel's tensor map needs a 16-byte aligned B; otherwise this call takes the portable kernel.
  const bool sm90 = config_.kernel == Nm24Kernel::sm90_wgmma_sp && nm24::aligned16(b);
  const bool skinny = config_.kernel == Nm24Kernel::sm80_mma_sp_skinny;
  nm24::dispatch_types(desc_, [&]<class Element, class Out>() {
    if (sm90)
      nm24::launch_sm90<Element, Out>(p, config_.block_n, nm24::launch_on(config_, stream));
    else if (skinny)
      nm24::launch_skinny<Element, Out>(p, config_.block_m, config_.block_n, nm24::skinny_b_path(desc_, b),
                                        nm24::launch_on(config_, stream));
    else
      nm24::launch_sm80<Element, Out>(p, desc_.b_layout, vector_b, stream);
  });
}

}  // namespace nmkit::gpu
