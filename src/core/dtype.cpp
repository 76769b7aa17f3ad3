#include "nmkit/dtype.hpp"

#include <bit>

#include "nmkit/error.hpp"

namespace nmkit {

std::size_t dtype_size(DType dtype) noexcept { return dtype == DType::f32 ? 4 : 2; }

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::f32;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  throw Error(ErrorCode::invalid_argument, "unknown dtype '" + std::string(name) + "' (expected f32, f16 or bf16)");
}

// fp32 -> binary16 with round-to-nearest-even, overflow to inf, gradual underflow, NaN kept quiet.
Half Half::from_float(float value) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  Half h;
  if (abs >= 0x7f800000u) {  // inf or NaN
    h.bits = static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    return h;
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow
    h.bits = static_cast<uint16_t>(sign | 0x7c00u);
    return h;
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Scale so that the half subnormal unit (2^-24) becomes 1, then round to nearest even.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // exact: power-of-two scaling
    const uint32_t q = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(q);
    uint32_t r = q + ((rem > 0.5f || (rem == 0.5f && (q & 1u))) ? 1u : 0u);
    h.bits = static_cast<uint16_t>(sign | r);
    return h;
  }
  const uint32_t exp = ((abs >> 23) - 127 + 15) << 10;
  const uint32_t mant = abs & 0x7fffffu;
  uint32_t half = exp | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // carry may bump the exponent: correct
  h.bits = static_cast<uint16_t>(sign | half);
  return h;
}

float Half::to_float() const noexcept {
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

BFloat16 BFloat16::from_float(float value) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  BFloat16 b;
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    b.bits = static_cast<uint16_t>((x >> 16) | 0x40u);
    return b;
  }
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  b.bits = static_cast<uint16_t>((x + rounding) >> 16);
  return b;
}

float BFloat16::to_float() const noexcept { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

float round_to(DType dtype, float value) noexcept {
  switch (dtype) {
    case DType::f32:
      return value;
    case DType::f16:
      return Half::from_float(value).to_float();
    case DType::bf16:
      return BFloat16::from_float(value).to_float();
  }
  return value;
}

}  // namespace nmkit
