// Host side of the 8-bit (fp8, int8) 2:4 SpMM: the device weight, plan creation (validation, kernel, tile and
// schedule as for 2:4) and run().
#include <cuda_runtime.h>

#include <span>
#include <string>

#include "../common/check.cuh"
#include "nm24_common.cuh"
#include "nmkit/gpu/detail/nm24_8bit_spmm.hpp"
#include "nmkit/gpu/detail/nm24_layout_8bit.hpp"

namespace nmkit::gpu::detail {
namespace {

// The 2:4 plan helpers take an SpmmDesc: the same product with 16-bit placeholders for the operand types.
SpmmDesc as_spmm_desc(const QuantizedSpmmDesc& d) {
  SpmmDesc s;
  s.rows = d.rows, s.cols = d.cols, s.n = d.n;
  // A 16-bit stand-in for the 8-bit input, paired so that the 2:4 checks accept every output dtype (f16, bf16, f32).
  s.dtype = d.out_dtype == DType::bf16 ? DType::bf16 : DType::f16, s.out_dtype = d.out_dtype;
  s.b_layout = Layout::col_major, s.d_layout = d.d_layout;
  s.alpha = d.alpha, s.beta = d.beta, s.bias = d.bias, s.activation = d.activation;
  return s;
}

constexpr int64_t kTmaRowElements = 16;          // x's rows are TMA rows: 16-byte strides
constexpr int64_t kInt8MaxK = int64_t{1} << 18;  // 2^17 kept products of 127^2 each stay below 2^31

}  // namespace

DeviceNm24x8 DeviceNm24x8::upload(const PackedNm24x8& packed) {
  require(packed.rows >= 1 && packed.cols >= 1 && packed.rows_padded >= packed.rows &&
              packed.cols_padded >= packed.cols &&
              packed.values.size() * sizeof(uint32_t) ==
                  static_cast<std::size_t>(packed.rows_padded * packed.cols_padded / 2) &&
              packed.metadata.size() * sizeof(uint32_t) ==
                  static_cast<std::size_t>(packed.rows_padded * packed.cols_padded / 8) &&
              packed.scales.size() == static_cast<std::size_t>(packed.rows_padded),
          ErrorCode::invalid_argument, "DeviceNm24x8::upload: packed arrays do not match the padded shape");
  DeviceNm24x8 w;
  w.rows_ = packed.rows, w.cols_ = packed.cols, w.cols_padded_ = packed.cols_padded, w.type_ = packed.type;
  w.values_ = DeviceBuffer(packed.values.size() * sizeof(uint32_t));
  w.metadata_ = DeviceBuffer(packed.metadata.size() * sizeof(uint32_t));
  w.scales_ = DeviceBuffer(packed.scales.size() * sizeof(float));
  w.values_.copy_from_host(packed.values.data(), w.values_.size());
  w.metadata_.copy_from_host(packed.metadata.data(), w.metadata_.size());
  w.scales_.copy_from_host(packed.scales.data(), w.scales_.size());
  return w;
}

Nm24x8SpmmPlan Nm24x8SpmmPlan::create(const QuantizedSpmmDesc& desc, const Nm24Options& options) {
  const SpmmDesc spmm = as_spmm_desc(desc);
  nm24::check_desc(spmm, "8-bit plan");
  nm24::check_options(options, "8-bit plan");
  // int8 sums are exact in int32 while K / 2 kept products of at most 127^2 stay below 2^31.
  require(desc.type != QuantType::int8 || desc.cols <= kInt8MaxK, ErrorCode::unsupported, [&] {
    return "8-bit plan: int8 takes K up to " + std::to_string(kInt8MaxK) + " (exact int32 sums), got " +
           std::to_string(desc.cols);
  });
  require(desc.cols % kTmaRowElements == 0, ErrorCode::unsupported, [&] {
    return "8-bit plan: K must be a multiple of 16 (x's rows are read by TMA), got " + std::to_string(desc.cols);
  });
  require(nm24::sm90_compiled() && nm24::device_is_sm90(), ErrorCode::unsupported,
          "8-bit plan: the 8-bit kernels need an sm_90 device and a build with sm_90a");
  require(options.kernel != Nm24Kernel::sm80_mma_sp, ErrorCode::unsupported,
          "8-bit plan: there is no portable 8-bit kernel; the Hopper and skinny ones run it");
  Nm24x8SpmmPlan plan;
  plan.desc_ = desc;
  const bool skinny = options.kernel == Nm24Kernel::sm80_mma_sp_skinny ||
                      (options.kernel == Nm24Kernel::automatic && !nm24::sm90_choice_pinned(options) &&
                       nm24::skinny_takes_8bit(desc.rows, desc.cols, desc.n));
  if (skinny) {
    require(options.block_n <= nm24::kSkinnyMax8BitBlockN, ErrorCode::unsupported, [&] {
      return "8-bit plan: the skinny kernel takes block_n 8 or 16 on 8-bit codes, got " +
             std::to_string(options.block_n);
    });
    plan.config_ =
        nm24::skinny_config(spmm, nm24::skinny_cols_of_8bit(desc.cols), options, /*sm90_device=*/true, "8-bit plan");
    return plan;
  }
  // The 2:4 kernel's tiles and costs: 8 bits double the math rate and halve the bytes of both, so the choice stands;
  // a pipeline round moves a k-tile of 128 codes.
  const nm24::SplitK split_by_shape =
      options.schedule == Sm90Schedule::automatic && options.split == 0 ? nm24::SplitK::by_shape : nm24::SplitK::off;
  const int block_n = options.block_n != 0
                          ? options.block_n
                          : nm24::sm90_block_n(desc.rows, desc.cols, desc.n, nm24::device_facts().sm_count,
                                               nm24::kColMajorBlockN, split_by_shape, x8::kPackKAlign);
  const nm24::TileShape t = nm24::sm90_8bit_tile_shape(block_n);
  plan.config_ = nm24::config_of(Nm24Kernel::sm90_wgmma_sp, t);
  nm24::choose_sm90_schedule(spmm, options, ceil_div(desc.cols, int64_t{x8::kPackKAlign}),
                             /*split_k_built=*/t.block_n <= nm24::kMaxSplitBlockN, plan.config_);
  if (plan.config_.split > 1)
    nm24::take_tile_shape(nm24::sm90_8bit_tile_shape(block_n, /*split_k=*/true), plan.config_);
  return plan;
}

void Nm24x8SpmmPlan::run(Stream stream, const DeviceNm24x8& a, const uint8_t* x, const float* x_scales, const void* c,
                         void* d, const float* bias) const {
  require(a.rows() == desc_.rows && a.cols() == desc_.cols && a.type() == desc_.type, ErrorCode::invalid_argument, [&] {
    return "8-bit run: weight is " + std::to_string(a.rows()) + "x" + std::to_string(a.cols()) + " " +
           quant_type_name(a.type()) + ", the plan was made for " + std::to_string(desc_.rows) + "x" +
           std::to_string(desc_.cols) + " " + quant_type_name(desc_.type);
  });
  if (desc_.n == 0) return;
  const SpmmDesc spmm = as_spmm_desc(desc_);
  require(x != nullptr && x_scales != nullptr && nm24::aligned16(x), ErrorCode::invalid_argument,
          "8-bit run: x and its scales must not be null, and x must be 16-byte aligned");
  nm24::check_operands(spmm, x, c, d, bias, "8-bit run");
  nm24::Params p{static_cast<const uint32_t*>(a.values()),
                 static_cast<const uint32_t*>(a.metadata()),
                 x,
                 c,
                 d,
                 desc_.bias ? bias : nullptr,
                 desc_.rows,
                 desc_.cols,
                 desc_.n,
                 a.cols_padded() / x8::kFragmentK,  // k-blocks of one k64 step
                 desc_.alpha,
                 desc_.beta,
                 desc_.activation,
                 desc_.d_layout == Layout::col_major,
                 true,
                 static_cast<int32_t>(desc_.cols)};  // x's codes: dense rows of K
  nm24::apply_sm90_schedule(config_, d, p);
  const nm24::LaunchOn on = nm24::launch_on(config_, stream);
  const auto launch = [&]<class Element>() {
    if (config_.kernel == Nm24Kernel::sm80_mma_sp_skinny) {
      const nm24::CodeScales scales{a.scales(), x_scales};
      const auto skinny = [&]<class Out>() {
        nm24::launch_skinny<Element, Out>(p, config_.block_m, config_.block_n, nm24::SkinnyB::chunks, on, scales);
      };
      if (desc_.out_dtype == DType::f32)
        skinny.template operator()<float>();
      else if (desc_.out_dtype == DType::bf16)
        skinny.template operator()<__nv_bfloat16>();
      else
        skinny.template operator()<__half>();
      return;
    }
    if (desc_.out_dtype == DType::f32)
      nm24::launch_sm90_8bit<Element, float>(p, a.scales(), x_scales, config_.block_n, on);
    else if (desc_.out_dtype == DType::bf16)
      nm24::launch_sm90_8bit<Element, __nv_bfloat16>(p, a.scales(), x_scales, config_.block_n, on);
    else
      nm24::launch_sm90_8bit<Element, __half>(p, a.scales(), x_scales, config_.block_n, on);
  };
  switch (desc_.type) {
    case QuantType::e4m3:
      return launch.template operator()<__nv_fp8_e4m3>();
    case QuantType::e5m2:
      return launch.template operator()<__nv_fp8_e5m2>();
    case QuantType::int8:
      return launch.template operator()<int8_t>();
  }
}

}  // namespace nmkit::gpu::detail
