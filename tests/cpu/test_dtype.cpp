#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

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
