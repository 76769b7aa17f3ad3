#pragma once
// Magnitude pruning, a scorer: an entry's score is |w|, and selection by score decides what each format keeps.
#include "nmkit/prune/select.hpp"

namespace nmkit {

ScoreMatrix magnitude_scores(const DenseMatrix& weight);  // |w|

// Prunes `weight` into `spec` by magnitude and compresses it.
PruneResult prune_magnitude(const DenseMatrix& weight, const FormatSpec& spec);

// The masks alone, for building a format by hand: N:M, V:N:M (the 4 columns of each block by the exact search)
// and the tiles of the largest Frobenius norm.
Mask prune_nm_magnitude(const DenseMatrix& weight, int n, int m);
Mask prune_vnm_magnitude(const DenseMatrix& weight, int v, int n, int m, VnmSearchStats* stats = nullptr);
TileMask prune_tiles_by_norm(const DenseMatrix& weight, int tile_rows, int tile_cols, double density);

}  // namespace nmkit
