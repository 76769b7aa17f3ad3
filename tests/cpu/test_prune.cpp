// Pruners keep exactly the right counts and the best columns; energy falls as sparsity grows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "nmkit/error.hpp"
#include "nmkit/prune/energy.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/select.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

using test::random_matrix;

// Sum over rows of the N largest |w| among `cols` (the V:N:M objective), by brute force.
double kept_by_columns(const std::vector<float>& a, int rows, int width, const std::vector<int>& cols, int n) {
  double sum = 0.0;
  for (int r = 0; r < rows; ++r) {
    std::vector<float> v;
    for (int c : cols) v.push_back(a[r * width + c]);
    std::sort(v.rbegin(), v.rend());
    for (int i = 0; i < n && i < static_cast<int>(v.size()); ++i) sum += v[i];
  }
  return sum;
}

double brute_force_best(const std::vector<float>& a, int rows, int width, int n) {
  double best = -1.0;
  for (int c0 = 0; c0 < width; ++c0)
    for (int c1 = c0 + 1; c1 < width; ++c1)
      for (int c2 = c1 + 1; c2 < width; ++c2)
        for (int c3 = c2 + 1; c3 < width; ++c3)
          best = std::max(best, kept_by_columns(a, rows, width, {c0, c1, c2, c3}, n));
  return best;
}

TEST(NmMagnitude, KeepsExactlyNLargestPerGroup) {
  for (auto [n, m] : {std::pair{2, 4}, {1, 4}, {3, 8}, {2, 7}}) {
    const DenseMatrix w = random_matrix(13, 45, DType::f32, 21);
    const Mask mask = prune_nm_magnitude(w, n, m);
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c0 = 0; c0 < w.cols; c0 += m) {
        const int64_t c1 = std::min<int64_t>(c0 + m, w.cols);
        int kept = 0;
        float smallest_kept = 2.0f, largest_dropped = 0.0f;
        for (int64_t c = c0; c < c1; ++c) {
          const float a = std::fabs(w.at(r, c));
          if (mask.at(r, c))
            ++kept, smallest_kept = std::min(smallest_kept, a);
          else
            largest_dropped = std::max(largest_dropped, a);
        }
        EXPECT_EQ(kept, std::min<int64_t>(n, c1 - c0)) << "row " << r << " group " << c0 / m;
        EXPECT_GE(smallest_kept, largest_dropped);
      }
  }
}

TEST(VnmColumnChoice, MatchesBruteForceOnSmallBlocks) {
  uint32_t seed = 500;
  for (int n : {1, 2})
    for (int width : {5, 6, 7, 8, 10, 12, 16})
      for (int rows : {1, 2, 3, 8, 16})
        for (int trial = 0; trial < 4; ++trial) {
          // Mixed magnitudes make the choice non-trivial: some rows favour other columns.
          std::vector<float> a = test::random_nonzero(static_cast<std::size_t>(rows * width), seed++);
          for (float& x : a) x = std::fabs(x) * std::fabs(x) * std::fabs(x);
          const VnmColumnChoice choice = choose_vnm_columns(a.data(), rows, width, n, int64_t{1} << 40);
          EXPECT_TRUE(choice.proven_optimal);
          EXPECT_TRUE(std::is_sorted(choice.columns, choice.columns + 4));
          const double want = brute_force_best(a, rows, width, n);
          EXPECT_NEAR(choice.kept_score, want, 1e-6 * want) << "n=" << n << " width=" << width << " rows=" << rows;
          EXPECT_NEAR(kept_by_columns(a, rows, width, {choice.columns, choice.columns + 4}, n), want, 1e-6 * want);
        }
}

TEST(VnmColumnChoice, GivesUpGracefullyOnATinyBudget) {
  const std::vector<float> a = test::random_nonzero(64 * 32, 77);
  std::vector<float> abs_a(a.size());
  std::transform(a.begin(), a.end(), abs_a.begin(), [](float x) { return std::fabs(x); });
  const VnmColumnChoice exact = choose_vnm_columns(abs_a.data(), 64, 32, 2, int64_t{1} << 40);
  const VnmColumnChoice quick = choose_vnm_columns(abs_a.data(), 64, 32, 2, 10);
  EXPECT_FALSE(quick.proven_optimal);
  EXPECT_LE(quick.kept_score, exact.kept_score + 1e-9);
  EXPECT_GT(quick.kept_score, 0.9 * exact.kept_score);  // the greedy + swap incumbent is already good
}

TEST(VnmMagnitude, KeepsFourColumnsAndNPerRow) {
  for (auto [v, n, m] : {std::tuple{4, 2, 8}, {16, 1, 7}, {8, 2, 16}, {32, 2, 5}}) {
    const DenseMatrix w = random_matrix(70, 83, DType::f16, 31);
    VnmSearchStats stats;
    const Mask mask = prune_vnm_magnitude(w, v, n, m, &stats);
    EXPECT_EQ(stats.blocks, ceil_div(70, v) * ceil_div(83, m));
    EXPECT_EQ(stats.proven_optimal, stats.blocks);
    for (int64_t r0 = 0; r0 < w.rows; r0 += v)
      for (int64_t c0 = 0; c0 < w.cols; c0 += m) {
        const int64_t r1 = std::min<int64_t>(r0 + v, w.rows), c1 = std::min<int64_t>(c0 + m, w.cols);
        int columns = 0;
        for (int64_t c = c0; c < c1; ++c) {
          bool any = false;
          for (int64_t r = r0; r < r1; ++r) any = any || mask.at(r, c);
          columns += any ? 1 : 0;
        }
        EXPECT_LE(columns, 4);
        for (int64_t r = r0; r < r1; ++r) {
          int kept = 0;
          for (int64_t c = c0; c < c1; ++c) kept += mask.at(r, c) ? 1 : 0;
          EXPECT_EQ(kept, std::min<int64_t>(n, c1 - c0)) << "row " << r << " group " << c0 / m;
        }
      }
    EXPECT_NO_THROW(compress_vnm(w, mask, v, n, m));
  }
}

TEST(VnmMagnitude, EqualsTwoFourWhenMIsFour) {
  const DenseMatrix w = random_matrix(32, 64, DType::f32, 41);
  EXPECT_EQ(prune_vnm_magnitude(w, 16, 2, 4).keep, prune_nm_magnitude(w, 2, 4).keep);
}

TEST(TileByNorm, KeepsTheLargestTiles) {
  DenseMatrix w = random_matrix(64, 64, DType::f32, 51);
  for (int c = 0; c < 16; ++c)
    for (int r = 32; r < 48; ++r) w.set(r, c + 16, 10.0f);  // tile (2, 1) dominates
  const TileMask mask = prune_tiles_by_norm(w, 16, 16, 0.25);
  EXPECT_EQ(std::count(mask.keep.begin(), mask.keep.end(), 1), 4);
  EXPECT_TRUE(mask.at(2, 1));
  const TileMask one = prune_tiles_by_norm(w, 16, 16, 0.01);  // rounds to zero tiles: at least one is kept
  EXPECT_EQ(std::count(one.keep.begin(), one.keep.end(), 1), 1);
  EXPECT_NMKIT_ERROR(prune_tiles_by_norm(w, 16, 16, 0.0), ErrorCode::invalid_argument, "density");
}

TEST(Energy, IsKeptL1OverTotalL1) {
  DenseMatrix w = DenseMatrix::zeros(2, 4, DType::f32);
  const float values[] = {1, -2, 3, -4, 0.5f, 0, 0, -0.5f};
  for (int i = 0; i < 8; ++i) w.set(i / 4, i % 4, values[i]);
  // 2:4 keeps 3 and -4 of the first row, 0.5 and -0.5 of the second: (7 + 1) / (10 + 1).
  EXPECT_DOUBLE_EQ(energy(w, prune_nm_magnitude(w, 2, 4)), 8.0 / 11.0);
  EXPECT_DOUBLE_EQ(energy(DenseMatrix::zeros(3, 4, DType::f32), Mask::none(3, 4)), 1.0);  // nothing to lose
  w.set(1, 1, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(energy(w, prune_nm_magnitude(w, 2, 4))));  // never a number for what was not measured
  EXPECT_NMKIT_ERROR(prune_magnitude(w, NmSpec{2, 4}), ErrorCode::invalid_argument, "weight row 1, column 1 is NaN");
  w.set(1, 1, -std::numeric_limits<float>::infinity());
  EXPECT_NMKIT_ERROR(prune_magnitude(w, NmSpec{2, 4}), ErrorCode::invalid_argument, "row 1, column 1 is -inf");
}

TEST(Energy, FallsAsSparsityGrows) {
  const DenseMatrix w = random_matrix(128, 256, DType::f32, 61);
  const double e24 = energy(w, prune_nm_magnitude(w, 2, 4));
  const double e28 = energy(w, prune_nm_magnitude(w, 2, 8));
  const double e216 = energy(w, prune_nm_magnitude(w, 2, 16));
  EXPECT_GT(e24, e28);
  EXPECT_GT(e28, e216);
  EXPECT_GT(e24, 0.5);  // magnitude keeps more than the fraction of entries kept
  const double v24 = energy(w, prune_vnm_magnitude(w, 64, 2, 8));
  EXPECT_LE(v24, e28 + 1e-12);  // V:N:M is a restriction of 2:8
  EXPECT_DOUBLE_EQ(energy(w, Mask{w.rows, w.cols, std::vector<uint8_t>(w.rows * w.cols, 1)}), 1.0);

  EnergyTally model;
  model.add(w, prune_nm_magnitude(w, 2, 4));
  model.add(w, Mask::none(w.rows, w.cols));
  EXPECT_NEAR(model.ratio(), e24 / 2.0, 1e-12);
}

TEST(PruneMagnitude, EachFormatCompressesWhatItKeeps) {
  const DenseMatrix w = random_matrix(96, 160, DType::bf16, 71);
  for (const char* spec : {"2:4", "vnm:32:2:10", "tile:32x16:0.3"}) {
    const PruneResult r = prune_magnitude(w, parse_format_spec(spec));
    test::expect_same_matrix(decompress(r.compressed), apply_mask(w, r.mask));
    double kept = 0.0, total = 0.0;  // the energy metric recomputed here: kept L1 over total L1
    for (int64_t i = 0; i < w.rows; ++i)
      for (int64_t j = 0; j < w.cols; ++j) {
        total += std::fabs(w.at(i, j));
        if (r.mask.at(i, j)) kept += std::fabs(w.at(i, j));
      }
    EXPECT_NEAR(r.energy, kept / total, 1e-12) << spec;
  }
}

}  // namespace
}  // namespace nmkit
