#pragma once
// Element types and their 16-bit storage. fp16 and bf16 are stored as real 16-bit words;
// arithmetic always happens in fp32 (load -> float, compute, round-to-nearest-even on store).
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
