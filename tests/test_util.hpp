#pragma once
// Shared helpers of the tests: seeded random data (never zeros), matrix comparison.
#include <gtest/gtest.h>

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

inline double relative_frobenius(const std::vector<float>& got, const std::vector<float>& want) {
  return relative_frobenius_error(got, want);
}

// Throws nmkit::Error whose code is `code` and whose message contains `fragment`.
#define EXPECT_NMKIT_ERROR(statement, error_code, fragment)                                        \
  do {                                                                                             \
    try {                                                                                          \
      statement;                                                                                   \
      ADD_FAILURE() << "expected nmkit::Error from " #statement;                                   \
    } catch (const ::nmkit::Error& e) {                                                            \
      EXPECT_EQ(e.code(), error_code) << e.what();                                                 \
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)                           \
          << "message '" << e.what() << "' lacks '" << fragment << "'";                            \
    }                                                                                              \
  } while (0)

}  // namespace nmkit::test
