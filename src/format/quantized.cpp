#include "nmkit/format/quantized.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "nmkit/error.hpp"
#include "nmkit/format/bit_packing.hpp"
#include "row_group_entries.hpp"

namespace nmkit {
namespace {

// An 8-bit float: sign, exponent and mantissa fields, and the largest finite magnitude's code.
struct MinifloatFormat {
  int mantissa_bits;
  int bias;
  uint8_t max_finite_code;  // sign bit clear
  bool ieee_specials;       // e5m2: an all-ones exponent is infinity or NaN; e4m3: only S.1111.111 is NaN
};
constexpr MinifloatFormat kE4m3{3, 7, 0x7E, false};  // 0x7E = 0.1111.110 = 1.75 * 2^8 = 448
constexpr MinifloatFormat kE5m2{2, 15, 0x7B, true};  // 0x7B = 0.11110.11 = 1.75 * 2^15 = 57344
constexpr uint8_t kCanonicalNan = 0x7F;
constexpr uint8_t kSignBit = 0x80;

// Round half to even of a non-negative float, whatever the floating-point environment's rounding mode.
float round_half_even(float x) noexcept {
  const float lower = std::floor(x);
  const float fraction = x - lower;  // exact: x and floor(x) are within a factor of two, or x is an integer
  if (fraction > 0.5f) return lower + 1.0f;
  if (fraction < 0.5f) return lower;
  return std::fmod(lower, 2.0f) == 0.0f ? lower : lower + 1.0f;
}

uint8_t encode_minifloat(float value, const MinifloatFormat& f) noexcept {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint8_t sign = (bits >> 24) & kSignBit;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return kCanonicalNan;
  if (magnitude == 0x7f800000u) return sign | f.max_finite_code;  // satfinite: infinity saturates too
  const int min_normal_exponent = 1 - f.bias;
  const float abs_value = std::bit_cast<float>(magnitude);
  uint32_t code;
  if (abs_value < std::ldexp(1.0f, min_normal_exponent)) {
    // Subnormal codes are multiples of 2^(min_normal_exponent - mantissa_bits); the scaling is exact, and a value
    // that rounds up to the smallest normal gets its code (2^mantissa_bits) as well.
    code = static_cast<uint32_t>(round_half_even(std::ldexp(abs_value, f.mantissa_bits - min_normal_exponent)));
  } else {
    // Round the fp32 mantissa to mantissa_bits, to nearest even; a carry moves into the exponent as it should.
    const int shift = 23 - f.mantissa_bits;
    const uint32_t rounded = (magnitude + ((1u << (shift - 1)) - 1u) + ((magnitude >> shift) & 1u)) >> shift;
    code = rounded - (static_cast<uint32_t>(127 - f.bias) << f.mantissa_bits);
  }
  return static_cast<uint8_t>(sign | std::min<uint32_t>(code, f.max_finite_code));
}

float decode_minifloat(uint8_t code, const MinifloatFormat& f) noexcept {
  const int magnitude = code & 0x7f;
  const int exponent_field = magnitude >> f.mantissa_bits;
  const int mantissa = magnitude & ((1 << f.mantissa_bits) - 1);
  const int max_exponent_field = 0x7f >> f.mantissa_bits;
  float v;
  if (f.ieee_specials && exponent_field == max_exponent_field)
    v = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (!f.ieee_specials && magnitude == 0x7f)
    v = std::numeric_limits<float>::quiet_NaN();
  else if (exponent_field == 0)
    v = std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
  else
    v = std::ldexp(static_cast<float>((1 << f.mantissa_bits) + mantissa), exponent_field - f.bias - f.mantissa_bits);
  return (code & kSignBit) ? -v : v;
}

using CodeTable = std::array<float, 256>;
CodeTable make_table(QuantType type) noexcept {
  CodeTable t{};
  for (int c = 0; c < 256; ++c)
    t[c] = type == QuantType::int8   ? static_cast<float>(static_cast<int8_t>(c))
           : type == QuantType::e4m3 ? decode_minifloat(static_cast<uint8_t>(c), kE4m3)
                                     : decode_minifloat(static_cast<uint8_t>(c), kE5m2);
  return t;
}

const char* non_finite_name(float v) { return std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf"; }

// The scale of a row (or a tensor) of largest magnitude `absmax`.
float scale_for(float absmax, QuantType type) noexcept {
  if (absmax == 0.0f) return 0.0f;
  const float scale = absmax / quant_type_max(type);
  return scale > 0.0f ? scale : std::numeric_limits<float>::denorm_min();
}

std::string where(int64_t row, int64_t group) {
  return "row " + std::to_string(row) + ", group " + std::to_string(group);
}

}  // namespace

const char* quant_type_name(QuantType type) noexcept {
  switch (type) {
    case QuantType::e4m3:
      return "e4m3";
    case QuantType::e5m2:
      return "e5m2";
    case QuantType::int8:
      return "int8";
  }
  return "?";
}

bool is_quant_type_name(std::string_view name) noexcept {
  for (const char* n : {"e4m3", "fp8", "float8_e4m3fn", "e5m2", "float8_e5m2", "int8", "i8", "s8"})
    if (name == n) return true;
  return false;
}

QuantType parse_quant_type(std::string_view name) {
  if (name == "e4m3" || name == "fp8" || name == "float8_e4m3fn") return QuantType::e4m3;
  if (name == "e5m2" || name == "float8_e5m2") return QuantType::e5m2;
  if (name == "int8" || name == "i8" || name == "s8") return QuantType::int8;
  throw Error(ErrorCode::invalid_argument,
              "unknown 8-bit type '" + std::string(name) + "' (expected fp8 (= e4m3), e4m3, e5m2 or int8)");
}

float quant_type_max(QuantType type) noexcept {
  switch (type) {
    case QuantType::e4m3:
      return 448.0f;
    case QuantType::e5m2:
      return 57344.0f;
    case QuantType::int8:
      return 127.0f;
  }
  return 0.0f;
}

uint8_t float_to_e4m3(float value) noexcept { return encode_minifloat(value, kE4m3); }
uint8_t float_to_e5m2(float value) noexcept { return encode_minifloat(value, kE5m2); }

int8_t float_to_int8(float value) noexcept {
  if (std::isnan(value)) return 0;
  const float clamped = std::clamp(value, -127.0f, 127.0f);
  const float rounded = round_half_even(std::fabs(clamped));
  return static_cast<int8_t>(clamped < 0 ? -rounded : rounded);
}

float e4m3_to_float(uint8_t code) noexcept { return decode_minifloat(code, kE4m3); }
float e5m2_to_float(uint8_t code) noexcept { return decode_minifloat(code, kE5m2); }

uint8_t quantize_value(QuantType type, float value) noexcept {
  switch (type) {
    case QuantType::e4m3:
      return float_to_e4m3(value);
    case QuantType::e5m2:
      return float_to_e5m2(value);
    case QuantType::int8:
      return static_cast<uint8_t>(float_to_int8(value));
  }
  return 0;
}

float code_value(QuantType type, uint8_t code) noexcept {
  static const CodeTable kTables[] = {make_table(QuantType::e4m3), make_table(QuantType::e5m2),
                                      make_table(QuantType::int8)};
  return kTables[static_cast<int>(type)][code];
}

bool is_valid_code(QuantType type, uint8_t code) noexcept {
  switch (type) {
    case QuantType::e4m3:
      return (code & 0x7f) != 0x7f;
    case QuantType::e5m2:
      return (code & 0x7c) != 0x7c;  // exponent field all ones: infinity or NaN
    case QuantType::int8:
      return code != 0x80;
  }
  return false;
}

QuantizedRows quantize_rows(std::span<const float> x, int64_t rows, int64_t cols, QuantType type, RowScaling scaling,
                            std::string_view what) {
  require(rows >= 0 && cols >= 0 && x.size() == static_cast<std::size_t>(rows * cols), ErrorCode::invalid_argument,
          [&] {
            return std::string(what) + ": " + std::to_string(x.size()) + " values for " + std::to_string(rows) + " x " +
                   std::to_string(cols);
          });
  QuantizedRows q;
  q.rows = rows, q.cols = cols;
  q.values.type = type;
  q.values.codes.assign(x.size(), 0);
  q.scales.assign(static_cast<std::size_t>(rows), 0.0f);
  std::vector<float> absmax(static_cast<std::size_t>(rows), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[static_cast<std::size_t>(r * cols + c)];
      require(std::isfinite(v), ErrorCode::invalid_argument, [&] {
        return std::string(what) + " row " + std::to_string(r) + ", column " + std::to_string(c) + " is " +
               non_finite_name(v) + "; non-finite values cannot be quantized";
      });
      absmax[r] = std::max(absmax[r], std::fabs(v));
    }
  if (scaling == RowScaling::per_tensor) {
    const float all = rows ? *std::max_element(absmax.begin(), absmax.end()) : 0.0f;
    std::fill(absmax.begin(), absmax.end(), all);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = q.scales[r] = scale_for(absmax[r], type);
    if (scale == 0.0f) continue;  // an all-zero row: zero codes
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r * cols + c);
      q.values.codes[i] = quantize_value(type, x[i] / scale);
    }
  }
  return q;
}

std::vector<float> dequantize(const QuantizedRows& q) {
  validate(q);
  std::vector<float> out(q.values.size());
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const auto i = static_cast<std::size_t>(r * q.cols + c);
      out[i] = q.values.get(i) * q.scales[static_cast<std::size_t>(r)];
    }
  return out;
}

namespace {

// Scales must be finite, >= 0, and small enough that the largest code of `type` times the scale is finite too:
// every value of a valid weight dequantizes to an fp32.
void check_scales(const std::vector<float>& scales, QuantType type, const char* what) {
  for (std::size_t r = 0; r < scales.size(); ++r)
    require(std::isfinite(scales[r]) && scales[r] >= 0.0f && std::isfinite(scales[r] * quant_type_max(type)),
            ErrorCode::invalid_argument, [&] {
              return std::string(what) + " scale of row " + std::to_string(r) + " is " + std::to_string(scales[r]) +
                     " (scales must be finite, >= 0 and at most FLT_MAX / " +
                     std::to_string(static_cast<int>(quant_type_max(type))) + ")";
            });
}

std::string code_problem(QuantType type, uint8_t code) {
  const char* kind = type == QuantType::int8              ? "-128, outside the symmetric range -127..127"
                     : std::isnan(code_value(type, code)) ? "a NaN code"
                                                          : "an infinity code";
  return std::string(quant_type_name(type)) + " code 0x" + "0123456789abcdef"[code >> 4] +
         "0123456789abcdef"[code & 15] + " is " + kind;
}

}  // namespace

void validate(const QuantizedRows& q) {
  require(q.rows >= 0 && q.cols >= 0, ErrorCode::invalid_argument, "quantized rows have a negative shape");
  require(q.values.size() == static_cast<std::size_t>(q.rows * q.cols), ErrorCode::invalid_argument, [&] {
    return "quantized rows hold " + std::to_string(q.values.size()) + " codes, expected " +
           std::to_string(q.rows * q.cols);
  });
  require(q.scales.size() == static_cast<std::size_t>(q.rows), ErrorCode::invalid_argument, [&] {
    return "quantized rows hold " + std::to_string(q.scales.size()) + " scales, expected " + std::to_string(q.rows);
  });
  check_scales(q.scales, q.values.type, "quantized");
  for (std::size_t i = 0; i < q.values.size(); ++i)
    require(is_valid_code(q.values.type, q.values.codes[i]), ErrorCode::invalid_argument, [&] {
      const auto width = static_cast<std::size_t>(std::max<int64_t>(q.cols, 1));
      return "quantized row " + std::to_string(i / width) + ", column " + std::to_string(i % width) + ": " +
             code_problem(q.values.type, q.values.codes[i]);
    });
}

int QuantizedNmMatrix::index_bits() const noexcept { return index_bits_for(m); }

unsigned QuantizedNmMatrix::index(int64_t value_index) const noexcept {
  return read_packed(indices, static_cast<std::size_t>(value_index), index_bits());
}

QuantizedNmMatrix quantize_nm(const NmMatrix& a, QuantType type) {
  validate(a);
  detail::for_each_stored_value(a, [&](int64_t r, int64_t c, std::size_t vi) {
    const float v = a.values.get(vi);
    require(std::isfinite(v), ErrorCode::invalid_argument, [&] {
      return "weight row " + std::to_string(r) + ", column " + std::to_string(c) + " is " + non_finite_name(v) +
             "; non-finite values cannot be quantized";
    });
  });
  // A row's stored values are contiguous, (groups, N), so rows of the value array are the weight's rows.
  QuantizedRows q = quantize_rows(a.values.to_float(), a.rows, a.groups() * a.n, type);
  QuantizedNmMatrix out;
  out.rows = a.rows, out.cols = a.cols, out.n = a.n, out.m = a.m;
  out.values = std::move(q.values);
  out.indices = a.indices;
  out.scales = std::move(q.scales);
  return out;
}

NmMatrix dequantize(const QuantizedNmMatrix& a) {
  validate(a);
  NmMatrix out;
  out.rows = a.rows, out.cols = a.cols, out.n = a.n, out.m = a.m;
  out.values = TypedBuffer(DType::f32, static_cast<std::size_t>(a.value_count()));
  out.indices = a.indices;
  const int64_t per_row = a.groups() * a.n;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t i = r * per_row; i < (r + 1) * per_row; ++i)
      out.values.set(static_cast<std::size_t>(i), a.value(r, i));
  return out;
}

DenseMatrix decompress(const QuantizedNmMatrix& a) { return decompress(dequantize(a)); }

void validate(const QuantizedNmMatrix& a) {
  check_nm_pattern(a.n, a.m);
  require(a.rows >= 0 && a.cols >= 0, ErrorCode::invalid_argument, "quantized N:M matrix has a negative shape");
  const auto count = static_cast<std::size_t>(a.value_count());
  require(a.values.size() == count, ErrorCode::invalid_argument,
          "quantized N:M values hold " + std::to_string(a.values.size()) + " codes, expected " + std::to_string(count));
  require(a.indices.size() == packed_bytes(count, a.index_bits()), ErrorCode::invalid_argument,
          "quantized N:M indices hold " + std::to_string(a.indices.size()) + " bytes, expected " +
              std::to_string(packed_bytes(count, a.index_bits())));
  require(padding_is_zero(a.indices, count, a.index_bits()), ErrorCode::invalid_argument,
          "quantized N:M indices: the unused high bits of the last byte are not zero");
  require(
      a.scales.size() == static_cast<std::size_t>(a.rows), ErrorCode::invalid_argument,
      "quantized N:M scales hold " + std::to_string(a.scales.size()) + " values, expected " + std::to_string(a.rows));
  check_scales(a.scales, a.type(), "quantized N:M");
  const int64_t groups = a.groups();
  for (std::size_t i = 0; i < count; ++i)
    require(is_valid_code(a.type(), a.values.codes[i]), ErrorCode::invalid_argument, [&] {
      const auto value_index = static_cast<int64_t>(i);
      return "quantized N:M value at " + where(value_index / a.n / groups, value_index / a.n % groups) + ", slot " +
             std::to_string(value_index % a.n) + ": " + code_problem(a.type(), a.values.codes[i]);
    });
  detail::check_row_group_slots(a, a.m, {"N:M", "indices", "M"}, [&](int64_t vi) { return a.index(vi); });
}

std::string format_name(const QuantizedNmMatrix& a) { return std::to_string(a.n) + ":" + std::to_string(a.m); }

double format_density(const QuantizedNmMatrix& a) noexcept {
  const int64_t entries = a.rows * a.cols;
  if (entries == 0) return 1.0;
  int64_t kept = 0;
  detail::for_each_stored_value(a, [&](int64_t, int64_t, std::size_t) { ++kept; });
  return static_cast<double>(kept) / static_cast<double>(entries);
}

std::size_t storage_bytes(const QuantizedNmMatrix& a) noexcept {
  return a.values.size() + a.indices.size() + a.scales.size() * sizeof(float);
}

std::size_t dense_storage_bytes(const QuantizedNmMatrix& a) noexcept {
  return static_cast<std::size_t>(a.rows * a.cols + a.rows * static_cast<int64_t>(sizeof(float)));
}

}  // namespace nmkit
