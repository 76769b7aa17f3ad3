#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "nmkit/dtype.hpp"
#include "nmkit/error.hpp"
#include "nmkit/matrix.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

TEST(Half, ExactValuesRoundTrip) {
  for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* min normal */,
                  5.9604644775390625e-08f /* min subnormal */})
    EXPECT_EQ(Half::from_float(x).to_float(), x) << x;
}

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(Half::from_float(1.0f + 1.0f / 2048).to_float(), 1.0f);                // tie -> even (down)
  EXPECT_EQ(Half::from_float(1.0f + 3.0f / 2048).to_float(), 1.0f + 2.0f / 1024);  // tie -> even (up)
  EXPECT_EQ(Half::from_float(1.0f + 1.5f / 2048).to_float(), 1.0f + 1.0f / 1024);  // above the tie
}

TEST(Half, OverflowAndSpecials) {
  EXPECT_TRUE(std::isinf(Half::from_float(65520.0f).to_float()));
  EXPECT_EQ(Half::from_float(65519.0f).to_float(), 65504.0f);
  EXPECT_TRUE(std::isnan(Half::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  EXPECT_EQ(Half::from_float(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_EQ(Half::from_float(1e-9f).to_float(), 0.0f);
}

TEST(Half, MatchesAllBitPatterns) {
  // Every finite half converts to float and back unchanged.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Half h{static_cast<uint16_t>(bits)};
    const float f = h.to_float();
    if (std::isnan(f)) continue;
    EXPECT_EQ(Half::from_float(f).bits, h.bits) << std::hex << bits;
  }
}

// Each half from its fields by ldexp, independent of the bit tricks in Half::to_float; NaNs keep their payload.
float half_from_fields(uint32_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const int exp = static_cast<int>((bits >> 10) & 0x1fu);
  const int mant = static_cast<int>(bits & 0x3ffu);
  if (exp == 31)
    return std::bit_cast<float>((negative ? 0x80000000u : 0u) | 0x7f800000u | static_cast<uint32_t>(mant) << 13);
  const float magnitude = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                                   : std::ldexp(1.0f + static_cast<float>(mant) / 1024.0f, exp - 15);
  return negative ? -magnitude : magnitude;
}

TEST(Half, ToFloatIsExactForEveryBitPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float got = Half{static_cast<uint16_t>(bits)}.to_float();
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(half_from_fields(bits))) << std::hex << bits;
  }
}

#if defined(__SSE__)
// Subnormal halves are normal floats: a thread that treats float denormals as zero (DAZ and FTZ, as
// torch.set_flush_denormal(True) sets them) still converts them exactly.
TEST(Half, SubnormalsSurviveFlushedDenormals) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // DAZ (bit 6) and FTZ (bit 15)
  float smallest = 0.0f, largest = 0.0f;
  for (uint32_t bits = 1; bits < 0x400; ++bits) {
    const float got = Half{static_cast<uint16_t>(bits)}.to_float();
    if (bits == 1) smallest = got;
    if (bits == 0x3ff) largest = got;
    if (got != std::ldexp(static_cast<float>(bits), -24)) ADD_FAILURE() << std::hex << bits;
  }
  _mm_setcsr(saved);
  EXPECT_EQ(smallest, 5.9604644775390625e-08f);
  EXPECT_EQ(largest, 6.097555160522461e-05f);
}
#endif

TEST(TypedBuffer, ToFloatMatchesEachElement) {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    // Every 16-bit pattern (for f32, in the high half of a word), specials and subnormals included.
    TypedBuffer b(dtype, 0x10000);
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      const uint32_t word = dtype == DType::f32 ? bits << 16 | 0x1234u : bits;
      std::memcpy(b.data() + bits * dtype_size(dtype), &word, dtype_size(dtype));
    }
    const std::vector<float> all = b.to_float();
    ASSERT_EQ(all.size(), b.size());
    for (std::size_t i = 0; i < all.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(all[i]), std::bit_cast<uint32_t>(b.get(i))) << dtype_name(dtype) << " " << i;
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(BFloat16::from_float(1.0f).to_float(), 1.0f);
  EXPECT_EQ(BFloat16::from_float(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(BFloat16::from_float(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
}

TEST(DType, ParseAndSizes) {
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_NMKIT_ERROR(parse_dtype("int7"), ErrorCode::invalid_argument, "int7");
}

TEST(Activation, ParsesWhatItPrints) {
  for (Activation a : {Activation::none, Activation::relu, Activation::gelu})
    EXPECT_EQ(parse_activation(activation_name(a)), a);
  EXPECT_NMKIT_ERROR(parse_activation("tanh"), ErrorCode::invalid_argument, "tanh");
}

TEST(TypedBuffer, StoresSixteenBitWords) {
  TypedBuffer b(DType::f16, 3);
  EXPECT_EQ(b.size_bytes(), 6u);
  b.set(1, 0.333f);
  EXPECT_EQ(b.get(1), Half::from_float(0.333f).to_float());
  EXPECT_EQ(b.get(0), 0.0f);
}

}  // namespace
}  // namespace nmkit
