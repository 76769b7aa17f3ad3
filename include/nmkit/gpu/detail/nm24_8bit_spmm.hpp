#pragma once
// The 8-bit 2:4 SpMM on Hopper (fp8 e4m3 or e5m2, int8), cpu/quantized_spmm.hpp's product:
// D = act(alpha * scale_w[r] * scale_x[t] * dot(r, t) + bias + beta * C), W an 8-bit 2:4 weight (pack_nm24 of a
// QuantizedNmMatrix), x codes of the same type with a scale per token (quantize_tokens). fp8 dot products accumulate
// in the tensor cores' fp32, int8 ones exactly in int32. Kept in detail/ until its API has settled.
//   DeviceNm24x8 w = DeviceNm24x8::upload(pack_nm24(quantize_nm(compress_nm(...), QuantType::e4m3)));
//   Nm24x8SpmmPlan::create({R, K, T}).run(stream, w, x_codes, x_scales, nullptr, y);
#include <cstdint>

#include "nmkit/gpu/detail/nm24_pack_8bit.hpp"
#include "nmkit/gpu/detail/device_buffer.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu::detail {

// A packed 8-bit weight and its per-row scales in device memory (owning; move-only).
class DeviceNm24x8 {
 public:
  static DeviceNm24x8 upload(const PackedNm24x8& packed);  // throws Error on inconsistent arrays, or cuda_error
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int64_t cols_padded() const noexcept { return cols_padded_; }
  QuantType type() const noexcept { return type_; }
  const void* values() const noexcept { return values_.data(); }
  const void* metadata() const noexcept { return metadata_.data(); }
  const float* scales() const noexcept { return static_cast<const float*>(scales_.data()); }

 private:
  int64_t rows_ = 0, cols_ = 0, cols_padded_ = 0;
  QuantType type_ = QuantType::e4m3;
  DeviceBuffer values_, metadata_, scales_;
};

struct QuantizedSpmmDesc {
  int64_t rows = 0, cols = 0, n = 0;    // R, K (a multiple of 16: x's rows are TMA rows), C (tokens)
  QuantType type = QuantType::e4m3;     // of weight and activations: e4m3, e5m2 or int8
  DType out_dtype = DType::f16;         // C and D: f16, bf16 or f32
  Layout d_layout = Layout::col_major;  // col_major: D[r, t] at t * R + r (y[T, R] row-major)
  float alpha = 1.0f, beta = 0.0f;      // C is read when beta != 0
  bool bias = false;                    // fp32, length R
  Activation activation = Activation::none;
};

class Nm24x8SpmmPlan {
 public:
  // Validates desc and options (Nm24Options as for 2:4; the kernel is the Hopper one); throws Error.
  static Nm24x8SpmmPlan create(const QuantizedSpmmDesc& desc, const Nm24Options& options = {});
  // x: C x K codes, row-major, 16-byte aligned; x_scales: C floats; c, d: R x C; bias: R floats. Never synchronises.
  void run(Stream stream, const DeviceNm24x8& a, const uint8_t* x, const float* x_scales, const void* c, void* d,
           const float* bias = nullptr) const;
  const QuantizedSpmmDesc& desc() const noexcept { return desc_; }
  const KernelConfig& config() const noexcept { return config_; }

 private:
  QuantizedSpmmDesc desc_;
  KernelConfig config_;
};

}  // namespace nmkit::gpu::detail
