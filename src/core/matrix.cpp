#include "nmkit/matrix.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "nmkit/error.hpp"

namespace nmkit {

const char* layout_name(Layout layout) noexcept { return layout == Layout::row_major ? "row-major" : "col-major"; }

const char* activation_name(Activation a) noexcept {
  switch (a) {
    case Activation::none:
      return "none";
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
  }
  return "?";
}

Activation parse_activation(std::string_view name) {
  for (Activation a : {Activation::none, Activation::relu, Activation::gelu})
    if (name == activation_name(a)) return a;
  throw Error(ErrorCode::invalid_argument,
              "unknown activation '" + std::string(name) + "' (expected none, relu or gelu)");
}

float apply_activation(Activation a, float x) noexcept {
  switch (a) {
    case Activation::none:
      return x;
    case Activation::relu:
      return x > 0.0f ? x : 0.0f;
    case Activation::gelu:
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
  }
  return x;
}

TypedBuffer::TypedBuffer(DType dtype, std::size_t count) : dtype_(dtype), bytes_(count * dtype_size(dtype)) {}

std::vector<float> TypedBuffer::to_float() const {
  std::vector<float> out(size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = get(i);
  return out;
}

DenseMatrix DenseMatrix::zeros(int64_t rows, int64_t cols, DType dtype) {
  require(rows >= 0 && cols >= 0, ErrorCode::invalid_argument,
          "matrix shape must be non-negative, got " + std::to_string(rows) + "x" + std::to_string(cols));
  return DenseMatrix{rows, cols, TypedBuffer(dtype, static_cast<std::size_t>(rows * cols))};
}

DenseMatrix DenseMatrix::from_float(int64_t rows, int64_t cols, std::span<const float> data, DType dtype) {
  DenseMatrix out = zeros(rows, cols, dtype);
  require(data.size() == static_cast<std::size_t>(rows * cols), ErrorCode::invalid_argument,
          "from_float: " + std::to_string(data.size()) + " values given for a " + std::to_string(rows) + "x" +
              std::to_string(cols) + " matrix");
  for (std::size_t i = 0; i < data.size(); ++i) {
    out.values.set(i, data[i]);
    require(!std::isinf(out.values.get(i)) || std::isinf(data[i]), ErrorCode::invalid_argument, [&] {
      return "value " + std::to_string(data[i]) + " at row " + std::to_string(i / std::max<int64_t>(cols, 1)) +
             ", column " + std::to_string(i % std::max<int64_t>(cols, 1)) + " overflows " + dtype_name(dtype) +
             " (it would be stored as infinity); store it as f32 or scale the matrix";
    });
  }
  return out;
}

namespace {

template <class Get>
void require_finite_values(std::size_t count, int64_t cols, std::string_view what, Get&& get) {
  for (std::size_t i = 0; i < count; ++i) {
    const float v = get(i);
    require(std::isfinite(v), ErrorCode::invalid_argument, [&] {
      const auto width = static_cast<std::size_t>(std::max<int64_t>(cols, 1));
      return std::string(what) + " row " + std::to_string(i / width) + ", column " + std::to_string(i % width) +
             " is " +
             (std::isnan(v) ? "NaN"
              : v > 0       ? "+inf"
                            : "-inf") +
             "; non-finite values cannot be pruned or measured";
    });
  }
}

}  // namespace

void require_finite(const DenseMatrix& m, std::string_view what) {
  require_finite_values(m.values.size(), m.cols, what, [&](std::size_t i) { return m.values.get(i); });
}

void require_finite(std::span<const float> values, int64_t cols, std::string_view what) {
  require_finite_values(values.size(), cols, what, [&](std::size_t i) { return values[i]; });
}

int64_t count_flushed_to_zero(std::span<const float> data, DType dtype) {
  TypedBuffer rounded(dtype, 1);
  int64_t count = 0;
  for (const float v : data) {
    if (v == 0.0f) continue;
    rounded.set(0, v);
    count += rounded.get(0) == 0.0f ? 1 : 0;
  }
  return count;
}

int64_t Mask::count() const noexcept { return std::count(keep.begin(), keep.end(), uint8_t{1}); }

Mask nonzero_mask(const DenseMatrix& dense) {
  Mask mask = Mask::none(dense.rows, dense.cols);
  for (std::size_t i = 0; i < mask.keep.size(); ++i) mask.keep[i] = dense.values.get(i) != 0.0f ? 1 : 0;
  return mask;
}

DenseMatrix apply_mask(const DenseMatrix& dense, const Mask& mask) {
  require(mask.rows == dense.rows && mask.cols == dense.cols, ErrorCode::invalid_argument,
          "mask shape " + std::to_string(mask.rows) + "x" + std::to_string(mask.cols) + " differs from matrix " +
              std::to_string(dense.rows) + "x" + std::to_string(dense.cols));
  DenseMatrix out = DenseMatrix::zeros(dense.rows, dense.cols, dense.dtype());
  for (std::size_t i = 0; i < mask.keep.size(); ++i)
    if (mask.keep[i]) out.values.set(i, dense.values.get(i));
  return out;
}

}  // namespace nmkit
