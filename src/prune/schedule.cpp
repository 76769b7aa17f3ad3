#include "nmkit/prune/schedule.hpp"

#include <cmath>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/prune/energy.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/wanda.hpp"
#include "nmkit/util/overloaded.hpp"

namespace nmkit {
namespace {

// `steps` integers falling linearly from `from` to `to` (inclusive), without repeats.
std::vector<int> falling(int from, int to, int steps) {
  std::vector<int> out;
  for (int s = 0; s < steps; ++s) {
    const int v =
        steps == 1 ? to : static_cast<int>(std::lround(from + (to - from) * static_cast<double>(s) / (steps - 1)));
    if (out.empty() || v < out.back()) out.push_back(v);
  }
  return out;
}

}  // namespace

std::string to_string(const ScheduleStep& step) {
  if (step.block_columns == 0) return to_string(step.spec);
  const VnmSpec& v = std::get<VnmSpec>(step.spec);
  return "vnm:" + std::to_string(v.v) + ":*:" + std::to_string(v.m) + "/" + std::to_string(step.block_columns) + "cols";
}

std::vector<ScheduleStep> structure_decay_schedule(const FormatSpec& target, int steps, int n0) {
  require(steps >= 1, ErrorCode::invalid_argument, "a schedule needs at least one step");
  return std::visit(
      overloaded{
          [&](const NmSpec& t) {
            const int start = n0 > 0 ? n0 : t.m - 1;
            require(start >= t.n && start < t.m, ErrorCode::invalid_argument,
                    "schedule: N0 must lie in [N, M), got " + std::to_string(start));
            std::vector<ScheduleStep> out;
            for (int n : falling(start, t.n, steps)) out.push_back({NmSpec{n, t.m}});
            return out;
          },
          [&](const VnmSpec& t) {
            std::vector<ScheduleStep> out;
            if (steps > 1) {
              // Only a gradual schedule has column steps, and they need M > 4 columns to fall from.
              constexpr int kFinalColumns = 4;  // what V:N:M keeps per block
              const int start = n0 > 0 ? n0 : t.m - 1;
              require(start >= kFinalColumns && start < t.m, ErrorCode::invalid_argument,
                      "schedule: the first column count must lie in [4, M), got " + std::to_string(start) +
                          (t.m <= kFinalColumns ? " (a V:N:4 format keeps all 4 columns: prune it in one step)" : ""));
              for (int c : falling(start, kFinalColumns, steps - 1)) out.push_back({t, c});
            }
            out.push_back({t});
            return out;
          },
          [&](const TileSpec& t) {
            std::vector<ScheduleStep> out;
            for (int s = 1; s <= steps; ++s)
              out.push_back({TileSpec{t.tile_rows, t.tile_cols, 1.0 - (1.0 - t.density) * s / steps}});
            return out;
          },
      },
      target);
}

GradualResult prune_gradual(const DenseMatrix& weight, const std::vector<ScheduleStep>& schedule, PruneMethod method,
                            const LayerStatistics* stats, const ObsOptions& obs) {
  require(!schedule.empty(), ErrorCode::invalid_argument, "prune_gradual needs at least one step");
  require(method == PruneMethod::magnitude || stats != nullptr, ErrorCode::invalid_argument,
          std::string("pruning method ") + prune_method_name(method) + " needs calibration statistics");
  GradualResult out;
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const ScheduleStep& step = schedule[i];
    const Mask* allowed = out.masks.empty() ? nullptr : &out.masks.back();
    if (step.block_columns > 0) {
      // An intermediate column step: only its mask carries over.
      const VnmSpec& v = std::get<VnmSpec>(step.spec);
      Mask mask;
      if (method == PruneMethod::obs) {
        ObsOptions options = obs;
        options.allowed = allowed, options.block_columns = step.block_columns;
        mask = obs_sweep(weight, *stats, step.spec, options).mask;
      } else {
        const ScoreMatrix score =
            method == PruneMethod::wanda ? wanda_scores(weight, *stats) : magnitude_scores(weight);
        mask = select_block_columns(score, v.v, v.m, step.block_columns, allowed);
      }
      out.masks.push_back(std::move(mask));
      continue;
    }
    // A format step. Every step starts from the dense weight: only the mask carries over, so that OBS
    // reconstructs the original layer's outputs and the steps' compensation errors do not add up.
    PruneResult result;
    switch (method) {
      case PruneMethod::magnitude:
        result = prune_by_score(weight, magnitude_scores(weight), step.spec, allowed);
        break;
      case PruneMethod::wanda:
        result = prune_wanda(weight, *stats, step.spec, allowed);
        break;
      case PruneMethod::obs: {
        ObsOptions options = obs;
        options.allowed = allowed;
        result = prune_obs(weight, *stats, step.spec, options);
        break;
      }
    }
    out.masks.push_back(result.mask);
    out.final = std::move(result);
  }
  require(schedule.back().block_columns == 0, ErrorCode::invalid_argument, "a schedule must end with a format");
  out.final.energy = energy(weight, out.final.mask);
  return out;
}

}  // namespace nmkit
