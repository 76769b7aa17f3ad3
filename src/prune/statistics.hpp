#pragma once
// The check that Wanda and OBS make before they read a layer's calibration statistics.
#include <cmath>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/matrix.hpp"
#include "nmkit/model/calibration.hpp"

namespace nmkit::detail {

// Throws Error when `s` was not collected for `w`'s columns, saw no token, or `w` or X^T X holds NaN or infinity.
inline void check_statistics(const DenseMatrix& w, const LayerStatistics& s) {
  require(s.in_features == w.cols && s.xtx.size() == static_cast<std::size_t>(w.cols * w.cols) && s.tokens > 0,
          ErrorCode::invalid_argument,
          "calibration statistics are for " + std::to_string(s.in_features) + " input features over " +
              std::to_string(s.tokens) + " tokens, the weight has " + std::to_string(w.cols) + " columns");
  require_finite(w, "weight");
  for (std::size_t i = 0; i < s.xtx.size(); ++i)
    require(std::isfinite(s.xtx[i]), ErrorCode::invalid_argument, [&] {
      return "the calibration statistics (X^T X) are not finite at [" + std::to_string(i / s.in_features) + ", " +
             std::to_string(i % s.in_features) + "]: the layer's calibration inputs hold NaN or infinity";
    });
}

}  // namespace nmkit::detail
