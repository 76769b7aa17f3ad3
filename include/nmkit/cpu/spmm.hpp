#pragma once
// CPU reference kernels, the oracle of every GPU kernel: D = alpha * A * B + beta * C (+ bias[r]),
// fp32 accumulation, OpenMP. A is sparse (R x K) in any format; B (K x C), C and D (R x C) are fp32
// in either layout. Simple and obviously right; fast enough for 4096^3 in seconds.
#include <cstdint>
#include <span>

#include "nmkit/format/spec.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit {

// A non-owning fp32 matrix view. Element (r, c) lives at r*cols + c (row-major) or c*rows + r.
struct ConstMatrixRef {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Layout layout = Layout::row_major;
  float at(int64_t r, int64_t c) const noexcept {
    return data[layout == Layout::row_major ? r * cols + c : c * rows + r];
  }
};
struct MatrixRef {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Layout layout = Layout::row_major;
  float& at(int64_t r, int64_t c) const noexcept {
    return data[layout == Layout::row_major ? r * cols + c : c * rows + r];
  }
  operator ConstMatrixRef() const noexcept { return {data, rows, cols, layout}; }
};

// D = act(alpha * A*B + beta * C + bias[r]). C is read only when beta != 0; bias (length R) is optional.
struct Epilogue {
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* bias = nullptr;
  Activation activation = Activation::none;
};

// ||got - want||_F / ||want||_F (||got - want||_F when want is zero): how GPU and CPU results are compared.
double relative_frobenius_error(std::span<const float> got, std::span<const float> want);

// Sparse A in any format.
void spmm(const SparseMatrix& a, ConstMatrixRef b, ConstMatrixRef c, MatrixRef d, const Epilogue& epilogue = {});
// Plain dense GEMM with the same contract: the independent check of spmm.
void gemm(const DenseMatrix& a, ConstMatrixRef b, ConstMatrixRef c, MatrixRef d, const Epilogue& epilogue = {});

}  // namespace nmkit
