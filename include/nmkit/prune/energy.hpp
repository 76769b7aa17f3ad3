#pragma once
// The energy metric of seed 000 §5: the L1 norm a mask keeps over the L1 norm of the dense weight.
#include "nmkit/matrix.hpp"

namespace nmkit {

// Sums of |w| kept and in total; add tensors one by one for a whole-model figure.
struct EnergyTally {
  double kept_l1 = 0.0;
  double total_l1 = 0.0;

  void add(const DenseMatrix& weight, const Mask& mask);
  void add(const EnergyTally& other) noexcept { kept_l1 += other.kept_l1, total_l1 += other.total_l1; }
  // kept / total; 1 for an all-zero weight (nothing was lost).
  double ratio() const noexcept { return total_l1 > 0.0 ? kept_l1 / total_l1 : 1.0; }
};

double energy(const DenseMatrix& weight, const Mask& mask);

}  // namespace nmkit
