#pragma once
// Element types and their 16-bit storage. fp16 and bf16 are stored as real 16-bit words;
// arithmetic always happens in fp32 (load -> float, compute, round-to-nearest-even on store).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace nmkit {

// Value types of sparse formats and dense matrices.
enum class DType : uint8_t { f32, f16, bf16 };

std::size_t dtype_size(DType dtype) noexcept;
const char* dtype_name(DType dtype) noexcept;  // "f32", "f16", "bf16"
DType parse_dtype(std::string_view name);      // accepts f32|fp32|float32, f16|fp16|float16, bf16|bfloat16

// IEEE 754 binary16, stored as its bit pattern.
struct Half {
  uint16_t bits = 0;
  static Half from_float(float value) noexcept;
  float to_float() const noexcept;
};

// bfloat16: the upper 16 bits of an fp32, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  static BFloat16 from_float(float value) noexcept;
  float to_float() const noexcept;
};

// fp32 -> binary16 with round-to-nearest-even, overflow to inf, gradual underflow, NaN kept quiet.
inline Half Half::from_float(float value) noexcept {
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

inline float Half::to_float() const noexcept {
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

inline BFloat16 BFloat16::from_float(float value) noexcept {
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

inline float BFloat16::to_float() const noexcept { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// Reads element `index` of a buffer of `dtype` as float.
inline float load_as_float(const std::byte* data, DType dtype, std::size_t index) noexcept {
  switch (dtype) {
    case DType::f32: {
      float v;
      std::memcpy(&v, data + index * 4, 4);
      return v;
    }
    case DType::f16: {
      Half h;
      std::memcpy(&h.bits, data + index * 2, 2);
      return h.to_float();
    }
    case DType::bf16: {
      BFloat16 b;
      std::memcpy(&b.bits, data + index * 2, 2);
      return b.to_float();
    }
  }
  return 0.0f;
}

// Writes `value` rounded to `dtype` at element `index`.
inline void store_from_float(std::byte* data, DType dtype, std::size_t index, float value) noexcept {
  switch (dtype) {
    case DType::f32:
      std::memcpy(data + index * 4, &value, 4);
      break;
    case DType::f16: {
      const Half h = Half::from_float(value);
      std::memcpy(data + index * 2, &h.bits, 2);
      break;
    }
    case DType::bf16: {
      const BFloat16 b = BFloat16::from_float(value);
      std::memcpy(data + index * 2, &b.bits, 2);
      break;
    }
  }
}

// Rounds a float through `dtype` and back (what storing then loading would give).
float round_to(DType dtype, float value) noexcept;

}  // namespace nmkit
