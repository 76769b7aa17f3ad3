#pragma once
// The energy metric of seed 000 §5: the L1 norm a mask keeps over the L1 norm of the dense weight.
#include <cmath>
#include <limits>

#include "nmkit/matrix.hpp"

namespace nmkit {

// Sums of |w| kept and in total; add tensors one by one for a whole-model figure.
struct EnergyTally {
  double kept_l1 = 0.0;
  double total_l1 = 0.0;

  void add(const DenseMatrix& weight, const Mask& mask);
  void add(const EnergyTally& other) noexcept { kept_l1 += other.kept_l1, total_l1 += other.total_l1; }
  // kept / total; 1 for an all-zero weight (nothing was lost); NaN when a non-finite value made the sums
  // meaningless, so that no figure is ever reported for data that could not be measured.
  double ratio() const noexcept {
    if (!std::isfinite(total_l1) || !std::isfinite(kept_l1)) return std::numeric_limits<double>::quiet_NaN();
    return total_l1 > 0.0 ? kept_l1 / total_l1 : 1.0;
  }
};

double energy(const DenseMatrix& weight, const Mask& mask);

}  // namespace nmkit
