#include "nmkit/dtype.hpp"

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
