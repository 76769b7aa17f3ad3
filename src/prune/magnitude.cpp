#include "nmkit/prune/magnitude.hpp"

#include <cmath>

namespace nmkit {

ScoreMatrix magnitude_scores(const DenseMatrix& weight) {
  ScoreMatrix s{weight.rows, weight.cols, std::vector<float>(static_cast<std::size_t>(weight.rows * weight.cols))};
  for (std::size_t i = 0; i < s.values.size(); ++i) s.values[i] = std::fabs(weight.values.get(i));
  return s;
}

PruneResult prune_magnitude(const DenseMatrix& weight, const FormatSpec& spec) {
  return prune_by_score(weight, magnitude_scores(weight), spec);
}

Mask prune_nm_magnitude(const DenseMatrix& weight, int n, int m) { return select_nm(magnitude_scores(weight), n, m); }

Mask prune_vnm_magnitude(const DenseMatrix& weight, int v, int n, int m, VnmSearchStats* stats) {
  return select_vnm(magnitude_scores(weight), v, n, m, stats);
}

TileMask prune_tiles_by_norm(const DenseMatrix& weight, int tile_rows, int tile_cols, double density) {
  return select_tiles(magnitude_scores(weight), tile_rows, tile_cols, density);
}

}  // namespace nmkit
