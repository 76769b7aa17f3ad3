#pragma once
// The gradual structure-decay schedule of seed 000 §6.1.1, over any method: prune in steps of increasing
// sparsity, from N0 down to the target N, each step only ever removing more (what was pruned stays pruned).
#include <string>
#include <vector>

#include "nmkit/model/calibration.hpp"
#include "nmkit/prune/method.hpp"
#include "nmkit/prune/obs.hpp"
#include "nmkit/prune/select.hpp"

namespace nmkit {

// One step: a format, or (block_columns > 0, spec a V:N:M) "keep this many whole columns per V x M block".
struct ScheduleStep {
  FormatSpec spec;
  int block_columns = 0;
};
std::string to_string(const ScheduleStep& step);  // "6:8", "vnm:64:*:8/6cols", "vnm:64:2:8", ...

// The steps towards `target`, the last one being `target` itself:
//  * N:M n:m      -> N:M with N falling linearly from m - 1 (or `n0`) to n;
//  * V:N:M v:n:m  -> the columns kept per V x M block falling from m - 1 (or `n0`) to 4, then v:n:m
//                    (every row of a block keeps the same columns, as V:N:M will require);
//  * tile         -> the same tiles with the density falling linearly from 1 to the target.
// `steps` counts them all (at least 1; fewer come out when the range has fewer distinct values).
std::vector<ScheduleStep> structure_decay_schedule(const FormatSpec& target, int steps, int n0 = 0);

struct GradualResult {
  PruneResult final;        // energy measured on the original weight
  std::vector<Mask> masks;  // one per step, each a subset of the one before
};

// Applies the schedule; `stats` is needed by wanda and obs. OBS carries its weight updates from step to step.
GradualResult prune_gradual(const DenseMatrix& weight, const std::vector<ScheduleStep>& schedule, PruneMethod method,
                            const LayerStatistics* stats = nullptr, const ObsOptions& obs = {});

}  // namespace nmkit
