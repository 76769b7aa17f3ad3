// quantize_tokens against quantize_rows, the CPU reference, bit for bit: codes and scales of random f16 and bf16
// activations over odd shapes, zero and tiny rows, vector and unaligned paths; non-finite tokens get a NaN scale.
#include "nmkit/gpu/detail/quantize_tokens.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "gpu_test_util.hpp"
#include "nmkit/error.hpp"

namespace nmkit::gpu {
namespace {

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

// Runs the GPU quantizer on `x` (rounded to dtype) placed `offset` bytes into its buffer; outputs poisoned first.
Quantized on_gpu(const std::vector<float>& x, int64_t tokens, int64_t cols, DType dtype, QuantType type,
                 std::size_t offset) {
  const std::vector<std::byte> bytes = encode(x, dtype);
  DeviceBytes input(bytes.size() + offset), codes(x.size()), scales(tokens * sizeof(float));
  auto* x_device = static_cast<std::byte*>(input.ptr) + offset;
  check(cudaMemcpy(x_device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "copy x");
  check(cudaMemset(codes.ptr, 0xa5, x.size() + 16), "poison codes");
  check(cudaMemset(scales.ptr, 0xff, tokens * sizeof(float) + 16), "poison scales");
  detail::quantize_tokens(nullptr, x_device, dtype, tokens, cols, type, static_cast<uint8_t*>(codes.ptr),
                          static_cast<float*>(scales.ptr));
  check(cudaDeviceSynchronize(), "quantize_tokens");
  Quantized q{std::vector<uint8_t>(x.size()), std::vector<float>(tokens)};
  check(cudaMemcpy(q.codes.data(), codes.ptr, x.size(), cudaMemcpyDeviceToHost), "copy codes");
  check(cudaMemcpy(q.scales.data(), scales.ptr, tokens * sizeof(float), cudaMemcpyDeviceToHost), "copy scales");
  return q;
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

TEST(QuantizeTokensGpu, MatchesTheCpuReferenceBitForBit) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t tokens, cols;
  };
  uint32_t seed = 100;
  for (DType dtype : {DType::f16, DType::bf16})
    for (QuantType type : {QuantType::e4m3, QuantType::e5m2, QuantType::int8})
      for (const Shape& s : {Shape{1, 1}, Shape{3, 7}, Shape{17, 1000}, Shape{64, 4096}, Shape{5, 4099}})
        for (std::size_t offset : {std::size_t{0}, std::size_t{2}}) {  // 2: x not 16-byte aligned
          std::vector<float> x = rounded_random(static_cast<std::size_t>(s.tokens * s.cols), dtype, seed++);
          if (s.tokens > 2) {
            std::fill(x.begin(), x.begin() + s.cols, 0.0f);  // an all-zero token: scale 0, zero codes
            for (int64_t c = 0; c < s.cols; ++c)             // a tiny one: a tiny scale
              x[s.cols + c] = round_to(dtype, x[s.cols + c] * 1e-6f);
          }
          const QuantizedRows want = quantize_rows(x, s.tokens, s.cols, type);
          const Quantized got = on_gpu(x, s.tokens, s.cols, dtype, type, offset);
          const std::string what = std::string(dtype_name(dtype)) + " " + quant_type_name(type) + " " +
                                   std::to_string(s.tokens) + "x" + std::to_string(s.cols) + " offset " +
                                   std::to_string(offset);
          for (int64_t t = 0; t < s.tokens; ++t)
            ASSERT_EQ(bits(got.scales[t]), bits(want.scales[t])) << what << " token " << t;
          for (std::size_t i = 0; i < x.size(); ++i)
            ASSERT_EQ(got.codes[i], want.values.codes[i]) << what << " element " << i << " of value " << x[i];
        }
}

TEST(QuantizeTokensGpu, NonFiniteTokensGetANanScaleAndLeaveTheOthersAlone) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kTokens = 4, kCols = 96;
  std::vector<float> x = rounded_random(kTokens * kCols, DType::f16, 7);
  x[1 * kCols + 5] = std::numeric_limits<float>::infinity();
  x[2 * kCols + 90] = std::numeric_limits<float>::quiet_NaN();
  const Quantized got = on_gpu(x, kTokens, kCols, DType::f16, QuantType::e4m3, 0);
  EXPECT_TRUE(std::isnan(got.scales[1]));
  EXPECT_TRUE(std::isnan(got.scales[2]));
  for (int64_t t : {0, 3}) {
    const std::vector<float> row(x.begin() + t * kCols, x.begin() + (t + 1) * kCols);
    const QuantizedRows want = quantize_rows(row, 1, kCols, QuantType::e4m3);
    EXPECT_EQ(bits(got.scales[t]), bits(want.scales[0])) << "token " << t;
    for (int64_t c = 0; c < kCols; ++c) EXPECT_EQ(got.codes[t * kCols + c], want.values.codes[c]) << t << ", " << c;
  }
}

TEST(QuantizeTokensGpu, RefusesWhatItCannotQuantize) {
  SKIP_WITHOUT_GPU();
  DeviceBytes x(64), codes(64), scales(16);
  auto* c = static_cast<uint8_t*>(codes.ptr);
  auto* s = static_cast<float*>(scales.ptr);
  EXPECT_NMKIT_ERROR(detail::quantize_tokens(nullptr, x.ptr, DType::f32, 1, 8, QuantType::e4m3, c, s),
                     ErrorCode::unsupported, "f16 or bf16");
  EXPECT_NMKIT_ERROR(detail::quantize_tokens(nullptr, x.ptr, DType::f16, -1, 8, QuantType::e4m3, c, s),
                     ErrorCode::invalid_argument, "tokens, cols >= 0");
  EXPECT_NMKIT_ERROR(detail::quantize_tokens(nullptr, nullptr, DType::f16, 1, 8, QuantType::int8, c, s),
                     ErrorCode::invalid_argument, "must not be null");
  EXPECT_NO_THROW(detail::quantize_tokens(nullptr, nullptr, DType::f16, 0, 8, QuantType::int8, nullptr, nullptr));
}

}  // namespace
}  // namespace nmkit::gpu
