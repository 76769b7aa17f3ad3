// 8-bit values: the fp8 and int8 conversions against a brute-force nearest-value search, per-row quantization,
// the quantized N:M format (validation, storage), its reference product against plain loops, and its file parts.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "nmkit/cpu/quantized_spmm.hpp"
#include "nmkit/error.hpp"
#include "nmkit/format/quantized.hpp"
#include "nmkit/io/model.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/prune_model.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

using test::random_nonzero;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The test's own decoding of an OCP FP8 byte, from the field definitions.
double fp8_value(uint8_t code, int mantissa_bits, int bias) {
  const int exponent = (code & 0x7f) >> mantissa_bits, mantissa = code & ((1 << mantissa_bits) - 1);
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, 1 - bias - mantissa_bits)
                                         : std::ldexp((1 << mantissa_bits) + mantissa, exponent - bias - mantissa_bits);
  return (code & 0x80) ? -magnitude : magnitude;
}

// The code nearest to x among the finite non-negative codes up to `max_code` (ties to the even code), saturating:
// the conversion's definition, by exhaustive search.
uint8_t nearest_code(float x, QuantType type) {
  const int mantissa_bits = type == QuantType::e4m3 ? 3 : 2, bias = type == QuantType::e4m3 ? 7 : 15;
  const uint8_t max_code = type == QuantType::e4m3 ? 0x7E : 0x7B;
  const double magnitude = std::fabs(static_cast<double>(x));
  int best = 0;
  for (int c = 1; c <= max_code; ++c) {
    const double d = std::fabs(fp8_value(static_cast<uint8_t>(c), mantissa_bits, bias) - magnitude);
    const double best_d = std::fabs(fp8_value(static_cast<uint8_t>(best), mantissa_bits, bias) - magnitude);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

TEST(Fp8Conversion, DecodesTheFieldDefinitionsAndTheSpecialCodes) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if ((c & 0x7f) != 0x7f) EXPECT_EQ(e4m3_to_float(code), fp8_value(code, 3, 7)) << c;
    if ((c & 0x7c) != 0x7c) EXPECT_EQ(e5m2_to_float(code), fp8_value(code, 2, 15)) << c;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)) && std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // e4m3 has no infinity: S.1111.000 is finite
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(e5m2_to_float(0xFC), -kInf);
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7D)));
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
}

TEST(Fp8Conversion, RoundsToTheNearestCodeTiesToEven) {
  for (QuantType type : {QuantType::e4m3, QuantType::e5m2}) {
    std::vector<float> probes;
    // Every code, every midpoint between neighbours, and just either side of each midpoint.
    for (int c = 0; c < 0x7f; ++c) {
      if (!is_valid_code(type, static_cast<uint8_t>(c)) || !is_valid_code(type, static_cast<uint8_t>(c + 1))) continue;
      const float a = code_value(type, static_cast<uint8_t>(c)), b = code_value(type, static_cast<uint8_t>(c + 1));
      const float mid = (a + b) / 2;  // exact: both have few significant bits
      probes.insert(probes.end(), {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)});
    }
    for (float x : random_nonzero(2000, 7)) probes.push_back(x * std::ldexp(1.0f, static_cast<int>(x * 40)));
    for (float x : probes)
      for (float signed_x : {x, -x}) {
        ASSERT_EQ(quantize_value(type, signed_x), nearest_code(signed_x, type))
            << quant_type_name(type) << " of " << signed_x;
      }
  }
}

TEST(Fp8Conversion, SaturatesFiniteAndInfiniteValuesAndKeepsNan) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // the midpoint to a 480 that does not exist
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_e4m3(kInf), 0x7E);
  EXPECT_EQ(float_to_e4m3(-kInf), 0xFE);
  EXPECT_EQ(float_to_e4m3(kNan), 0x7F);
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2(kInf), 0x7B);
  EXPECT_EQ(float_to_e5m2(-1e38f), 0xFB);
  EXPECT_EQ(float_to_e5m2(kNan), 0x7F);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);   // half the smallest subnormal: ties to even 0
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.5f, -10)), 0x01);   // above half: the smallest subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(15.5f, -10)), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(Int8Conversion, RoundsHalfToEvenAndClampsSymmetrically) {
  EXPECT_EQ(float_to_int8(2.5f), 2);
  EXPECT_EQ(float_to_int8(3.5f), 4);
  EXPECT_EQ(float_to_int8(-2.5f), -2);
  EXPECT_EQ(float_to_int8(-0.5f), 0);
  EXPECT_EQ(float_to_int8(2.5000002f), 3);
  EXPECT_EQ(float_to_int8(126.5f), 126);
  EXPECT_EQ(float_to_int8(127.4f), 127);
  EXPECT_EQ(float_to_int8(300.0f), 127);
  EXPECT_EQ(float_to_int8(-300.0f), -127);  // never -128
  EXPECT_EQ(float_to_int8(-kInf), -127);
  EXPECT_EQ(float_to_int8(kNan), 0);
  EXPECT_FALSE(is_valid_code(QuantType::int8, 0x80));
  EXPECT_TRUE(is_valid_code(QuantType::int8, 0x81));
}

TEST(QuantType, ParsesItsNamesAndRefusesOthers) {
  EXPECT_EQ(parse_quant_type("fp8"), QuantType::e4m3);
  EXPECT_EQ(parse_quant_type("e5m2"), QuantType::e5m2);
  EXPECT_EQ(parse_quant_type("int8"), QuantType::int8);
  EXPECT_FALSE(is_quant_type_name("f16"));
  EXPECT_NMKIT_ERROR(parse_quant_type("fp4"), ErrorCode::invalid_argument, "expected fp8 (= e4m3), e4m3, e5m2 or int8");
}

TEST(QuantizeRows, MapsEachRowsAbsmaxToTheLargestCode) {
  const int64_t rows = 5, cols = 37;
  std::vector<float> x = random_nonzero(rows * cols, 3);
  for (int64_t c = 0; c < cols; ++c) x[2 * cols + c] = 0.0f;  // an all-zero row
  for (QuantType type : {QuantType::e4m3, QuantType::e5m2, QuantType::int8}) {
    const QuantizedRows q = quantize_rows(x, rows, cols, type);
    validate(q);
    const std::vector<float> back = dequantize(q);
    EXPECT_EQ(q.scales[2], 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float absmax = 0.0f, code_max = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const auto i = static_cast<std::size_t>(r * cols + c);
        absmax = std::max(absmax, std::fabs(x[i]));
        code_max = std::max(code_max, std::fabs(q.values.get(i)));
        ASSERT_TRUE(std::isfinite(back[i]));
        // Half a step of the code grid at this magnitude: 1/2 for int8, 2^-4 (e4m3) or 2^-3 (e5m2) relative.
        const double step = type == QuantType::int8   ? 0.5 * q.scales[r]
                            : type == QuantType::e4m3 ? std::fabs(x[i]) / 16 + q.scales[r] * std::ldexp(1.0, -10)
                                                      : std::fabs(x[i]) / 8 + q.scales[r] * std::ldexp(1.0, -17);
        ASSERT_LE(std::fabs(double{back[i]} - x[i]), step * 1.0001) << quant_type_name(type) << " " << r << "," << c;
      }
      EXPECT_EQ(q.scales[r], absmax / quant_type_max(type));
      EXPECT_EQ(code_max, absmax == 0.0f ? 0.0f : quant_type_max(type)) << quant_type_name(type) << " row " << r;
    }
  }
}

TEST(QuantizeRows, PerTensorScalingUsesOneScaleAndTinyValuesStayFinite) {
  const std::vector<float> x{1.0f, -2.0f, 0.5f, 0.25f, 0.0f, 0.0f};
  const QuantizedRows q = quantize_rows(x, 3, 2, QuantType::int8, RowScaling::per_tensor);
  EXPECT_EQ(q.scales, std::vector<float>(3, 2.0f / 127));
  EXPECT_EQ(q.values.get(1), -127.0f);
  EXPECT_EQ(q.values.get(4), 0.0f);
  // A row whose absmax / 448 underflows fp32 still gets a positive scale and finite values.
  const std::vector<float> tiny{std::numeric_limits<float>::denorm_min(), 0.0f};
  const QuantizedRows t = quantize_rows(tiny, 1, 2, QuantType::e4m3);
  EXPECT_GT(t.scales[0], 0.0f);
  EXPECT_EQ(dequantize(t)[0], tiny[0]);
}

TEST(QuantizeRows, RefusesNonFiniteValuesNamingRowAndColumn) {
  std::vector<float> x(12, 1.0f);
  x[7] = kNan;
  EXPECT_NMKIT_ERROR(quantize_rows(x, 3, 4, QuantType::e4m3, RowScaling::per_row, "activation"),
                     ErrorCode::invalid_argument, "activation row 1, column 3 is NaN");
  x[7] = -kInf;
  EXPECT_NMKIT_ERROR(quantize_rows(x, 3, 4, QuantType::int8), ErrorCode::invalid_argument, "row 1, column 3 is -inf");
  EXPECT_NMKIT_ERROR(quantize_rows(x, 3, 5, QuantType::int8), ErrorCode::invalid_argument, "12 values for 3 x 5");
}

QuantizedNmMatrix random_quantized(int64_t rows, int64_t cols, int n, int m, QuantType type, uint32_t seed) {
  const DenseMatrix w = test::random_matrix(rows, cols, DType::f32, seed);
  return quantize_nm(std::get<NmMatrix>(prune_magnitude(w, NmSpec{n, m}).compressed), type);
}

TEST(QuantizedNm, KeepsThePatternAndDequantizesCloseToTheWeight) {
  for (QuantType type : {QuantType::e4m3, QuantType::e5m2, QuantType::int8})
    for (int64_t cols : {int64_t{64}, int64_t{37}}) {  // 37: a tail group padded to M
      const DenseMatrix w = test::random_matrix(9, cols, DType::f32, 11);
      const NmMatrix nm = std::get<NmMatrix>(prune_magnitude(w, NmSpec{2, 4}).compressed);
      const QuantizedNmMatrix q = quantize_nm(nm, type);
      validate(q);
      EXPECT_EQ(q.indices, nm.indices);
      EXPECT_EQ(format_name(q), "2:4");
      EXPECT_DOUBLE_EQ(format_density(q), format_density(SparseMatrix{nm}));
      const DenseMatrix want = decompress(nm), got = decompress(q);
      const double tolerance = type == QuantType::int8 ? 0.5 / 127 : type == QuantType::e4m3 ? 1.0 / 16 : 1.0 / 8;
      for (int64_t r = 0; r < want.rows; ++r)
        for (int64_t c = 0; c < want.cols; ++c) {
          ASSERT_EQ(got.at(r, c) == 0.0f, want.at(r, c) == 0.0f) << r << "," << c;
          ASSERT_LE(std::fabs(got.at(r, c) - want.at(r, c)), tolerance * 1.0001) << r << "," << c;
        }
    }
}

TEST(QuantizedNm, StorageIsTheSeedsArithmetic) {
  const int64_t rows = 64, cols = 4096;
  const QuantizedNmMatrix q = random_quantized(rows, cols, 2, 4, QuantType::int8, 5);
  const std::size_t scales = rows * sizeof(float);
  EXPECT_EQ(storage_bytes(q), rows * cols / 2 + rows * cols / 8 + scales);
  EXPECT_EQ(dense_storage_bytes(q), rows * cols + scales);
  // Without the scales, 2:4 at 8 bits is 62.5 % of dense 8-bit (nm_storage_ratio) and 31.25 % of dense fp16.
  EXPECT_DOUBLE_EQ(
      static_cast<double>(storage_bytes(q) - scales) / static_cast<double>(dense_storage_bytes(q) - scales),
      nm_storage_ratio(2, 4, 8));
  EXPECT_DOUBLE_EQ(nm_storage_ratio(2, 4, 8), 0.625);
  EXPECT_DOUBLE_EQ(static_cast<double>(storage_bytes(q) - scales) / (2.0 * rows * cols), 0.3125);
}

TEST(QuantizedNm, ZeroRowsGetScaleZeroAndStayZero) {
  DenseMatrix w = test::random_matrix(4, 16, DType::f32, 2);
  for (int64_t c = 0; c < 16; ++c) w.set(1, c, 0.0f);
  const QuantizedNmMatrix q =
      quantize_nm(std::get<NmMatrix>(prune_magnitude(w, NmSpec{2, 4}).compressed), QuantType::e4m3);
  EXPECT_EQ(q.scales[1], 0.0f);
  const DenseMatrix d = decompress(q);
  for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(d.at(1, c), 0.0f);
}

TEST(QuantizedNm, RefusesNonFiniteWeightsNamingRowAndColumn) {
  DenseMatrix w = test::random_matrix(3, 8, DType::f32, 4);
  w.set(2, 5, 1e9f);  // kept by magnitude pruning
  NmMatrix nm = std::get<NmMatrix>(prune_magnitude(w, NmSpec{2, 4}).compressed);
  for (std::size_t i = 0; i < nm.values.size(); ++i)
    if (nm.values.get(i) == 1e9f) nm.values.set(i, kInf);
  EXPECT_NMKIT_ERROR(quantize_nm(nm, QuantType::int8), ErrorCode::invalid_argument, "weight row 2, column 5 is +inf");
}

TEST(QuantizedNm, ValidateNamesBadScalesCodesAndPadding) {
  const QuantizedNmMatrix good = random_quantized(3, 6, 2, 4, QuantType::e4m3, 9);  // K = 6: one padded group
  QuantizedNmMatrix q = good;
  q.scales[1] = kNan;
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::invalid_argument, "scale of row 1 is nan");
  q = good, q.scales[2] = -1.0f;
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::invalid_argument, "scale of row 2 is -1");
  q = good, q.scales[0] = 1e37f;  // 448 * 1e37 overflows: some code would dequantize to infinity
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::invalid_argument, "at most FLT_MAX / 448");
  q = good, q.values.type = QuantType::int8, q.values.codes.assign(q.values.size(), 0), q.scales[0] = 1e36f;
  EXPECT_NO_THROW(validate(q));  // 127 * 1e36 is finite
  q = good, q.scales.pop_back();
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::invalid_argument, "scales hold 2 values, expected 3");
  q = good, q.values.codes[5] = 0x7F;  // row 1, group 0, slot 1
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::invalid_argument, "row 1, group 0, slot 1: e4m3 code 0x7f is a NaN code");
  q = good, q.values.type = QuantType::e5m2, q.values.codes.assign(q.values.size(), 0), q.values.codes[0] = 0xFC;
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::invalid_argument, "e5m2 code 0xfc is an infinity code");
  q = good, q.values.type = QuantType::int8, q.values.codes.assign(q.values.size(), 0), q.values.codes[3] = 0x80;
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::invalid_argument, "-128, outside the symmetric range");
  // K = 5: group 1 holds column 4 and padding, so its slot 1 (index 1, column 5) must hold a zero.
  q = random_quantized(3, 5, 2, 4, QuantType::e4m3, 9);
  ASSERT_EQ(q.column_of(0, 1, 1), 5);
  q.values.codes[3] = 0x38;  // row 0, group 1, slot 1
  EXPECT_NMKIT_ERROR(validate(q), ErrorCode::pattern_violation, "non-zero value in the K padding at row 0, group 1");
}

// The test's own expectation of quantized_spmm, from the codes and scales by plain loops in double.
std::vector<double> expected_product(const QuantizedNmMatrix& w, const QuantizedRows& x, const Epilogue& e,
                                     const std::vector<float>& c) {
  const NmMatrix codes_only = [&] {
    QuantizedNmMatrix unit = w;
    std::fill(unit.scales.begin(), unit.scales.end(), 1.0f);
    return dequantize(unit);
  }();
  const DenseMatrix wc = decompress(codes_only);  // the codes' values at their dense columns
  std::vector<double> out(static_cast<std::size_t>(w.rows * x.rows));
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t t = 0; t < x.rows; ++t) {
      double dot = 0.0;
      for (int64_t k = 0; k < w.cols; ++k)
        dot += double{wc.at(r, k)} * x.values.get(static_cast<std::size_t>(t * x.cols + k));
      double v = double{e.alpha} * w.scales[r] * x.scales[t] * dot + (e.bias ? e.bias[r] : 0.0);
      if (e.beta != 0.0f) v += double{e.beta} * c[static_cast<std::size_t>(r * x.rows + t)];
      if (e.activation == Activation::relu) v = std::max(v, 0.0);
      out[static_cast<std::size_t>(r * x.rows + t)] = v;
    }
  return out;
}

TEST(QuantizedSpmm, MatchesPlainLoopsOnOddShapesWithTheEpilogue) {
  struct Case {
    QuantType weight, activation;
    int64_t rows, cols, tokens;
  };
  for (const Case& k :
       {Case{QuantType::int8, QuantType::int8, 37, 70, 13}, Case{QuantType::e4m3, QuantType::e4m3, 19, 129, 5},
        Case{QuantType::e4m3, QuantType::e5m2, 8, 33, 3}, Case{QuantType::e5m2, QuantType::e4m3, 5, 4, 1}})
    for (Layout layout : {Layout::row_major, Layout::col_major}) {
      const QuantizedNmMatrix w = random_quantized(k.rows, k.cols, 2, 4, k.weight, 21);
      const QuantizedRows x = quantize_rows(random_nonzero(k.tokens * k.cols, 22), k.tokens, k.cols, k.activation);
      const std::vector<float> bias = random_nonzero(k.rows, 23), c = random_nonzero(k.rows * k.tokens, 24);
      const Epilogue e{0.75f, -0.5f, bias.data(), Activation::relu};
      std::vector<float> d(static_cast<std::size_t>(k.rows * k.tokens), kNan);
      quantized_spmm(w, x, {c.data(), k.rows, k.tokens, Layout::row_major}, {d.data(), k.rows, k.tokens, layout}, e);
      const std::vector<double> want = expected_product(w, x, e, c);
      for (int64_t r = 0; r < k.rows; ++r)
        for (int64_t t = 0; t < k.tokens; ++t) {
          const double got =
              d[static_cast<std::size_t>(layout == Layout::row_major ? r * k.tokens + t : t * k.rows + r)];
          const double ref = want[static_cast<std::size_t>(r * k.tokens + t)];
          ASSERT_NEAR(got, ref, 1e-6 * (1.0 + std::fabs(ref))) << "at (" << r << ", " << t << ")";
        }
    }
}

TEST(QuantizedSpmm, IsExactOnIntegerDataAndRoundsTo16BitOutputs) {
  // Scales of 1 and small integers: every product and sum is exact, so the output must match exactly.
  QuantizedNmMatrix w = random_quantized(6, 16, 2, 4, QuantType::int8, 31);
  std::fill(w.scales.begin(), w.scales.end(), 1.0f);
  QuantizedRows x = quantize_rows(random_nonzero(3 * 16, 32), 3, 16, QuantType::int8);
  std::fill(x.scales.begin(), x.scales.end(), 1.0f);
  const std::vector<double> want = expected_product(w, x, {}, {});
  for (DType output : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<float> d(18);
    quantized_spmm(w, x, {}, {d.data(), 6, 3, Layout::row_major}, {}, output);
    for (std::size_t i = 0; i < d.size(); ++i)
      ASSERT_EQ(d[i], round_to(output, static_cast<float>(want[i]))) << dtype_name(output) << " at " << i;
  }
}

TEST(QuantizedSpmm, ZeroScalesGiveTheBiasWithoutNan) {
  QuantizedNmMatrix w = random_quantized(4, 8, 2, 4, QuantType::e4m3, 41);
  w.scales[2] = 0.0f;
  std::vector<float> xs = random_nonzero(2 * 8, 42);
  std::fill(xs.begin() + 8, xs.end(), 0.0f);  // token 1 all zero: scale 0
  const QuantizedRows x = quantize_rows(xs, 2, 8, QuantType::e4m3);
  ASSERT_EQ(x.scales[1], 0.0f);
  const std::vector<float> bias{1, 2, 3, 4};
  std::vector<float> d(8, kNan);
  quantized_spmm(w, x, {}, {d.data(), 4, 2, Layout::row_major}, {1.0f, 0.0f, bias.data(), Activation::gelu});
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(d[r * 2 + 1], apply_activation(Activation::gelu, bias[r])) << r;
  EXPECT_EQ(d[2 * 2 + 0], apply_activation(Activation::gelu, 3.0f));
}

TEST(QuantizedSpmm, RefusesMixedTypesAndMismatchedShapes) {
  const QuantizedNmMatrix w = random_quantized(4, 8, 2, 4, QuantType::int8, 51);
  std::vector<float> d(8);
  const QuantizedRows fp8 = quantize_rows(random_nonzero(16, 52), 2, 8, QuantType::e4m3);
  EXPECT_NMKIT_ERROR(quantized_spmm(w, fp8, {}, {d.data(), 4, 2}), ErrorCode::unsupported,
                     "a int8 weight with e4m3 activations");
  const QuantizedRows narrow = quantize_rows(random_nonzero(14, 53), 2, 7, QuantType::int8);
  EXPECT_NMKIT_ERROR(quantized_spmm(w, narrow, {}, {d.data(), 4, 2}), ErrorCode::invalid_argument,
                     "activations have 7 features, the weight has K=8");
  const QuantizedRows x = quantize_rows(random_nonzero(16, 54), 2, 8, QuantType::int8);
  EXPECT_NMKIT_ERROR(quantized_spmm(w, x, {}, {d.data(), 2, 4}), ErrorCode::invalid_argument, "expected 4x2");
  EXPECT_NMKIT_ERROR(quantized_spmm(w, x, {}, {d.data(), 4, 2}, {1.0f, 1.0f}), ErrorCode::invalid_argument,
                     "beta != 0 needs C");
}

// The 8-bit parts of a model file: a round trip keeps every byte, and each broken part is refused by name.
ModelFile quantized_model(QuantType type) {
  ModelFile m;
  m.weights.push_back({"layer.weight", random_quantized(5, 14, 2, 4, type, 61)});
  m.weights.push_back({"layer.bias", to_tensor("layer.bias", test::random_matrix(1, 5, DType::f32, 62))});
  return m;
}

TEST(QuantizedFile, RoundTripsEveryType) {
  for (QuantType type : {QuantType::e4m3, QuantType::e5m2, QuantType::int8}) {
    const ModelFile model = quantized_model(type);
    const SafetensorsFile file = model_to_safetensors(model);
    const StTensor* values = file.find("layer.weight.values");
    ASSERT_NE(values, nullptr);
    EXPECT_EQ(values->dtype, type == QuantType::e4m3   ? StDType::F8_E4M3
                             : type == QuantType::e5m2 ? StDType::F8_E5M2
                                                       : StDType::I8);
    EXPECT_EQ(file.find("layer.weight.scales")->dtype, StDType::F32);
    const ModelFile back =
        model_from_safetensors(parse_safetensors(serialize_safetensors(file), "mem"), "mem");  // through the bytes
    ASSERT_EQ(back.weights.size(), 2u);
    const auto& want = std::get<QuantizedNmMatrix>(model.weights[0].weight);
    const auto* got = std::get_if<QuantizedNmMatrix>(&back.weights[0].weight);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->type(), type);
    EXPECT_EQ(got->values.codes, want.values.codes);
    EXPECT_EQ(got->indices, want.indices);
    EXPECT_EQ(got->scales, want.scales);
    EXPECT_EQ(got->rows, 5);
    EXPECT_EQ(got->cols, 14);
  }
}

SafetensorsFile broken(const std::function<void(SafetensorsFile&)>& edit) {
  SafetensorsFile f = model_to_safetensors(quantized_model(QuantType::e4m3));
  edit(f);
  return f;
}

StTensor& part_of(SafetensorsFile& f, const std::string& name) {
  for (StTensor& t : f.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no part " + name);
}

TEST(QuantizedFile, RefusesBrokenPartsNamingTheTensor) {
  const auto load = [](const SafetensorsFile& f) { return model_from_safetensors(f, "q.safetensors"); };
  EXPECT_NMKIT_ERROR(load(broken([](SafetensorsFile& f) {
                       std::erase_if(f.tensors, [](const StTensor& t) { return t.name == "layer.weight.scales"; });
                     })),
                     ErrorCode::io_error,
                     "q.safetensors: compressed tensor 'layer.weight': part 'layer.weight.scales' is missing");
  EXPECT_NMKIT_ERROR(load(broken([](SafetensorsFile& f) { part_of(f, "layer.weight.values").dtype = StDType::I8; })),
                     ErrorCode::io_error, "has dtype I8, expected F8_E4M3");
  EXPECT_NMKIT_ERROR(load(broken([](SafetensorsFile& f) {
                       StTensor& s = part_of(f, "layer.weight.scales");
                       const float nan = kNan;
                       std::memcpy(s.data.data() + 4 * 3, &nan, 4);
                     })),
                     ErrorCode::io_error, "compressed tensor 'layer.weight': quantized N:M scale of row 3 is nan");
  EXPECT_NMKIT_ERROR(
      load(broken([](SafetensorsFile& f) { part_of(f, "layer.weight.values").data[0] = std::byte{0xFF}; })),
      ErrorCode::io_error, "e4m3 code 0xff is a NaN code");
  EXPECT_NMKIT_ERROR(load(broken([](SafetensorsFile& f) {
                       f.metadata["nmkit:layer.weight"] =
                           R"({"format":"vnm","shape":[5,14],"dtype":"int8","v":64,"n":2,"m":4})";
                     })),
                     ErrorCode::io_error, "8-bit values (dtype 'int8') are stored for format nm only, not 'vnm'");
  EXPECT_NMKIT_ERROR(load(broken([](SafetensorsFile& f) {
                       f.metadata["nmkit:layer.weight"] = R"({"format":"nm","shape":[5,14],"dtype":"fp4","n":2,"m":4})";
                     })),
                     ErrorCode::io_error, "unknown dtype 'fp4'");
}

TEST(QuantizedPruneModel, QuantizesAfterPruningAndRefusesOtherFormats) {
  ModelFile model;
  model.weights.push_back({"a.weight", to_tensor("a.weight", test::random_matrix(6, 12, DType::f32, 71))});
  model.weights.push_back({"a.bias", to_tensor("a.bias", test::random_matrix(1, 6, DType::f32, 72))});
  ModelPruneOptions options;
  options.quantize = QuantType::int8;
  ModelFile pruned = model;
  const ModelPruneReport report = prune_model(pruned, options);
  const auto* q = std::get_if<QuantizedNmMatrix>(&pruned.weights[0].weight);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type(), QuantType::int8);
  EXPECT_EQ(report.tensors[0].dtype, "int8");
  EXPECT_EQ(report.tensors[0].bytes_after, storage_bytes(*q));
  const NmMatrix nm = std::get<NmMatrix>(
      prune_magnitude(to_dense_matrix(std::get<StTensor>(model.weights[0].weight)), NmSpec{2, 4}).compressed);
  EXPECT_EQ(q->values.codes, quantize_nm(nm, QuantType::int8).values.codes);
  options.spec = VnmSpec{64, 2, 8};
  pruned = model;
  EXPECT_NMKIT_ERROR(prune_model(pruned, options), ErrorCode::unsupported,
                     "8-bit values (int8) are supported for N:M formats only (2:4, N:M), not vnm:64:2:8");
  options.spec = NmSpec{2, 4}, options.value_dtype = DType::f16;
  EXPECT_NMKIT_ERROR(prune_model(pruned, options), ErrorCode::invalid_argument, "not both");
}

}  // namespace
}  // namespace nmkit
