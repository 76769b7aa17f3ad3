#pragma once
// Pruners that look at the layer's inputs (calibration statistics H = X^T X):
//  * Wanda: score |w_ij| * ||X_j||_2, no weight update.
//  * OBS (layer-wise optimal brain surgeon, SparseGPT-style): columns are decided left to right with the
//    saliency w^2 / [U]_jj^2 (U the upper Cholesky factor of (H + damp I)^-1) and each pruned weight's error is
//    propagated into the columns not yet decided; lazy block updates. Works for N:M, V:N:M (the 4 columns of
//    each V x M block chosen by the saliency summed over its rows) and tiles (tiles chosen by summed saliency).
#include "nmkit/format/spec.hpp"
#include "nmkit/model/calibration.hpp"
#include "nmkit/prune/magnitude.hpp"

namespace nmkit {

enum class PruneMethod : uint8_t { magnitude, wanda, obs };
PruneMethod parse_prune_method(std::string_view name);  // "magnitude" | "wanda" | "obs"
const char* prune_method_name(PruneMethod m) noexcept;

struct ObsOptions {
  double damp = 0.01;    // added to H's diagonal, as a fraction of its mean
  int block_cols = 128;  // columns per lazy update (rounded to whole groups / tiles)
  const Mask* allowed = nullptr;  // entries outside it are pruned whatever their saliency (gradual schedules)
  int block_columns = 0;  // > 0 with a V:N:M spec: keep this many whole columns per V x M block instead
};

// The OBS sweep alone: the updated weight (pruned entries zero) and its mask, for any spec (or a
// block-columns step). prune_obs compresses its result.
struct ObsSweep {
  DenseMatrix weight;
  Mask mask;
  TileMask tiles;  // the kept tiles of a tile spec
};
ObsSweep obs_sweep(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec, const ObsOptions& options = {});

ScoreMatrix wanda_scores(const DenseMatrix& weight, const LayerStatistics& stats);

// The weight after pruning (updated by OBS), its mask and compressed form; energy is measured on the
// original weight. Throws Error when the statistics do not match the weight's columns.
PruneResult prune_wanda(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                        const Mask* allowed = nullptr);
PruneResult prune_obs(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                      const ObsOptions& options = {});

}  // namespace nmkit
