#pragma once
// Shared helpers of the tests: seeded random data (never zeros), matrix comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit::test {

// Uniform values in +-[0.1, 1): no zeros, so patterns come only from pruning.
inline std::vector<float> random_nonzero(std::size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(0.1f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(count);
  for (float& x : v) x = negative(rng) ? -mag(rng) : mag(rng);
  return v;
}

inline DenseMatrix random_matrix(int64_t rows, int64_t cols, DType dtype, uint32_t seed) {
  return DenseMatrix::from_float(rows, cols, random_nonzero(static_cast<std::size_t>(rows * cols), seed), dtype);
}

// Bitwise equality of values (after both were stored in the same dtype).
inline void expect_same_matrix(const DenseMatrix& got, const DenseMatrix& want) {
  ASSERT_EQ(got.rows, want.rows);
  ASSERT_EQ(got.cols, want.cols);
  ASSERT_EQ(got.dtype(), want.dtype());
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t c = 0; c < want.cols; ++c)
      ASSERT_EQ(got.at(r, c), want.at(r, c)) << "first mismatch at (" << r << ", " << c << ")";
}

// The tests' own error measures (never the library's, so that a bug there cannot hide one elsewhere).
// ||got - want||_F / ||want||_F in double; the absolute norm when `want` is zero.
inline double relative_frobenius(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = double{got[i]} - double{want[i]};
    diff += d * d, norm += double{want[i]} * want[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The worst element against its own allowance, rel * |want_i| + abs_of_rms * rms(want): a result above 1 names an
// element outside it (`worst` gets its index). A norm alone would pass a small block of wrong values in a large output.
inline double worst_element_excess(const std::vector<float>& got, const std::vector<float>& want, double rel,
                                   double abs_of_rms, std::size_t* worst = nullptr) {
  double sum_squares = 0.0;
  for (const float w : want) sum_squares += double{w} * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(sum_squares / static_cast<double>(want.size()));
  double excess = 0.0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double allowance = rel * std::fabs(double{want[i]}) + abs_of_rms * rms + 1e-30;
    const double e = std::isfinite(got[i]) ? std::fabs(double{got[i]} - want[i]) / allowance : HUGE_VAL;
    if (e > excess) {
      excess = e;
      if (worst) *worst = i;
    }
  }
  return excess;
}

// Throws nmkit::Error whose code is `code` and whose message contains `fragment`.
#define EXPECT_NMKIT_ERROR(statement, error_code, fragment)              \
  do {                                                                   \
    try {                                                                \
      statement;                                                         \
      ADD_FAILURE() << "expected nmkit::Error from " #statement;         \
    } catch (const ::nmkit::Error& e) {                                  \
      EXPECT_EQ(e.code(), error_code) << e.what();                       \
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) \
          << "message '" << e.what() << "' lacks '" << fragment << "'";  \
    }                                                                    \
  } while (0)

}  // namespace nmkit::test
