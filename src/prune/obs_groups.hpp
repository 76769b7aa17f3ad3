#pragma once
// The candidate sets inside one group, shared by the Hessian and Fisher OBS solvers: which entries of a row to
// keep by the saliency of pruning the rest, and the small SPD solve that saliency needs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "nmkit/prune/obs.hpp"

namespace nmkit::detail {

// The most pruned entries per group whose saliency is computed exactly (combinatorial candidates).
inline constexpr int kMaxCombinatorialSet = 16;

// The columns [c0, c0 + width) that a solver decides together: one N:M or V:N:M group.
struct ColumnGroup {
  int64_t c0 = 0;
  int width = 0;
};

// Rows [begin, end): the rows of one V:N:M block (fewer at the bottom edge).
struct RowBlock {
  int64_t begin = 0;
  int64_t end = 0;
  static RowBlock of(int64_t row, int v, int64_t rows) noexcept {
    const int64_t begin = row / v * v;
    return {begin, std::min<int64_t>(rows, begin + v)};
  }
};

// One row of one group as its candidate sets see it: the row's weights w_G and (H^-1)_GG, the inverse Hessian
// (or Fisher) of the group's columns not yet decided (width x width, row-major).
struct GroupRow {
  int64_t row = 0;
  ColumnGroup group;
  const std::vector<double>& hinv;
  std::vector<double> w;
};

// The row keeps the best min(keep, |candidates|) of `candidates` (group-relative columns, at most 16): those whose
// complement in the group has the smallest saliency; the rest of its group is pruned. With no candidate the row
// is left as it is.
void keep_best_set(const GroupRow& row, const std::vector<int>& candidates, int keep, ObsCandidates mode, Mask& mask);

// The columns of `group` (group-relative) that some row of `block` keeps in `mask`: a V:N:M block's chosen
// columns.
std::vector<int> kept_columns(const Mask& mask, RowBlock block, ColumnGroup group);

// b <- A^-1 b for a small symmetric positive definite A (n x n, row-major), by Cholesky; false when A is not SPD.
inline bool solve_spd(std::vector<double> a, std::vector<double>& b) {
  const int n = static_cast<int>(b.size());
  for (int j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (int k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (d <= 0.0) return false;
    d = std::sqrt(d);
    a[j * n + j] = d;
    for (int i = j + 1; i < n; ++i) {
      double v = a[i * n + j];
      for (int k = 0; k < j; ++k) v -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = v / d;
    }
  }
  for (int i = 0; i < n; ++i) {
    double v = b[i];
    for (int k = 0; k < i; ++k) v -= a[i * n + k] * b[k];
    b[i] = v / a[i * n + i];
  }
  for (int i = n - 1; i >= 0; --i) {
    double v = b[i];
    for (int k = i + 1; k < n; ++k) v -= a[k * n + i] * b[k];
    b[i] = v / a[i * n + i];
  }
  return true;
}

}  // namespace nmkit::detail
