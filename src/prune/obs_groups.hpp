#pragma once
// Pieces shared by the Hessian and Fisher OBS pruners: a small SPD solve and the choice of a row's kept set
// inside a group by the candidate saliency.
#include <cmath>
#include <cstdint>
#include <vector>

#include "nmkit/prune/activation_aware.hpp"

namespace nmkit::detail {

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

// The `keep`-subset of `candidates` (group-relative columns, at most 16) whose complement in the group has the
// smallest saliency; bit c of the result selects candidates[c].
uint32_t best_kept_set(const std::vector<double>& hinv_group, int width, const std::vector<double>& w_group,
                       const std::vector<int>& candidates, int keep, ObsCandidates mode);

}  // namespace nmkit::detail
