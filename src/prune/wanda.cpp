#include "nmkit/prune/wanda.hpp"

#include "nmkit/prune/magnitude.hpp"
#include "statistics.hpp"

namespace nmkit {

ScoreMatrix wanda_scores(const DenseMatrix& weight, const LayerStatistics& stats) {
  detail::check_statistics(weight, stats);
  const std::vector<double> norms = stats.column_norms();
  ScoreMatrix s = magnitude_scores(weight);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) s.values[r * s.cols + c] *= static_cast<float>(norms[c]);
  return s;
}

PruneResult prune_wanda(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                        const Mask* allowed) {
  return prune_by_score(weight, wanda_scores(weight, stats), spec, allowed);
}

}  // namespace nmkit
