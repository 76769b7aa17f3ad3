#include "obs_groups.hpp"

#include <bit>
#include <string>

#include "nmkit/error.hpp"

namespace nmkit {
namespace {

// The `keep`-subset of `candidates` whose complement in the group has the smallest saliency; bit c of the result
// selects candidates[c].
uint32_t best_kept_set(const detail::GroupRow& row, const std::vector<int>& candidates, int keep, ObsCandidates mode) {
  const int width = row.group.width;
  double best = 1e301;
  uint32_t best_set = 0;
  for (uint32_t set = 0; set < (1u << candidates.size()); ++set) {
    if (std::popcount(set) != keep) continue;
    std::vector<int> pruned;
    for (int j = 0; j < width; ++j) {
      bool kept = false;
      for (std::size_t c = 0; c < candidates.size(); ++c) kept = kept || (((set >> c) & 1u) && candidates[c] == j);
      if (!kept) pruned.push_back(j);
    }
    const double rho = group_saliency(row.hinv, width, row.w, pruned, mode);
    if (rho < best) best = rho, best_set = set;
  }
  return best_set;
}

}  // namespace

void detail::keep_best_set(const GroupRow& row, const std::vector<int>& candidates, int keep, ObsCandidates mode,
                           Mask& mask) {
  const int k = std::min<int>(keep, static_cast<int>(candidates.size()));
  if (k == 0) return;
  const uint32_t set = best_kept_set(row, candidates, k, mode);
  for (int j = 0; j < row.group.width; ++j) mask.set(row.row, row.group.c0 + j, false);
  for (std::size_t c = 0; c < candidates.size(); ++c)
    if ((set >> c) & 1u) mask.set(row.row, row.group.c0 + candidates[c], true);
}

std::vector<int> detail::kept_columns(const Mask& mask, RowBlock block, ColumnGroup group) {
  std::vector<int> out;
  for (int j = 0; j < group.width; ++j) {
    bool any = false;
    for (int64_t r = block.begin; r < block.end && !any; ++r) any = mask.at(r, group.c0 + j);
    if (any) out.push_back(j);
  }
  return out;
}

ObsCandidates parse_obs_candidates(std::string_view name) {
  if (name == "diagonal") return ObsCandidates::diagonal;
  if (name == "pairwise" || name == "pair-wise") return ObsCandidates::pairwise;
  if (name == "combinatorial" || name == "m-combinatorial") return ObsCandidates::combinatorial;
  throw Error(ErrorCode::invalid_argument,
              "unknown OBS candidate set '" + std::string(name) + "' (expected diagonal, pairwise or combinatorial)");
}

const char* obs_candidates_name(ObsCandidates c) noexcept {
  return c == ObsCandidates::diagonal ? "diagonal" : c == ObsCandidates::pairwise ? "pairwise" : "combinatorial";
}

double group_saliency(const std::vector<double>& hinv_group, int width, const std::vector<double>& w_group,
                      const std::vector<int>& pruned, ObsCandidates mode) {
  const int n = static_cast<int>(pruned.size());
  auto sub = [&](const std::vector<int>& q) {
    std::vector<double> a(q.size() * q.size()), wq(q.size());
    for (std::size_t i = 0; i < q.size(); ++i) {
      wq[i] = w_group[q[i]];
      for (std::size_t j = 0; j < q.size(); ++j) a[i * q.size() + j] = hinv_group[q[i] * width + q[j]];
    }
    std::vector<double> x = wq;
    if (!detail::solve_spd(std::move(a), x)) return 1e300;  // numerically singular: never the best choice
    double quad = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) quad += wq[i] * x[i];
    return 0.5 * quad;
  };
  if (mode == ObsCandidates::combinatorial) {
    require(n <= detail::kMaxCombinatorialSet, ErrorCode::unsupported,
            "combinatorial OBS candidates need at most 16 pruned entries per group; use pairwise");
    return sub(pruned);
  }
  // Single and pair terms in closed form: rho_a = w_a^2 / (2 h_aa),
  // rho_ab = (w_a^2 h_bb - 2 w_a w_b h_ab + w_b^2 h_aa) / (2 (h_aa h_bb - h_ab^2)).
  auto h = [&](int a, int b) { return hinv_group[a * width + b]; };
  double rho = 0.0;
  for (int i = 0; i < n; ++i) {
    const int a = pruned[i];
    rho += 0.5 * w_group[a] * w_group[a] / h(a, a);
  }
  if (mode == ObsCandidates::diagonal) return rho;
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      const int a = pruned[i], b = pruned[j];
      const double det = h(a, a) * h(b, b) - h(a, b) * h(a, b);
      if (det <= 0.0) continue;  // numerically dependent pair: no correction
      const double pair = 0.5 *
                          (w_group[a] * w_group[a] * h(b, b) - 2.0 * w_group[a] * w_group[b] * h(a, b) +
                           w_group[b] * w_group[b] * h(a, a)) /
                          det;
      rho += pair - 0.5 * w_group[a] * w_group[a] / h(a, a) - 0.5 * w_group[b] * w_group[b] / h(b, b);
    }
  return rho;
}

}  // namespace nmkit
