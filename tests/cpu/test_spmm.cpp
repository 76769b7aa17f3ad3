// The CPU reference SpMM and the dense GEMM, each against plain double-precision loops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/error.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

using test::random_nonzero;

struct EpilogueCase {
  float alpha, beta;
  bool bias;
  Activation activation;
};

double activate(Activation act, double x) {
  switch (act) {
    case Activation::none:
      return x;
    case Activation::relu:
      return x > 0.0 ? x : 0.0;
    case Activation::gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  return x;
}

// Runs spmm on random B, C and bias over a poisoned D and checks every element against act(alpha * W B + beta C +
// bias) computed in double by plain loops over `kept` (the pruner's mask applied to the dense weight: no code shared
// with spmm's index lookup or epilogue). The per-element bound is fp32 rounding of the sum of the terms' magnitudes.
void expect_matches_loop(const SparseMatrix& a, const DenseMatrix& kept, int64_t cols, Layout b_layout, Layout d_layout,
                         const EpilogueCase& ec, uint32_t seed) {
  const int64_t r = rows_of(a), k = cols_of(a);
  const std::vector<float> b = random_nonzero(static_cast<std::size_t>(k * cols), seed),
                           c = random_nonzero(static_cast<std::size_t>(r * cols), seed + 1),
                           bias = random_nonzero(static_cast<std::size_t>(r), seed + 2);
  std::vector<float> d(static_cast<std::size_t>(r * cols), std::numeric_limits<float>::quiet_NaN());
  auto at = [](int64_t rows, int64_t cols_, Layout layout, int64_t i, int64_t j) {
    return static_cast<std::size_t>(layout == Layout::row_major ? i * cols_ + j : j * rows + i);
  };
  spmm(a, {b.data(), k, cols, b_layout}, {c.data(), r, cols, d_layout}, {d.data(), r, cols, d_layout},
       {ec.alpha, ec.beta, ec.bias ? bias.data() : nullptr, ec.activation});
  std::vector<float> got, want_f;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double term = double{kept.at(i, p)} * b[at(k, cols, b_layout, p, j)];
        sum += term, magnitude += std::fabs(term);
      }
      const double cij = c[at(r, cols, d_layout, i, j)];
      double pre = ec.alpha * sum + ec.beta * cij + (ec.bias ? bias[static_cast<std::size_t>(i)] : 0.0);
      magnitude = std::fabs(ec.alpha) * magnitude + std::fabs(ec.beta * cij) +
                  (ec.bias ? std::fabs(bias[static_cast<std::size_t>(i)]) : 0.0);
      const double want = activate(ec.activation, pre);
      const double got_ij = d[at(r, cols, d_layout, i, j)];
      // fp32 accumulation over k terms: each partial sum rounds once (k * 2^-24 of the magnitude, doubled).
      const double bound = 2.0 * static_cast<double>(k + 3) * 0x1p-24 * (magnitude + 1e-30);
      ASSERT_LE(std::fabs(got_ij - want), bound)
          << "element (" << i << ", " << j << "): got " << got_ij << ", want " << want;
      got.push_back(static_cast<float>(got_ij)), want_f.push_back(static_cast<float>(want));
    }
  EXPECT_LE(test::relative_frobenius(got, want_f), 1e-5);  // loose: a 1 x 1 output can cancel to near zero
}

TEST(CpuSpmm, EveryFormatLayoutAndEpilogueAgreesWithAPlainLoop) {
  const char* specs[] = {"2:4",          "1:4", "3:7", "vnm:16:2:8", "vnm:32:1:5", "vnm:8:2:20", "tile:16x16:0.4",
                         "tile:32x8:0.7"};
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 33}, {64, 96}, {45, 130}};
  const EpilogueCase epilogues[] = {{1.0f, 0.0f, false, Activation::none},   {0.5f, 0.0f, false, Activation::relu},
                                    {1.5f, -0.75f, false, Activation::gelu}, {1.0f, 1.0f, true, Activation::none},
                                    {-1.0f, 0.5f, true, Activation::relu},   {0.75f, 0.25f, true, Activation::gelu}};
  uint32_t seed = 1000;
  for (const char* spec : specs)
    for (auto [rows, k] : shapes)
      for (DType dtype : {DType::f16, DType::bf16}) {
        const DenseMatrix w = test::random_matrix(rows, k, dtype, seed++);
        const PruneResult pruned = prune_magnitude(w, parse_format_spec(spec));
        const DenseMatrix kept = apply_mask(w, pruned.mask);
        for (int64_t cols : {1, 7, 64})
          for (Layout bl : {Layout::row_major, Layout::col_major})
            for (Layout dl : {Layout::row_major, Layout::col_major})
              for (const EpilogueCase& e : epilogues) {
                SCOPED_TRACE(testing::Message() << spec << " " << rows << "x" << k << "x" << cols << " B "
                                                << layout_name(bl) << " D " << layout_name(dl) << " alpha " << e.alpha
                                                << " beta " << e.beta << " " << activation_name(e.activation));
                expect_matches_loop(pruned.compressed, kept, cols, bl, dl, e, seed++);
              }
      }
}

TEST(TestErrorMeasures, APerElementBoundCatchesAWrongFragmentTheNormMisses) {
  // A 768 x 4000 output (the GPU tests' largest) whose one 16 x 8 MMA fragment is off by half the RMS: the norm
  // stays under bf16's tolerance, each element's own allowance does not.
  const std::vector<float> want = random_nonzero(768 * 4000, 77);
  std::vector<float> got = want;
  for (float& v : got) v = round_to(DType::bf16, v);  // what a correct bf16 kernel returns
  EXPECT_LE(test::worst_element_excess(got, want, 2.0 * 0x1p-8, 1e-2), 1.0);
  double sum_squares = 0.0;
  for (const float w : want) sum_squares += double{w} * w;
  const float half_rms = static_cast<float>(0.5 * std::sqrt(sum_squares / static_cast<double>(want.size())));
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) got[static_cast<std::size_t>((320 + i) * 4000 + 1000 + j)] += half_rms;
  EXPECT_LT(test::relative_frobenius(got, want), 1e-2);
  std::size_t worst = 0;
  EXPECT_GT(test::worst_element_excess(got, want, 2.0 * 0x1p-8, 1e-2, &worst), 1.0);
  EXPECT_EQ(worst / 4000 / 16, 320u / 16);
}

TEST(CpuGemm, MatchesAScalarLoop) {
  const int64_t r = 9, k = 13, c = 11;
  const DenseMatrix a = test::random_matrix(r, k, DType::f32, 3);
  const std::vector<float> b = random_nonzero(static_cast<std::size_t>(k * c), 4),
                           cin = random_nonzero(static_cast<std::size_t>(r * c), 5),
                           bias = random_nonzero(static_cast<std::size_t>(r), 6);
  std::vector<float> d(static_cast<std::size_t>(r * c));
  gemm(a, {b.data(), k, c, Layout::col_major}, {cin.data(), r, c, Layout::row_major},
       {d.data(), r, c, Layout::row_major}, {2.0f, 0.5f, bias.data()});
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
  const SparseMatrix a =
      prune_magnitude(test::random_matrix(8, 16, DType::f16, 1), parse_format_spec("2:4")).compressed;
  std::vector<float> b(16 * 4), d(8 * 4);
  EXPECT_NMKIT_ERROR(spmm(a, {b.data(), 15, 4}, {}, {d.data(), 8, 4}), ErrorCode::invalid_argument, "K=16");
  EXPECT_NMKIT_ERROR(spmm(a, {b.data(), 16, 4}, {}, {d.data(), 8, 3}), ErrorCode::invalid_argument, "expected 8x4");
  EXPECT_NMKIT_ERROR(spmm(a, {b.data(), 16, 4}, {}, {d.data(), 8, 4}, {1.0f, 1.0f, nullptr}),
                     ErrorCode::invalid_argument, "beta != 0 needs C");
}

}  // namespace
}  // namespace nmkit
