#pragma once
// Wanda, a scorer: an entry's score is |w_ij| * ||X_j||_2 (its input column's norm over the calibration tokens),
// selection by score decides what each format keeps, and no weight is updated.
#include "nmkit/model/calibration.hpp"
#include "nmkit/prune/select.hpp"

namespace nmkit {

// Throws Error when the statistics do not match the weight's columns.
ScoreMatrix wanda_scores(const DenseMatrix& weight, const LayerStatistics& stats);

// The weight pruned by its Wanda scores and compressed; `allowed` as in select_by_score.
PruneResult prune_wanda(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                        const Mask* allowed = nullptr);

}  // namespace nmkit
