#include "nmkit/prune/activation_aware.hpp"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <cmath>
#include <numeric>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/prune/energy.hpp"
#include "nmkit/util/overloaded.hpp"
#include "obs_groups.hpp"

namespace nmkit {
namespace {

void check_stats(const DenseMatrix& w, const LayerStatistics& s) {
  require(s.in_features == w.cols && s.xtx.size() == static_cast<std::size_t>(w.cols * w.cols) && s.tokens > 0,
          ErrorCode::invalid_argument,
          "calibration statistics are for " + std::to_string(s.in_features) + " input features over " +
              std::to_string(s.tokens) + " tokens, the weight has " + std::to_string(w.cols) + " columns");
  require_finite(w, "weight");
  for (std::size_t i = 0; i < s.xtx.size(); ++i)
    require(std::isfinite(s.xtx[i]), ErrorCode::invalid_argument, [&] {
      return "the calibration statistics (X^T X) are not finite at [" + std::to_string(i / s.in_features) + ", " +
             std::to_string(i % s.in_features) + "]: the layer's calibration inputs hold NaN or infinity";
    });
}

// U, the upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, row-major K x K (lower part zero).
// Columns no token ever touched (H_jj = 0) get H_jj = 1, as their weights never mattered.
std::vector<double> inverse_hessian_factor(const LayerStatistics& s, double damp) {
  const int64_t k = s.in_features;
  std::vector<double> h = s.xtx;
  double mean_diag = 0.0;
  for (int64_t j = 0; j < k; ++j) mean_diag += h[j * k + j];
  mean_diag = std::max(mean_diag / k, 1e-12);
  for (int64_t j = 0; j < k; ++j) {
    if (h[j * k + j] == 0.0) h[j * k + j] = 1.0;
    h[j * k + j] += damp * mean_diag;
  }
  const auto n = static_cast<lapack_int>(k);
  // H = L L^T, then H^-1 from the factor (upper triangle of the row-major result holds it).
  if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, h.data(), n) != 0 || LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'U', n, h.data(), n) != 0)
    throw Error(ErrorCode::invalid_argument, "the calibration Hessian is not positive definite; raise the damping (--damp, ObsOptions::damp)");
  if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, h.data(), n) != 0)
    throw Error(ErrorCode::invalid_argument, "the inverse Hessian is not positive definite; raise the damping (--damp, ObsOptions::damp)");
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j) h[i * k + j] = 0.0;
  return h;
}

constexpr int kMaxCombinatorialSet = 16;

// (H^-1)_GG for the group G = [c0, c0 + width) of the columns not yet decided: (U_GG)^T U_GG, as U is the upper
// Cholesky factor of H^-1 and the inverse Hessian of the trailing columns is U_FF^T U_FF.
std::vector<double> group_inverse_hessian(const std::vector<double>& u, int64_t cols, int64_t c0, int width) {
  std::vector<double> h(static_cast<std::size_t>(width * width), 0.0);
  for (int a = 0; a < width; ++a)
    for (int b = a; b < width; ++b) {
      double sum = 0.0;
      for (int k = 0; k <= a; ++k) sum += u[(c0 + k) * cols + c0 + a] * u[(c0 + k) * cols + c0 + b];
      h[a * width + b] = h[b * width + a] = sum;
    }
  return h;
}

constexpr int kMaxSetSearchWidth = 8;  // C(8, 4) = 70 column sets per V:N:M block

// The 4 columns of one V:N:M block (rows [r0, r1) of the group [c0, c0 + width)) that minimise the summed
// candidate saliency of what the rows prune, each row keeping its best N of the 4.
std::vector<int> best_block_columns(const std::vector<double>& w, int64_t cols, const std::vector<double>& hg, int64_t c0,
                                    int width, int64_t r0, int64_t r1, int keep, ObsCandidates mode, const Mask* allowed) {
  // rho of every kept N-subset of the group, per row.
  std::vector<uint32_t> kept_sets;
  for (uint32_t set = 0; set < (1u << width); ++set)
    if (std::popcount(set) == keep) kept_sets.push_back(set);
  std::vector<double> rho(static_cast<std::size_t>((r1 - r0)) * kept_sets.size());
  std::vector<double> w_group(static_cast<std::size_t>(width));
  for (int64_t r = r0; r < r1; ++r) {
    for (int j = 0; j < width; ++j) w_group[j] = w[r * cols + c0 + j];
    for (std::size_t k = 0; k < kept_sets.size(); ++k) {
      std::vector<int> pruned;
      bool possible = true;
      for (int j = 0; j < width; ++j) {
        const bool kept = (kept_sets[k] >> j) & 1u;
        if (kept && allowed && !allowed->at(r, c0 + j)) possible = false;
        if (!kept) pruned.push_back(j);
      }
      rho[(r - r0) * kept_sets.size() + k] = possible ? group_saliency(hg, width, w_group, pruned, mode) : 1e300;
    }
  }
  double best = 1e301;
  uint32_t best_columns = 0xF;
  for (uint32_t columns = 0; columns < (1u << width); ++columns) {
    if (std::popcount(columns) != kVnmSelectedColumns) continue;
    double cost = 0.0;
    for (int64_t r = r0; r < r1; ++r) {
      double row_best = 1e300;
      for (std::size_t k = 0; k < kept_sets.size(); ++k)
        if ((kept_sets[k] & ~columns) == 0) row_best = std::min(row_best, rho[(r - r0) * kept_sets.size() + k]);
      cost += row_best;
    }
    if (cost < best) best = cost, best_columns = columns;
  }
  std::vector<int> out;
  for (int j = 0; j < width; ++j)
    if ((best_columns >> j) & 1u) out.push_back(j);
  return out;
}

// Re-chooses which `keep` of the `candidates` columns each row keeps, by the saliency of the rest of the group.
void refine_rows(const std::vector<double>& w, int64_t rows, int64_t cols, const std::vector<double>& hg, int64_t c0,
                 int width, int keep, ObsCandidates mode, const Mask* allowed, const std::function<std::vector<int>(int64_t)>& candidates_of,
                 Mask& mask) {
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int> cand;
    for (int j : candidates_of(r))
      if (!allowed || allowed->at(r, c0 + j)) cand.push_back(j);
    const int k = std::min<int>(keep, static_cast<int>(cand.size()));
    if (k == 0) continue;
    std::vector<double> w_group(static_cast<std::size_t>(width));
    for (int j = 0; j < width; ++j) w_group[j] = w[r * cols + c0 + j];
    const uint32_t best_set = detail::best_kept_set(hg, width, w_group, cand, k, mode);
    for (int j = 0; j < width; ++j) mask.set(r, c0 + j, false);
    for (std::size_t c = 0; c < cand.size(); ++c)
      if ((best_set >> c) & 1u) mask.set(r, c0 + cand[c], true);
  }
}

// Chooses which entries of columns [c0, c0 + width) stay, from the saliency of the current weights.
void decide_group(const std::vector<double>& w, int64_t rows, int64_t cols, const std::vector<double>& u, int64_t c0,
                  int width, const FormatSpec& spec, const Mask* allowed, int block_columns, ObsCandidates mode, Mask& mask) {
  ScoreMatrix s{rows, width, std::vector<float>(static_cast<std::size_t>(rows * width))};
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < width; ++j) {
      const double d = u[(c0 + j) * cols + c0 + j];
      const bool may_keep = !allowed || allowed->at(r, c0 + j);
      s.values[r * width + j] = may_keep ? static_cast<float>(w[r * cols + c0 + j] * w[r * cols + c0 + j] / (d * d)) : 0.0f;
    }
  const Mask group = std::visit(overloaded{
                                    [&](const NmSpec& n) { return prune_nm_by_score(s, n.n, n.m); },
                                    [&](const VnmSpec& v) {
                                      return block_columns > 0 ? prune_block_columns_by_score(s, v.v, v.m, block_columns)
                                                               : prune_vnm_by_score(s, v.v, v.n, v.m);
                                    },
                                    [&](const TileSpec&) { return Mask{}; },
                                },
                                spec);
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < width; ++j) mask.set(r, c0 + j, group.at(r, j) && (!allowed || allowed->at(r, c0 + j)));
  if (mode == ObsCandidates::diagonal || block_columns > 0 || std::holds_alternative<TileSpec>(spec)) return;

  const std::vector<double> hg = group_inverse_hessian(u, cols, c0, width);
  if (const auto* nm = std::get_if<NmSpec>(&spec)) {
    std::vector<int> all(static_cast<std::size_t>(width));
    std::iota(all.begin(), all.end(), 0);
    refine_rows(w, rows, cols, hg, c0, width, nm->n, mode, allowed, [&](int64_t) { return all; }, mask);
  } else {
    // V:N:M: the block's 4 columns, then each row's N of them. Small groups choose the columns by the candidate
    // saliency too (every 4-subset, each row's best N inside it); larger ones keep the diagonal choice.
    const VnmSpec& v = std::get<VnmSpec>(spec);
    const int64_t row_blocks = ceil_div(rows, v.v);
    std::vector<std::vector<int>> block_columns_of(static_cast<std::size_t>(row_blocks));
    if (width <= kMaxSetSearchWidth && width > kVnmSelectedColumns) {
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t rb = 0; rb < row_blocks; ++rb)
        block_columns_of[rb] = best_block_columns(w, cols, hg, c0, width, rb * v.v, std::min<int64_t>(rows, (rb + 1) * v.v),
                                                  v.n, mode, allowed);
    } else {
      for (int64_t rb = 0; rb < row_blocks; ++rb)
        for (int j = 0; j < width; ++j) {
          bool any = false;
          for (int64_t r = rb * v.v; r < std::min<int64_t>(rows, (rb + 1) * v.v) && !any; ++r) any = mask.at(r, c0 + j);
          if (any) block_columns_of[rb].push_back(j);
        }
    }
    refine_rows(w, rows, cols, hg, c0, width, v.n, mode, allowed, [&](int64_t r) { return block_columns_of[r / v.v]; }, mask);
  }
}


}  // namespace

uint32_t detail::best_kept_set(const std::vector<double>& hinv_group, int width, const std::vector<double>& w_group,
                               const std::vector<int>& candidates, int keep, ObsCandidates mode) {
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
    const double rho = group_saliency(hinv_group, width, w_group, pruned, mode);
    if (rho < best) best = rho, best_set = set;
  }
  return best_set;
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
    require(n <= kMaxCombinatorialSet, ErrorCode::unsupported,
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
      const double pair = 0.5 * (w_group[a] * w_group[a] * h(b, b) - 2.0 * w_group[a] * w_group[b] * h(a, b) +
                                 w_group[b] * w_group[b] * h(a, a)) / det;
      rho += pair - 0.5 * w_group[a] * w_group[a] / h(a, a) - 0.5 * w_group[b] * w_group[b] / h(b, b);
    }
  return rho;
}

PruneMethod parse_prune_method(std::string_view name) {
  if (name == "magnitude") return PruneMethod::magnitude;
  if (name == "wanda") return PruneMethod::wanda;
  if (name == "obs") return PruneMethod::obs;
  throw Error(ErrorCode::invalid_argument, "unknown pruning method '" + std::string(name) + "' (expected magnitude, wanda or obs)");
}

const char* prune_method_name(PruneMethod m) noexcept {
  return m == PruneMethod::magnitude ? "magnitude" : m == PruneMethod::wanda ? "wanda" : "obs";
}

ScoreMatrix wanda_scores(const DenseMatrix& weight, const LayerStatistics& stats) {
  check_stats(weight, stats);
  const std::vector<double> norms = stats.column_norms();
  ScoreMatrix s = ScoreMatrix::magnitude(weight);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) s.values[r * s.cols + c] *= static_cast<float>(norms[c]);
  return s;
}

PruneResult prune_wanda(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec, const Mask* allowed) {
  return prune_by_score(weight, wanda_scores(weight, stats), spec, allowed);
}

PruneResult prune_obs(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec, const ObsOptions& options) {
  require(options.block_columns == 0, ErrorCode::invalid_argument, "prune_obs: block_columns steps are for obs_sweep");
  const ObsSweep sweep = obs_sweep(weight, stats, spec, options);
  const double e = energy(weight, sweep.mask);
  return std::visit(overloaded{
                        [&](const NmSpec& s) { return PruneResult{compress_nm(sweep.weight, sweep.mask, s.n, s.m), sweep.mask, e}; },
                        [&](const VnmSpec& s) {
                          return PruneResult{compress_vnm(sweep.weight, sweep.mask, s.v, s.n, s.m), sweep.mask, e};
                        },
                        [&](const TileSpec& s) {
                          return PruneResult{compress_tiles(sweep.weight, sweep.tiles, s.tile_rows, s.tile_cols), sweep.mask, e};
                        },
                    },
                    spec);
}

ObsSweep obs_sweep(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec, const ObsOptions& options) {
  check_stats(weight, stats);
  require(options.damp > 0.0 && options.block_cols >= 1, ErrorCode::invalid_argument, "OBS needs damp > 0 and block_cols >= 1");
  require(!options.allowed || (options.allowed->rows == weight.rows && options.allowed->cols == weight.cols),
          ErrorCode::invalid_argument, "OBS: the allowed mask's shape differs from the weight's");
  if (options.candidates != ObsCandidates::diagonal) {  // checked here: the row loops run in parallel
    const auto* nm = std::get_if<NmSpec>(&spec);
    const auto* vnm = std::get_if<VnmSpec>(&spec);
    require(!nm || nm->m <= kMaxCombinatorialSet, ErrorCode::unsupported,
            std::string(obs_candidates_name(options.candidates)) + " OBS candidates enumerate the kept sets of N:M groups up to M = 16");
    const int pruned = nm ? nm->m - nm->n : vnm ? vnm->m - vnm->n : 0;
    require(options.candidates != ObsCandidates::combinatorial || pruned <= kMaxCombinatorialSet, ErrorCode::unsupported,
            "combinatorial OBS candidates need at most 16 pruned entries per group; use pairwise");
  }
  const int64_t rows = weight.rows, cols = weight.cols;
  const std::vector<double> u = inverse_hessian_factor(stats, options.damp);
  std::vector<double> w(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = weight.values.get(i);

  Mask mask = Mask::none(rows, cols);
  TileMask kept_tiles;
  const bool tiles = std::holds_alternative<TileSpec>(spec);
  if (tiles) {  // whole tiles are chosen up front by their summed saliency (|w| / U_jj, squared per tile)
    const TileSpec& t = std::get<TileSpec>(spec);
    ScoreMatrix s{rows, cols, std::vector<float>(static_cast<std::size_t>(rows * cols))};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) s.values[r * cols + c] = static_cast<float>(std::fabs(w[r * cols + c]) / u[c * cols + c]);
    kept_tiles = prune_tiles_by_score(options.allowed ? restrict_scores(std::move(s), *options.allowed) : s, t.tile_rows,
                                      t.tile_cols, t.density);
    mask = expand(kept_tiles, rows, cols, t.tile_rows, t.tile_cols);
    if (options.allowed)
      for (std::size_t i = 0; i < mask.keep.size(); ++i) mask.keep[i] &= options.allowed->keep[i];
  }
  const int group = group_width(spec);
  const int64_t block = std::max<int64_t>(group, options.block_cols / group * group);

  std::vector<double> err(static_cast<std::size_t>(rows * block));
  for (int64_t b0 = 0; b0 < cols; b0 += block) {
    const int64_t b1 = std::min(cols, b0 + block), width = b1 - b0;
    for (int64_t i = b0; i < b1; ++i) {
      if (!tiles && (i - b0) % group == 0) decide_group(w, rows, cols, u, i, static_cast<int>(std::min<int64_t>(group, cols - i)), spec, options.allowed, options.block_columns, options.candidates, mask);
      const double d = u[i * cols + i];
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        double& wi = w[r * cols + i];
        const double e = mask.at(r, i) ? 0.0 : wi / d;
        if (!mask.at(r, i)) wi = 0.0;
        err[r * block + (i - b0)] = e;
        for (int64_t j = i + 1; j < b1; ++j) w[r * cols + j] -= e * u[i * cols + j];
      }
    }
    if (b1 < cols)  // W[:, b1:] -= Err (rows x width) * U[b0:b1, b1:]
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(cols - b1),
                  static_cast<int>(width), -1.0, err.data(), static_cast<int>(block), u.data() + b0 * cols + b1,
                  static_cast<int>(cols), 1.0, w.data() + b1, static_cast<int>(cols));
  }

  DenseMatrix updated = DenseMatrix::zeros(rows, cols, weight.dtype());
  for (std::size_t i = 0; i < w.size(); ++i) updated.values.set(i, static_cast<float>(w[i]));
  return ObsSweep{std::move(updated), std::move(mask), std::move(kept_tiles)};
}

}  // namespace nmkit
