#include "nmkit/prune/energy.hpp"

#include <cmath>

#include "nmkit/error.hpp"

namespace nmkit {

void EnergyTally::add(const DenseMatrix& weight, const Mask& mask) {
  require(mask.rows == weight.rows && mask.cols == weight.cols, ErrorCode::invalid_argument,
          "energy: mask shape differs from the weight shape");
  double kept = 0.0, total = 0.0;
  const auto count = static_cast<int64_t>(mask.keep.size());
#pragma omp parallel for reduction(+ : kept, total) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const double a = std::fabs(weight.values.get(static_cast<std::size_t>(i)));
    total += a;
    if (mask.keep[static_cast<std::size_t>(i)]) kept += a;
  }
  kept_l1 += kept;
  total_l1 += total;
}

double energy(const DenseMatrix& weight, const Mask& mask) {
  EnergyTally tally;
  tally.add(weight, mask);
  return tally.ratio();
}

}  // namespace nmkit
