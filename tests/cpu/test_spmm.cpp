// The CPU reference SpMM against the plain dense GEMM, and the dense GEMM against a scalar loop.
#include <gtest/gtest.h>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/error.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

using test::random_nonzero;

constexpr double kTolerance = 1e-5;  // both sides accumulate in fp32 over the same products

struct Operands {
  std::vector<float> b, c, d_sparse, d_dense, bias;
};

struct EpilogueCase {
  float alpha, beta;
  bool bias;
};

// Runs spmm and gemm on the same inputs and returns the relative Frobenius difference.
double compare(const SparseMatrix& a, int64_t cols, Layout b_layout, Layout d_layout, const EpilogueCase& ec, uint32_t seed) {
  const int64_t r = rows_of(a), k = cols_of(a);
  Operands o{random_nonzero(static_cast<std::size_t>(k * cols), seed), random_nonzero(static_cast<std::size_t>(r * cols), seed + 1),
             std::vector<float>(static_cast<std::size_t>(r * cols), -777.0f),  // poisoned
             std::vector<float>(static_cast<std::size_t>(r * cols), 555.0f), random_nonzero(static_cast<std::size_t>(r), seed + 2)};
  const Epilogue e{ec.alpha, ec.beta, ec.bias ? o.bias.data() : nullptr};
  const ConstMatrixRef b{o.b.data(), k, cols, b_layout};
  const ConstMatrixRef c{o.c.data(), r, cols, d_layout};
  spmm(a, b, c, {o.d_sparse.data(), r, cols, d_layout}, e);
  gemm(decompress(a), b, c, {o.d_dense.data(), r, cols, d_layout}, e);
  return test::relative_frobenius(o.d_sparse, o.d_dense);
}

TEST(CpuSpmm, EveryFormatLayoutAndEpilogueAgreesWithDense) {
  const char* specs[] = {"2:4", "1:4", "3:7", "vnm:16:2:8", "vnm:32:1:5", "vnm:8:2:20", "tile:16x16:0.4", "tile:32x8:0.7"};
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 33}, {64, 96}, {45, 130}};
  const EpilogueCase epilogues[] = {{1.0f, 0.0f, false}, {0.5f, 0.0f, false}, {1.5f, -0.75f, false}, {1.0f, 1.0f, true}};
  uint32_t seed = 1000;
  for (const char* spec : specs)
    for (auto [rows, k] : shapes)
      for (DType dtype : {DType::f16, DType::bf16}) {
        const DenseMatrix w = test::random_matrix(rows, k, dtype, seed++);
        const SparseMatrix a = prune_magnitude(w, parse_format_spec(spec)).compressed;
        for (int64_t cols : {1, 7, 64})
          for (Layout bl : {Layout::row_major, Layout::col_major})
            for (Layout dl : {Layout::row_major, Layout::col_major})
              for (const EpilogueCase& e : epilogues) {
                SCOPED_TRACE(testing::Message() << spec << " " << rows << "x" << k << "x" << cols << " B " << layout_name(bl)
                                                << " D " << layout_name(dl) << " alpha " << e.alpha << " beta " << e.beta);
                EXPECT_LE(compare(a, cols, bl, dl, e, seed++), kTolerance);
              }
      }
}

TEST(CpuGemm, MatchesAScalarLoop) {
  const int64_t r = 9, k = 13, c = 11;
  const DenseMatrix a = test::random_matrix(r, k, DType::f32, 3);
  const std::vector<float> b = random_nonzero(static_cast<std::size_t>(k * c), 4), cin = random_nonzero(static_cast<std::size_t>(r * c), 5),
                           bias = random_nonzero(static_cast<std::size_t>(r), 6);
  std::vector<float> d(static_cast<std::size_t>(r * c));
  gemm(a, {b.data(), k, c, Layout::col_major}, {cin.data(), r, c, Layout::row_major}, {d.data(), r, c, Layout::row_major},
       {2.0f, 0.5f, bias.data()});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) {
      double want = 0.0;
      for (int64_t p = 0; p < k; ++p) want += double{a.at(i, p)} * b[static_cast<std::size_t>(j * k + p)];
      want = 2.0 * want + 0.5 * cin[static_cast<std::size_t>(i * c + j)] + bias[static_cast<std::size_t>(i)];
      EXPECT_NEAR(d[static_cast<std::size_t>(i * c + j)], want, 1e-5 * (1.0 + std::fabs(want))) << i << "," << j;
    }
}

TEST(CpuSpmm, IntegerInputsMatchExactly) {
  // Small integers are exact in fp32 and fp16: the sparse and dense results must be bit-equal.
  DenseMatrix w = DenseMatrix::zeros(24, 40, DType::f16);
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) w.set(r, c, static_cast<float>((r * 7 + c * 3) % 9 - 4));
  const SparseMatrix a = prune_magnitude(w, parse_format_spec("vnm:8:2:10")).compressed;
  std::vector<float> b(40 * 5), d1(24 * 5), d2(24 * 5);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  spmm(a, {b.data(), 40, 5, Layout::row_major}, {}, {d1.data(), 24, 5, Layout::row_major});
  gemm(decompress(a), {b.data(), 40, 5, Layout::row_major}, {}, {d2.data(), 24, 5, Layout::row_major});
  EXPECT_EQ(d1, d2);
}

TEST(CpuSpmm, RejectsMismatchedShapes) {
  const SparseMatrix a = prune_magnitude(test::random_matrix(8, 16, DType::f16, 1), parse_format_spec("2:4")).compressed;
  std::vector<float> b(16 * 4), d(8 * 4);
  EXPECT_NMKIT_ERROR(spmm(a, {b.data(), 15, 4}, {}, {d.data(), 8, 4}), ErrorCode::invalid_argument, "K=16");
  EXPECT_NMKIT_ERROR(spmm(a, {b.data(), 16, 4}, {}, {d.data(), 8, 3}), ErrorCode::invalid_argument, "expected 8x4");
  EXPECT_NMKIT_ERROR(spmm(a, {b.data(), 16, 4}, {}, {d.data(), 8, 4}, {1.0f, 1.0f, nullptr}), ErrorCode::invalid_argument,
                     "beta != 0 needs C");
}

}  // namespace
}  // namespace nmkit
