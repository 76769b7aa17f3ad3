#include "nmkit/prune/schedule.hpp"

#include <cmath>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/prune/energy.hpp"
#include "nmkit/util/overloaded.hpp"

namespace nmkit {
namespace {

// `steps` integers falling linearly from `from` to `to` (inclusive), without repeats.
std::vector<int> falling(int from, int to, int steps) {
  std::vector<int> out;
  for (int s = 0; s < steps; ++s) {
    const int v = steps == 1 ? to : static_cast<int>(std::lround(from + (to - from) * static_cast<double>(s) / (steps - 1)));
    if (out.empty() || v < out.back()) out.push_back(v);
  }
  return out;
}

}  // namespace

std::vector<FormatSpec> structure_decay_schedule(const FormatSpec& target, int steps, int n0) {
  require(steps >= 1, ErrorCode::invalid_argument, "a schedule needs at least one step");
  return std::visit(
      overloaded{
          [&](const NmSpec& t) {
            const int start = n0 > 0 ? n0 : t.m - 1;
            require(start >= t.n && start < t.m, ErrorCode::invalid_argument,
                    "schedule: N0 must lie in [N, M), got " + std::to_string(start));
            std::vector<FormatSpec> out;
            for (int n : falling(start, t.n, steps)) out.push_back(NmSpec{n, t.m});
            return out;
          },
          [&](const VnmSpec& t) {
            constexpr int kLastRowWiseN = 4;  // the V:N:M step keeps at most 4 columns per block
            const int start = n0 > 0 ? n0 : t.m - 1;
            require(start >= t.n && start < t.m, ErrorCode::invalid_argument,
                    "schedule: N0 must lie in [N, M), got " + std::to_string(start));
            std::vector<FormatSpec> out;
            if (steps > 1 && start >= kLastRowWiseN)
              for (int n : falling(start, std::min(start, kLastRowWiseN), steps - 1)) out.push_back(NmSpec{n, t.m});
            out.push_back(t);
            return out;
          },
          [&](const TileSpec& t) {
            std::vector<FormatSpec> out;
            for (int s = 1; s <= steps; ++s) {
              const double density = 1.0 - (1.0 - t.density) * s / steps;
              out.push_back(TileSpec{t.tile_rows, t.tile_cols, density});
            }
            return out;
          },
      },
      target);
}

GradualResult prune_gradual(const DenseMatrix& weight, const std::vector<FormatSpec>& schedule, PruneMethod method,
                            const LayerStatistics* stats, const ObsOptions& obs) {
  require(!schedule.empty(), ErrorCode::invalid_argument, "prune_gradual needs at least one step");
  require(method == PruneMethod::magnitude || stats != nullptr, ErrorCode::invalid_argument,
          std::string("pruning method ") + prune_method_name(method) + " needs calibration statistics");
  GradualResult out;
  DenseMatrix current = weight;
  for (const FormatSpec& spec : schedule) {
    const Mask* allowed = out.masks.empty() ? nullptr : &out.masks.back();
    PruneResult step;
    switch (method) {
      case PruneMethod::magnitude: step = prune_by_score(current, ScoreMatrix::magnitude(current), spec, allowed); break;
      case PruneMethod::wanda: step = prune_wanda(current, *stats, spec, allowed); break;
      case PruneMethod::obs: {
        // Every step reconstructs the original layer's outputs: the sweep starts from the dense weight and only
        // the mask carries over, so the compensation errors of the steps do not add up.
        ObsOptions options = obs;
        options.allowed = allowed;
        step = prune_obs(weight, *stats, spec, options);
        break;
      }
    }
    current = decompress(step.compressed);
    out.masks.push_back(step.mask);
    out.final = std::move(step);
  }
  out.final.energy = energy(weight, out.final.mask);
  return out;
}

}  // namespace nmkit
