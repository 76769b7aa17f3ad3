#pragma once
// Dense host matrices and masks: the inputs of compression and pruning, the outputs of decompression.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "nmkit/dtype.hpp"

namespace nmkit {

constexpr int64_t ceil_div(int64_t a, int64_t b) noexcept { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) noexcept { return ceil_div(a, b) * b; }

// Storage order of a dense operand. For B (K x C): col_major is the linear-layer layout (x[T, K] row-major).
enum class Layout : uint8_t { row_major, col_major };
const char* layout_name(Layout layout) noexcept;

// Activation applied last in a product's epilogue. gelu is the exact (erf) form.
enum class Activation : uint8_t { none, relu, gelu };
const char* activation_name(Activation a) noexcept;
Activation parse_activation(std::string_view name);  // "none", "relu" or "gelu"; throws Error otherwise
float apply_activation(Activation a, float x) noexcept;

// A contiguous buffer of `dtype` elements (fp16/bf16 as real 16-bit words).
class TypedBuffer {
 public:
  TypedBuffer() = default;
  TypedBuffer(DType dtype, std::size_t count);  // zero-filled

  DType dtype() const noexcept { return dtype_; }
  std::size_t size() const noexcept { return bytes_.size() / dtype_size(dtype_); }
  std::size_t size_bytes() const noexcept { return bytes_.size(); }
  const std::byte* data() const noexcept { return bytes_.data(); }
  std::byte* data() noexcept { return bytes_.data(); }

  float get(std::size_t i) const noexcept { return load_as_float(bytes_.data(), dtype_, i); }
  void set(std::size_t i, float value) noexcept { store_from_float(bytes_.data(), dtype_, i, value); }
  std::vector<float> to_float() const;

 private:
  DType dtype_ = DType::f32;
  std::vector<std::byte> bytes_;
};

// Row-major rows x cols matrix of one dtype.
struct DenseMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  TypedBuffer values;

  static DenseMatrix zeros(int64_t rows, int64_t cols, DType dtype);
  // Rounds each float to `dtype`. `data` must hold rows*cols values, row-major. Throws Error (naming the row
  // and column) when a finite value would round to infinity: storage must never invent an infinity.
  static DenseMatrix from_float(int64_t rows, int64_t cols, std::span<const float> data, DType dtype);

  DType dtype() const noexcept { return values.dtype(); }
  float at(int64_t r, int64_t c) const noexcept { return values.get(static_cast<std::size_t>(r * cols + c)); }
  void set(int64_t r, int64_t c, float v) noexcept { values.set(static_cast<std::size_t>(r * cols + c), v); }
  std::vector<float> to_float() const { return values.to_float(); }
  std::size_t storage_bytes() const noexcept { return values.size_bytes(); }
};

// Which entries of a rows x cols matrix survive pruning (1 = kept), row-major.
struct Mask {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> keep;

  static Mask none(int64_t rows, int64_t cols) { return {rows, cols, std::vector<uint8_t>(rows * cols, 0)}; }
  bool at(int64_t r, int64_t c) const noexcept { return keep[static_cast<std::size_t>(r * cols + c)] != 0; }
  void set(int64_t r, int64_t c, bool k) noexcept { keep[static_cast<std::size_t>(r * cols + c)] = k ? 1 : 0; }
  int64_t count() const noexcept;
};

// Throws Error(invalid_argument) naming `what`, the row and the column of the first NaN or infinity in `m`:
// pruning scores, energies and Hessians are meaningless on non-finite data, so it is refused, never guessed at.
void require_finite(const DenseMatrix& m, std::string_view what);
// The same over a row-major rows x cols array of floats.
void require_finite(std::span<const float> values, int64_t cols, std::string_view what);

// How many non-zero values of `data` round to zero in `dtype` (below its smallest subnormal).
int64_t count_flushed_to_zero(std::span<const float> data, DType dtype);

// Mask of the non-zero entries of `dense`.
Mask nonzero_mask(const DenseMatrix& dense);

// `dense` with every entry outside `mask` set to zero (same dtype).
DenseMatrix apply_mask(const DenseMatrix& dense, const Mask& mask);

}  // namespace nmkit
