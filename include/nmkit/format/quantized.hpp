#pragma once
// 8-bit weights and activations: OCP FP8 (e4m3, e5m2) and symmetric int8 codes, each row with an fp32 scale
// (dequantized value = code value * scale[row]), and N:M weights whose kept values are such codes. Byte layout
// and file parts: docs/formats.md, "Quantized N:M".
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nmkit/format/nm.hpp"

namespace nmkit {

// The 8-bit value types. Kept apart from DType: these never hold a value on their own, only with a scale.
//   e4m3: OCP FP8 E4M3 (bias 7, no infinity, NaN = S.1111.111), largest finite 448;
//   e5m2: OCP FP8 E5M2 (bias 15, IEEE-style infinity and NaN), largest finite 57344;
//   int8: two's complement, symmetric: -127..127 (-128 is never written and refused on load).
enum class QuantType : uint8_t { e4m3, e5m2, int8 };

const char* quant_type_name(QuantType type) noexcept;  // "e4m3", "e5m2", "int8"
// Accepts e4m3 | fp8 | float8_e4m3fn, e5m2 | float8_e5m2, int8 | i8 | s8; throws Error naming the choices.
QuantType parse_quant_type(std::string_view name);
// The largest finite code value: 448, 57344 or 127 (what a row's largest |value| maps to).
float quant_type_max(QuantType type) noexcept;
// True for the type names parse_quant_type takes (so that a caller can tell them from f32/f16/bf16).
bool is_quant_type_name(std::string_view name) noexcept;

// float -> code, round to nearest even, saturating ("satfinite", as PTX's cvt.rn.satfinite): finite values beyond
// the largest finite value and infinities become +-max; NaN becomes the canonical NaN 0x7F (e4m3 and e5m2) or 0
// (int8, which has none). Subnormal codes are produced (e4m3 down to 2^-9, e5m2 down to 2^-16).
uint8_t float_to_e4m3(float value) noexcept;
uint8_t float_to_e5m2(float value) noexcept;
int8_t float_to_int8(float value) noexcept;
// code -> float, exact (every code value is an fp32). e4m3 0x7F / 0xFF and e5m2 NaN codes give NaN, e5m2
// 0x7C / 0xFC give +-infinity; valid quantized data never holds them.
float e4m3_to_float(uint8_t code) noexcept;
float e5m2_to_float(uint8_t code) noexcept;
uint8_t quantize_value(QuantType type, float value) noexcept;  // the conversion of `type`, as a byte
float code_value(QuantType type, uint8_t code) noexcept;       // the value of a byte of `type`
// False for the codes quantized data may not hold: NaN and infinity codes, and int8's -128.
bool is_valid_code(QuantType type, uint8_t code) noexcept;

// Codes of one type, one byte each.
struct QuantizedValues {
  QuantType type = QuantType::e4m3;
  std::vector<uint8_t> codes;

  std::size_t size() const noexcept { return codes.size(); }
  float get(std::size_t i) const noexcept { return code_value(type, codes[i]); }  // unscaled
};

// A rows x cols matrix of codes with one fp32 scale per row: element (r, c) = values.get(r * cols + c) * scales[r].
// As activations (x[T, K], one row per token) it is the B operand of quantized_spmm.
struct QuantizedRows {
  int64_t rows = 0;
  int64_t cols = 0;
  QuantizedValues values;     // (rows, cols), row-major
  std::vector<float> scales;  // (rows): finite, >= 0
};

// How quantize_rows chooses scales: an absmax per row (per output channel of a weight, per token of activations),
// or one absmax over the whole matrix, that scale then repeated on every row.
enum class RowScaling : uint8_t { per_row, per_tensor };

// Symmetric absmax quantization: scale = absmax / quant_type_max(type) (fp32 division), then each code is
// quantize_value(type, x / scale) (fp32 division: correctly rounded, then round to nearest even). An absmax of 0
// (an all-zero row) gives scale 0 and zero codes, so no division by zero: the row dequantizes to exact zeros. A
// scale that would underflow to 0 for a non-zero absmax (below 448 * 2^-150 for e4m3) is the smallest subnormal.
// `x` holds rows x cols floats, row-major (activations x[T, K] as a linear layer takes them). Throws
// Error(invalid_argument) naming `what`, the row and the column of the first NaN or infinity.
QuantizedRows quantize_rows(std::span<const float> x, int64_t rows, int64_t cols, QuantType type,
                            RowScaling scaling = RowScaling::per_row, std::string_view what = "value");
// The fp32 values, row-major: code value * scale (one fp32 product, exact unless it underflows).
std::vector<float> dequantize(const QuantizedRows& q);
// Throws Error naming the first invalid code (row, column) or scale (row), or a size that does not match.
void validate(const QuantizedRows& q);

// An N:M weight (nm.hpp: the same groups, slots and indices) whose kept values are 8-bit codes with one fp32
// scale per row (per output channel). Padding slots hold code 0 (or -0 for fp8).
struct QuantizedNmMatrix {
  int64_t rows = 0;  // R
  int64_t cols = 0;  // K
  int n = 2;
  int m = 4;
  QuantizedValues values;        // (R, groups, N): kept codes of each group, by ascending index
  std::vector<uint8_t> indices;  // (R, groups, N) indices in [0, M), index_bits() each, bit-packed as in NmMatrix
  std::vector<float> scales;     // (R): finite, >= 0; 0 only for a row whose codes are all zero

  QuantType type() const noexcept { return values.type; }
  int64_t groups() const noexcept { return ceil_div(cols, m); }
  int64_t value_count() const noexcept { return rows * groups() * n; }
  int index_bits() const noexcept;
  unsigned index(int64_t value_index) const noexcept;
  int64_t column_of(int64_t r, int64_t g, int s) const noexcept { return g * m + index((r * groups() + g) * n + s); }
  // Dequantized value i of row r: values.get(i) * scales[r].
  float value(int64_t r, int64_t value_index) const noexcept {
    return values.get(static_cast<std::size_t>(value_index)) * scales[static_cast<std::size_t>(r)];
  }
};

// Quantizes the kept values of an N:M weight, per row (quantize_rows over each row's stored values; zeros do not
// move the absmax). The pattern and indices stay. Throws Error naming the row and dense column of a NaN or
// infinite value, or whatever validate(a) throws.
QuantizedNmMatrix quantize_nm(const NmMatrix& a, QuantType type);
// The same weight with f32 values code * scale: for the float references and the BERT forward.
NmMatrix dequantize(const QuantizedNmMatrix& a);
DenseMatrix decompress(const QuantizedNmMatrix& a);  // f32, dequantized
// Throws Error naming the first violation: N:M's checks (sizes, index range and order, non-zero padding), a scale
// that is negative, NaN or infinite (row), a code that is NaN, infinity or int8 -128 (row, group).
void validate(const QuantizedNmMatrix& a);
std::string format_name(const QuantizedNmMatrix& a);  // "2:4", as NmMatrix
double format_density(const QuantizedNmMatrix& a) noexcept;

// Exact bytes: codes + packed indices + 4 bytes of scale per row.
std::size_t storage_bytes(const QuantizedNmMatrix& a) noexcept;
// The same weight dense at 8 bits with its scales: R * K + 4 R bytes (what storage_bytes compares with; 2:4 is
// 62.5 % of it plus the scales' share, nm_storage_ratio(2, 4, 8)).
std::size_t dense_storage_bytes(const QuantizedNmMatrix& a) noexcept;

}  // namespace nmkit
