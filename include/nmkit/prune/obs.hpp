#pragma once
// Layer-wise OBS (SparseGPT-style), a solver: it decides groups of columns left to right from the calibration
// Hessian H = X^T X, compensating each pruned weight's error in the columns not yet decided, and chooses each
// group's pattern with selection by score over its saliency.
//
// The saliency of a single weight is w^2 / [U]_jj^2 (U the upper Cholesky factor of (H + damp I)^-1); the error
// propagates with lazy block updates. N:M keeps each row's best N per group; V:N:M chooses each V x M block's 4
// columns by the saliency summed over its rows; tiles are chosen up front by their summed saliency.
#include "nmkit/format/spec.hpp"
#include "nmkit/model/calibration.hpp"
#include "nmkit/prune/select.hpp"

namespace nmkit {

// How OBS scores a row's choice of kept entries inside a group (seed 000 §6.1). The saliency of pruning the
// set Q of a group G is rho_Q = 1/2 w_Q^T [(H^-1)_QQ]^-1 w_Q, with (H^-1) the inverse Hessian of the columns
// not yet decided:
//  * diagonal: rank single weights by w^2 / [U]_jj^2 (SparseGPT; ignores correlations inside the group);
//  * pairwise: rho_Q from its single and pair terms (E_Q = [[1,0],[0,1],[1,1]]): exact when |Q| <= 2;
//  * combinatorial: rho_Q exactly, over every candidate set (|Q| <= 16).
// For V:N:M the 4 columns of a block are chosen by the diagonal saliency summed over its rows; the candidate
// sets then decide which N of those 4 each row keeps.
enum class ObsCandidates : uint8_t { diagonal, pairwise, combinatorial };
ObsCandidates parse_obs_candidates(std::string_view name);
const char* obs_candidates_name(ObsCandidates c) noexcept;

// The saliency rho_Q of pruning the entries q[0..count) of one row of a group, given (H^-1)_GG (width x width,
// row-major) and the row's weights w_G. Exposed for tests.
double group_saliency(const std::vector<double>& hinv_group, int width, const std::vector<double>& w_group,
                      const std::vector<int>& pruned, ObsCandidates mode);

struct ObsOptions {
  ObsCandidates candidates = ObsCandidates::diagonal;
  double damp = 0.01;             // added to H's diagonal, as a fraction of its mean
  int block_cols = 128;           // columns per lazy update (rounded to whole groups / tiles)
  const Mask* allowed = nullptr;  // entries outside it are pruned whatever their saliency (gradual schedules)
  int block_columns = 0;          // > 0 with a V:N:M spec: keep this many whole columns per V x M block instead
};

// The OBS sweep alone: the updated weight (pruned entries zero) and its mask, for any spec (or a
// block-columns step). prune_obs compresses its result.
struct ObsSweep {
  DenseMatrix weight;
  Mask mask;
  TileMask tiles;  // the kept tiles of a tile spec
};
ObsSweep obs_sweep(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                   const ObsOptions& options = {});

// The weight after pruning and updating, its mask and compressed form; energy is measured on the original
// weight. Throws Error when the statistics do not match the weight's columns.
PruneResult prune_obs(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                      const ObsOptions& options = {});

}  // namespace nmkit
