#pragma once
// Selection by score: what each format keeps of a weight, given one score per entry and whatever that score
// measures; the scorers (magnitude, Wanda) and the solvers (OBS, Fisher OBS) all choose their patterns here.
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
};

// `score` with every entry outside `allowed` set to 0 (never preferred to an allowed one).
ScoreMatrix restrict_scores(ScoreMatrix score, const Mask& allowed);

// Per group of M columns of each row, keeps the N largest scores (ties: the lower column).
Mask select_nm(const ScoreMatrix& score, int n, int m);

// The 4 columns one V x M block keeps, and the score they keep after N-of-4 per row.
struct VnmColumnChoice {
  int columns[4] = {0, 1, 2, 3};  // ascending offsets inside the block
  double kept_score = 0.0;
  bool proven_optimal = true;  // false when the search hit its node budget (the incumbent is kept)
};

// Default node budget of the exact search per block; see docs/formats.md ("choosing the columns").
inline constexpr int64_t kVnmSearchNodeBudget = 4'096;

// Exact choice for one block: `block_scores` holds rows x width scores (row-major), width <= M.
// Branch and bound over column subsets, seeded with greedy + swap local search.
VnmColumnChoice choose_vnm_columns(const float* block_scores, int rows, int width, int n,
                                   int64_t node_budget = kVnmSearchNodeBudget);

struct VnmSearchStats {
  int64_t blocks = 0;
  int64_t proven_optimal = 0;
};

// For each V x M block, the 4 columns that maximise the score kept after row-wise N:4 inside them,
// then the N largest of those 4 per row.
Mask select_vnm(const ScoreMatrix& score, int v, int n, int m, VnmSearchStats* stats = nullptr);

// For each V x M block, keeps whole columns: the `columns` with the largest score summed over the block's
// rows (ties: the lower column). The intermediate steps of a gradual V:N:M schedule. With `allowed`, entries
// outside it score 0 and stay pruned.
Mask select_block_columns(const ScoreMatrix& score, int v, int m, int columns, const Mask* allowed = nullptr);

// Keeps the fraction `density` of tiles (at least one) with the largest sum of squared scores, i.e. the
// largest Frobenius norm for magnitude (ties: the lower tile index in row-major grid order).
TileMask select_tiles(const ScoreMatrix& score, int tile_rows, int tile_cols, double density);

// What a format keeps: the entries, and for a tile format the tiles (a kept tile may hold pruned entries
// when `allowed` excluded them).
struct Selection {
  Mask mask;
  TileMask tiles;
};

// The selection of `spec` by `score`. With `allowed`, entries outside it score 0 and stay pruned whatever their
// score (gradual schedules: what was pruned stays pruned).
Selection select_by_score(const ScoreMatrix& score, const FormatSpec& spec, const Mask* allowed = nullptr);

// A pruned weight: its compressed form, the mask it keeps and the energy that mask keeps of the dense weight.
struct PruneResult {
  SparseMatrix compressed;
  Mask mask;
  double energy = 1.0;
};

// `values` (the weight to store: the original, or a solver's updated weight) compressed into `spec` as
// `selection` keeps it; the energy is measured on `original`.
PruneResult compress_selection(const DenseMatrix& original, const DenseMatrix& values, Selection selection,
                               const FormatSpec& spec);

// Prunes `weight` into `spec` keeping the entries with the largest `score`, and compresses it; `allowed` as in
// select_by_score (entries outside it inside a kept tile are stored as zeros).
PruneResult prune_by_score(const DenseMatrix& weight, const ScoreMatrix& score, const FormatSpec& spec,
                           const Mask* allowed = nullptr);

}  // namespace nmkit
