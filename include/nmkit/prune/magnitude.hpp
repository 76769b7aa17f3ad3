#pragma once
// Score pruning into each format: keep what has the largest score under the format's constraints.
// Magnitude pruning scores |w|; Wanda scores |w| * ||X_j||; the second-order pruners use their saliency.
#include <cstdint>
#include <vector>

#include "nmkit/format/spec.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit {

// A non-negative score per weight entry (rows x cols, row-major): larger means more worth keeping.
struct ScoreMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;
  float at(int64_t r, int64_t c) const noexcept { return values[static_cast<std::size_t>(r * cols + c)]; }
  static ScoreMatrix magnitude(const DenseMatrix& weight);  // |w|
};

// Per group of M columns of each row, keeps the N largest scores (ties: the lower column).
Mask prune_nm_by_score(const ScoreMatrix& score, int n, int m);
Mask prune_nm_magnitude(const DenseMatrix& weight, int n, int m);

// The 4 columns one V x M block keeps, and the |w| they keep after N-of-4 per row.
struct VnmColumnChoice {
  int columns[4] = {0, 1, 2, 3};  // ascending offsets inside the block
  double kept_l1 = 0.0;
  bool proven_optimal = true;  // false when the search hit its node budget (the incumbent is kept)
};

// Default node budget of the exact search per block; see docs/formats.md ("choosing the columns").
inline constexpr int64_t kVnmSearchNodeBudget = 4'096;

// Exact choice for one block: `block_abs` holds rows x width values |w| (row-major), width <= M.
// Branch and bound over column subsets, seeded with greedy + swap local search.
VnmColumnChoice choose_vnm_columns(const float* block_abs, int rows, int width, int n,
                                   int64_t node_budget = kVnmSearchNodeBudget);

struct VnmSearchStats {
  int64_t blocks = 0;
  int64_t proven_optimal = 0;
};

// For each V x M block, the 4 columns that maximise the score kept after row-wise N:4 inside them,
// then the N largest of those 4 per row.
Mask prune_vnm_by_score(const ScoreMatrix& score, int v, int n, int m, VnmSearchStats* stats = nullptr);
Mask prune_vnm_magnitude(const DenseMatrix& weight, int v, int n, int m, VnmSearchStats* stats = nullptr);

// For each V x M block, keeps whole columns: the `columns` with the largest score summed over the block's
// rows (ties: the lower column). The intermediate steps of a gradual V:N:M schedule.
Mask prune_block_columns_by_score(const ScoreMatrix& score, int v, int m, int columns);

// Keeps the fraction `density` of tiles (at least one) with the largest sum of squared scores, i.e. the
// largest Frobenius norm for magnitude (ties: the lower tile index in row-major grid order).
TileMask prune_tiles_by_score(const ScoreMatrix& score, int tile_rows, int tile_cols, double density);
TileMask prune_tiles_by_norm(const DenseMatrix& weight, int tile_rows, int tile_cols, double density);

// Prunes `weight` into `spec` by magnitude and compresses it.
struct PruneResult {
  SparseMatrix compressed;
  Mask mask;
  double energy = 1.0;
};
PruneResult prune_magnitude(const DenseMatrix& weight, const FormatSpec& spec);
// Prunes `weight` into `spec` keeping the entries with the largest `score`, and compresses it. With `allowed`,
// entries outside it stay pruned whatever their score (gradual schedules: what was pruned stays pruned).
PruneResult prune_by_score(const DenseMatrix& weight, const ScoreMatrix& score, const FormatSpec& spec,
                           const Mask* allowed = nullptr);
// `score` with every entry outside `allowed` set to 0 (never preferred to an allowed one).
ScoreMatrix restrict_scores(ScoreMatrix score, const Mask& allowed);

}  // namespace nmkit
