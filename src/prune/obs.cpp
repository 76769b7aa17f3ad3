#include "nmkit/prune/obs.hpp"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>

#include "nmkit/error.hpp"
#include "obs_groups.hpp"
#include "statistics.hpp"

namespace nmkit {
namespace {

using detail::ColumnGroup;
using detail::GroupRow;
using detail::RowBlock;

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
  // U comes from one Cholesky factor and one triangular inverse (2/3 K^3 flops, not potrf + potri + potrf's 4/3 K^3).
  // With J the reversal, J H J = L L^T gives H^-1 = (J L^-1 J)^T (J L^-1 J), and J L^-1 J is upper triangular with
  // a positive diagonal: the unique U. Reversing the row-major array is J H J; read as column-major, the upper
  // factor R = L^T and its inverse land in the row-major lower triangle as L and L^-1.
  std::reverse(h.begin(), h.end());
  const auto n = static_cast<lapack_int>(k);
  if (LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'U', n, h.data(), n) != 0 ||
      LAPACKE_dtrtri(LAPACK_COL_MAJOR, 'U', 'N', n, h.data(), n) != 0)
    throw Error(ErrorCode::invalid_argument,
                "the calibration Hessian is not positive definite; raise the damping (--damp, ObsOptions::damp)");
  std::reverse(h.begin(), h.end());
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j) h[i * k + j] = 0.0;
  return h;
}

// The sweep's working state: the weight being updated (rows x cols, row-major, in double) and U, the upper
// Cholesky factor of the damped inverse Hessian (cols x cols). The columns left of the current one are final.
struct SweepState {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> w;
  std::vector<double> u;

  double& weight(int64_t r, int64_t c) { return w[r * cols + c]; }
  double weight(int64_t r, int64_t c) const { return w[r * cols + c]; }
  double factor(int64_t i, int64_t j) const { return u[i * cols + j]; }
};

// The columns [begin, end) of one lazy update: a pruned weight's error reaches the columns inside it at once and
// those right of it in one product, from `err` (rows x capacity, the error of column c at c - begin).
struct LazyBlock {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t capacity = 0;
  std::vector<double> err;
};

// (H^-1)_GG for the group G of the columns not yet decided: (U_GG)^T U_GG, as U is the upper Cholesky factor of
// H^-1 and the inverse Hessian of the trailing columns is U_FF^T U_FF.
std::vector<double> group_inverse_hessian(const SweepState& sweep, ColumnGroup group) {
  const int width = group.width;
  const int64_t c0 = group.c0;
  std::vector<double> h(static_cast<std::size_t>(width * width), 0.0);
  for (int a = 0; a < width; ++a)
    for (int b = a; b < width; ++b) {
      double sum = 0.0;
      for (int k = 0; k <= a; ++k) sum += sweep.factor(c0 + k, c0 + a) * sweep.factor(c0 + k, c0 + b);
      h[a * width + b] = h[b * width + a] = sum;
    }
  return h;
}

// The diagonal saliency w^2 / U_jj^2 of the group's entries (rows x width); 0 for an entry `allowed` excludes.
ScoreMatrix diagonal_saliency(const SweepState& sweep, ColumnGroup group, const Mask* allowed) {
  ScoreMatrix s{sweep.rows, group.width, std::vector<float>(static_cast<std::size_t>(sweep.rows * group.width))};
  for (int64_t r = 0; r < sweep.rows; ++r)
    for (int j = 0; j < group.width; ++j) {
      const int64_t c = group.c0 + j;
      const double d = sweep.factor(c, c);
      const bool may_keep = !allowed || allowed->at(r, c);
      s.values[r * group.width + j] =
          may_keep ? static_cast<float>(sweep.weight(r, c) * sweep.weight(r, c) / (d * d)) : 0.0f;
    }
  return s;
}

// The saliency that chooses whole tiles up front: |w| / U_jj per entry, squared and summed per tile.
ScoreMatrix tile_saliency(const SweepState& sweep) {
  ScoreMatrix s{sweep.rows, sweep.cols, std::vector<float>(static_cast<std::size_t>(sweep.rows * sweep.cols))};
  for (int64_t r = 0; r < sweep.rows; ++r)
    for (int64_t c = 0; c < sweep.cols; ++c)
      s.values[r * sweep.cols + c] = static_cast<float>(std::fabs(sweep.weight(r, c)) / sweep.factor(c, c));
  return s;
}

constexpr int kMaxSetSearchWidth = 8;  // C(8, 4) = 70 column sets per V:N:M block

// One group's candidate sets in the sweep: (H^-1)_GG of the columns not yet decided and the sweep's current
// weights, scored and restricted as the options say.
struct GroupSets {
  const SweepState& sweep;
  ColumnGroup group;
  std::vector<double> hinv;
  const ObsOptions& options;

  bool may_keep(int64_t r, int j) const { return !options.allowed || options.allowed->at(r, group.c0 + j); }
  GroupRow row(int64_t r) const {
    std::vector<double> w(static_cast<std::size_t>(group.width));
    for (int j = 0; j < group.width; ++j) w[j] = sweep.weight(r, group.c0 + j);
    return GroupRow{r, group, hinv, std::move(w)};
  }
};

// The 4 columns of one V:N:M block that minimise the summed candidate saliency of what its rows prune, each row
// keeping its best `keep` of the 4.
std::vector<int> best_block_columns(const GroupSets& sets, RowBlock block, int keep) {
  const int width = sets.group.width;
  // rho of every kept N-subset of the group, per row.
  std::vector<uint32_t> kept_sets;
  for (uint32_t set = 0; set < (1u << width); ++set)
    if (std::popcount(set) == keep) kept_sets.push_back(set);
  std::vector<double> rho(static_cast<std::size_t>((block.end - block.begin)) * kept_sets.size());
  for (int64_t r = block.begin; r < block.end; ++r) {
    const GroupRow row = sets.row(r);
    for (std::size_t k = 0; k < kept_sets.size(); ++k) {
      std::vector<int> pruned;
      bool possible = true;
      for (int j = 0; j < width; ++j) {
        const bool kept = (kept_sets[k] >> j) & 1u;
        if (kept && !sets.may_keep(r, j)) possible = false;
        if (!kept) pruned.push_back(j);
      }
      rho[(r - block.begin) * kept_sets.size() + k] =
          possible ? group_saliency(row.hinv, width, row.w, pruned, sets.options.candidates) : 1e300;
    }
  }
  double best = 1e301;
  uint32_t best_columns = 0xF;
  for (uint32_t columns = 0; columns < (1u << width); ++columns) {
    if (std::popcount(columns) != kVnmSelectedColumns) continue;
    double cost = 0.0;
    for (int64_t r = block.begin; r < block.end; ++r) {
      double row_best = 1e300;
      for (std::size_t k = 0; k < kept_sets.size(); ++k)
        if ((kept_sets[k] & ~columns) == 0)
          row_best = std::min(row_best, rho[(r - block.begin) * kept_sets.size() + k]);
      cost += row_best;
    }
    if (cost < best) best = cost, best_columns = columns;
  }
  std::vector<int> out;
  for (int j = 0; j < width; ++j)
    if ((best_columns >> j) & 1u) out.push_back(j);
  return out;
}

// Re-chooses which `keep` of its candidate columns each row keeps, by the saliency of the rest of the group.
void refine_rows(const GroupSets& sets, int keep, const std::function<std::vector<int>(int64_t)>& candidates_of,
                 Mask& mask) {
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t r = 0; r < sets.sweep.rows; ++r) {
    std::vector<int> candidates;
    for (int j : candidates_of(r))
      if (sets.may_keep(r, j)) candidates.push_back(j);
    detail::keep_best_set(sets.row(r), candidates, keep, sets.options.candidates, mask);
  }
}

// Chooses which entries of an N:M or V:N:M group stay, from the saliency of the current weights: the selection
// by the diagonal saliency, then (with pairwise or combinatorial candidates) each row's best set inside it.
void decide_group(const SweepState& sweep, ColumnGroup group, const FormatSpec& spec, const ObsOptions& options,
                  Mask& mask) {
  const ScoreMatrix saliency = diagonal_saliency(sweep, group, options.allowed);
  const auto* vnm = std::get_if<VnmSpec>(&spec);
  const Mask chosen = vnm && options.block_columns > 0
                          ? select_block_columns(saliency, vnm->v, vnm->m, options.block_columns)
                          : select_by_score(saliency, spec).mask;
  for (int64_t r = 0; r < sweep.rows; ++r)
    for (int j = 0; j < group.width; ++j)
      mask.set(r, group.c0 + j, chosen.at(r, j) && (!options.allowed || options.allowed->at(r, group.c0 + j)));
  if (options.candidates == ObsCandidates::diagonal || options.block_columns > 0) return;

  const GroupSets sets{sweep, group, group_inverse_hessian(sweep, group), options};
  if (const auto* nm = std::get_if<NmSpec>(&spec)) {
    std::vector<int> all(static_cast<std::size_t>(group.width));
    std::iota(all.begin(), all.end(), 0);
    refine_rows(
        sets, nm->n, [&](int64_t) { return all; }, mask);
    return;
  }
  // V:N:M: the block's 4 columns, then each row's N of them. Small groups choose the columns by the candidate
  // saliency too (every 4-subset, each row's best N inside it); larger ones keep the diagonal choice.
  const int64_t row_blocks = ceil_div(sweep.rows, vnm->v);
  std::vector<std::vector<int>> columns_of(static_cast<std::size_t>(row_blocks));
  if (group.width <= kMaxSetSearchWidth && group.width > kVnmSelectedColumns) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t rb = 0; rb < row_blocks; ++rb)
      columns_of[rb] = best_block_columns(sets, RowBlock::of(rb * vnm->v, vnm->v, sweep.rows), vnm->n);
  } else {
    for (int64_t rb = 0; rb < row_blocks; ++rb)
      columns_of[rb] = detail::kept_columns(mask, RowBlock::of(rb * vnm->v, vnm->v, sweep.rows), group);
  }
  refine_rows(
      sets, vnm->n, [&](int64_t r) { return columns_of[r / vnm->v]; }, mask);
}

// Column i is final: its pruned weights become zero, and each one's error w / U_ii is compensated in the columns
// right of it inside the block and kept in `block.err` for those beyond.
void settle_column(SweepState& sweep, const Mask& mask, int64_t i, LazyBlock& block) {
  const double d = sweep.factor(i, i);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < sweep.rows; ++r) {
    double& wi = sweep.weight(r, i);
    const double e = mask.at(r, i) ? 0.0 : wi / d;
    if (!mask.at(r, i)) wi = 0.0;
    block.err[r * block.capacity + (i - block.begin)] = e;
    for (int64_t j = i + 1; j < block.end; ++j) sweep.weight(r, j) -= e * sweep.factor(i, j);
  }
}

// The block's errors reach the columns right of it: W[:, end:] -= Err (rows x width) * U[begin:end, end:].
void propagate_block(SweepState& sweep, const LazyBlock& block) {
  if (block.end >= sweep.cols) return;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(sweep.rows),
              static_cast<int>(sweep.cols - block.end), static_cast<int>(block.end - block.begin), -1.0,
              block.err.data(), static_cast<int>(block.capacity), sweep.u.data() + block.begin * sweep.cols + block.end,
              static_cast<int>(sweep.cols), 1.0, sweep.w.data() + block.end, static_cast<int>(sweep.cols));
}

}  // namespace

ObsSweep obs_sweep(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                   const ObsOptions& options) {
  detail::check_statistics(weight, stats);
  require(options.damp > 0.0 && options.block_cols >= 1, ErrorCode::invalid_argument,
          "OBS needs damp > 0 and block_cols >= 1");
  require(!options.allowed || (options.allowed->rows == weight.rows && options.allowed->cols == weight.cols),
          ErrorCode::invalid_argument, "OBS: the allowed mask's shape differs from the weight's");
  if (options.candidates != ObsCandidates::diagonal) {  // checked here: the row loops run in parallel
    const auto* nm = std::get_if<NmSpec>(&spec);
    const auto* vnm = std::get_if<VnmSpec>(&spec);
    require(!nm || nm->m <= detail::kMaxCombinatorialSet, ErrorCode::unsupported,
            std::string(obs_candidates_name(options.candidates)) +
                " OBS candidates enumerate the kept sets of N:M groups up to M = 16");
    const int pruned = nm ? nm->m - nm->n : vnm ? vnm->m - vnm->n : 0;
    require(options.candidates != ObsCandidates::combinatorial || pruned <= detail::kMaxCombinatorialSet,
            ErrorCode::unsupported,
            "combinatorial OBS candidates need at most 16 pruned entries per group; use pairwise");
  }
  const int64_t rows = weight.rows, cols = weight.cols;
  SweepState sweep{rows, cols, std::vector<double>(static_cast<std::size_t>(rows * cols)),
                   inverse_hessian_factor(stats, options.damp)};
  for (std::size_t i = 0; i < sweep.w.size(); ++i) sweep.w[i] = weight.values.get(i);

  Mask mask = Mask::none(rows, cols);
  TileMask kept_tiles;
  const bool tiles = std::holds_alternative<TileSpec>(spec);
  if (tiles) {  // whole tiles are chosen up front by their summed saliency
    Selection selection = select_by_score(tile_saliency(sweep), spec, options.allowed);
    mask = std::move(selection.mask);
    kept_tiles = std::move(selection.tiles);
  }
  const int group = group_width(spec);
  const int64_t lazy_width = std::max<int64_t>(group, options.block_cols / group * group);
  LazyBlock block{0, 0, lazy_width, std::vector<double>(static_cast<std::size_t>(rows * lazy_width))};
  for (block.begin = 0; block.begin < cols; block.begin += lazy_width) {
    block.end = std::min(cols, block.begin + lazy_width);
    for (int64_t i = block.begin; i < block.end; ++i) {
      if (!tiles && (i - block.begin) % group == 0)
        decide_group(sweep, ColumnGroup{i, static_cast<int>(std::min<int64_t>(group, cols - i))}, spec, options, mask);
      settle_column(sweep, mask, i, block);
    }
    propagate_block(sweep, block);
  }

  DenseMatrix updated = DenseMatrix::zeros(rows, cols, weight.dtype());
  for (std::size_t i = 0; i < sweep.w.size(); ++i) updated.values.set(i, static_cast<float>(sweep.w[i]));
  return ObsSweep{std::move(updated), std::move(mask), std::move(kept_tiles)};
}

PruneResult prune_obs(const DenseMatrix& weight, const LayerStatistics& stats, const FormatSpec& spec,
                      const ObsOptions& options) {
  require(options.block_columns == 0, ErrorCode::invalid_argument, "prune_obs: block_columns steps are for obs_sweep");
  ObsSweep sweep = obs_sweep(weight, stats, spec, options);
  return compress_selection(weight, sweep.weight, Selection{std::move(sweep.mask), std::move(sweep.tiles)}, spec);
}

}  // namespace nmkit
