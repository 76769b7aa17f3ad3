// Per-token absmax quantization of activations: one CTA per token reduces |x| over the row, then writes each code
// as x / scale rounded to nearest even and saturated, the conversions of quantize_rows (src/format/quantized.cpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "../common/check.cuh"
#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/quantize_tokens.hpp"

namespace nmkit::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kVector = 8;  // 16-byte loads of 16-bit inputs, 8-byte stores of codes

template <class In>
__device__ __forceinline__ float to_float(In v) {
  if constexpr (std::is_same_v<In, __half>)
    return __half2float(v);
  else
    return __bfloat162float(v);
}

template <QuantType kType>
__device__ __forceinline__ uint8_t to_code(float v) {
  if constexpr (kType == QuantType::int8) {
    // Round to nearest even, then clamp to the symmetric range; NaN converts to 0 as on the host.
    const int rounded = __float2int_rn(v);
    return static_cast<uint8_t>(static_cast<int8_t>(max(-127, min(127, rounded))));
  } else {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kType == QuantType::e4m3 ? __NV_E4M3 : __NV_E5M2);
  }
}

template <QuantType kType>
__device__ __forceinline__ float scale_for(float absmax) {
  constexpr float kMax = kType == QuantType::e4m3 ? 448.0f : kType == QuantType::e5m2 ? 57344.0f : 127.0f;
  if (absmax == 0.0f) return 0.0f;
  const float scale = absmax / kMax;
  return scale > 0.0f ? scale : std::numeric_limits<float>::denorm_min();
}

// The CTA's largest |x| and whether every value was finite, in every thread.
__device__ __forceinline__ float reduce_absmax(float absmax, bool& finite) {
  __shared__ float warp_max[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = absmax;
  finite = __syncthreads_and(finite);
  absmax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) absmax = fmaxf(absmax, warp_max[w]);
  return absmax;
}

// kVectors: the row is read 8 values at a time (16-byte aligned rows, cols % 8 == 0), else one at a time.
template <class In, QuantType kType, bool kVectors>
__global__ void __launch_bounds__(kThreads)
    quantize_tokens_kernel(const In* __restrict__ x, int64_t cols, uint8_t* __restrict__ codes,
                           float* __restrict__ scales) {
  const int64_t token = blockIdx.x;
  const In* row = x + token * cols;
  uint8_t* out = codes + token * cols;
  float absmax = 0.0f;
  bool finite = true;
  const auto observe = [&](float v) {
    finite &= isfinite(v);
    absmax = fmaxf(absmax, fabsf(v));
  };
  if constexpr (kVectors) {
    for (int64_t c = int64_t{threadIdx.x} * kVector; c < cols; c += int64_t{kThreads} * kVector) {
      const uint4 packed = *reinterpret_cast<const uint4*>(row + c);
      const In* v = reinterpret_cast<const In*>(&packed);
#pragma unroll
      for (int i = 0; i < kVector; ++i) observe(to_float(v[i]));
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) observe(to_float(row[c]));
  }
  const float scale = scale_for<kType>(reduce_absmax(absmax, finite));
  if (threadIdx.x == 0) scales[token] = finite ? scale : std::numeric_limits<float>::quiet_NaN();
  // An all-zero row keeps zero codes without dividing by its zero scale.
  const auto code = [&](float v) { return scale == 0.0f ? uint8_t{0} : to_code<kType>(v / scale); };
  if constexpr (kVectors) {
    for (int64_t c = int64_t{threadIdx.x} * kVector; c < cols; c += int64_t{kThreads} * kVector) {
      const uint4 packed = *reinterpret_cast<const uint4*>(row + c);
      const In* v = reinterpret_cast<const In*>(&packed);
      uint8_t bytes[kVector];
#pragma unroll
      for (int i = 0; i < kVector; ++i) bytes[i] = code(to_float(v[i]));
      *reinterpret_cast<uint2*>(out + c) = *reinterpret_cast<const uint2*>(bytes);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) out[c] = code(to_float(row[c]));
  }
}

template <class In, QuantType kType>
void launch(cudaStream_t stream, const void* x, int64_t tokens, int64_t cols, uint8_t* codes, float* scales) {
  const bool vectors = cols % kVector == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(codes) % kVector == 0;
  const auto grid = dim3(static_cast<unsigned>(tokens));
  if (vectors)
    quantize_tokens_kernel<In, kType, true>
        <<<grid, kThreads, 0, stream>>>(static_cast<const In*>(x), cols, codes, scales);
  else
    quantize_tokens_kernel<In, kType, false>
        <<<grid, kThreads, 0, stream>>>(static_cast<const In*>(x), cols, codes, scales);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

template <class In>
void launch_type(cudaStream_t stream, const void* x, int64_t tokens, int64_t cols, QuantType type, uint8_t* codes,
                 float* scales) {
  switch (type) {
    case QuantType::e4m3:
      return launch<In, QuantType::e4m3>(stream, x, tokens, cols, codes, scales);
    case QuantType::e5m2:
      return launch<In, QuantType::e5m2>(stream, x, tokens, cols, codes, scales);
    case QuantType::int8:
      return launch<In, QuantType::int8>(stream, x, tokens, cols, codes, scales);
  }
}

}  // namespace

void quantize_tokens(Stream stream, const void* x, DType x_dtype, int64_t tokens, int64_t cols, QuantType type,
                     uint8_t* codes, float* scales) {
  require(x_dtype == DType::f16 || x_dtype == DType::bf16, ErrorCode::unsupported,
          [&] { return std::string("quantize_tokens: x must be f16 or bf16, got ") + dtype_name(x_dtype); });
  require(tokens >= 0 && cols >= 0, ErrorCode::invalid_argument, [&] {
    return "quantize_tokens: needs tokens, cols >= 0, got " + std::to_string(tokens) + " x " + std::to_string(cols);
  });
  require(tokens < (int64_t{1} << 31), ErrorCode::unsupported, "quantize_tokens: at most 2^31 - 1 tokens");
  if (tokens == 0) return;
  require(scales != nullptr && (cols == 0 || (x != nullptr && codes != nullptr)), ErrorCode::invalid_argument,
          "quantize_tokens: x, codes and scales must not be null");
  if (x_dtype == DType::f16)
    launch_type<__half>(stream, x, tokens, cols, type, codes, scales);
  else
    launch_type<__nv_bfloat16>(stream, x, tokens, cols, type, codes, scales);
}

}  // namespace nmkit::gpu::detail
