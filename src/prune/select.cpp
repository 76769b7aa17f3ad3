#include "nmkit/prune/select.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "nmkit/error.hpp"
#include "nmkit/prune/energy.hpp"
#include "nmkit/util/overloaded.hpp"

namespace nmkit {
namespace {

constexpr int kCols = kVnmSelectedColumns;

// The two largest of a row's chosen values: all that N <= 2 needs to know about a subset.
struct TopTwo {
  float first = 0.0f;
  float second = 0.0f;
  // Branch-free (the same result for finite values), so that the loops over a block's rows vectorise.
  void push(float x) noexcept {
    second = std::max(second, std::min(first, x));
    first = std::max(first, x);
  }
  double keep(int n) const noexcept { return n == 1 ? first : double{first} + second; }
};

// Kept score of a column subset: sum over rows of the N largest values among `cols`.
double subset_value(const float* a, int rows, int width, const int* cols, int count, int n) {
  double sum = 0.0;
  for (int r = 0; r < rows; ++r) {
    TopTwo t;
    for (int i = 0; i < count; ++i) t.push(a[r * width + cols[i]]);
    sum += t.keep(n);
  }
  return sum;
}

// Branch and bound over 4-subsets of the columns, visited in order of decreasing column sum.
class ColumnSearch {
 public:
  ColumnSearch(const float* a, int rows, int width, int n, int64_t budget)
      : a_(a), rows_(rows), width_(width), n_(n), budget_(budget), order_(width) {
    std::vector<double> col_sum(width, 0.0);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < width; ++c) col_sum[c] += a[r * width + c];
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(), [&](int x, int y) { return col_sum[x] > col_sum[y]; });
    // suffix_[(i * rows + r)]: the two largest of row r over order_[i..width).
    suffix_.assign(static_cast<std::size_t>(width + 1) * rows, TopTwo{});
    for (int i = width - 1; i >= 0; --i)
      for (int r = 0; r < rows; ++r) {
        TopTwo t = suffix_[static_cast<std::size_t>(i + 1) * rows + r];
        t.push(a[r * width + order_[i]]);
        suffix_[static_cast<std::size_t>(i) * rows + r] = t;
      }
  }

  VnmColumnChoice run() {
    seed_incumbent();
    state_.assign(static_cast<std::size_t>(kCols + 1) * rows_, TopTwo{});
    int chosen[kCols];
    dfs(0, 0, chosen);
    VnmColumnChoice out;
    std::copy(best_, best_ + kCols, out.columns);
    std::sort(out.columns, out.columns + kCols);
    out.kept_score = best_value_;
    out.proven_optimal = nodes_ <= budget_;
    return out;
  }

 private:
  // Greedy: add the column that raises the kept value most; then swap columns while it helps.
  void seed_incumbent() {
    int chosen[kCols];
    bool in[256] = {};
    for (int k = 0; k < kCols; ++k) {
      double best = -1.0;
      for (int c = 0; c < width_; ++c) {
        if (in[c]) continue;
        chosen[k] = c;
        const double value = subset_value(a_, rows_, width_, chosen, k + 1, n_);
        if (value > best) best = value, best_[k] = c;
      }
      chosen[k] = best_[k];
      in[best_[k]] = true;
    }
    best_value_ = subset_value(a_, rows_, width_, best_, kCols, n_);
    for (bool improved = true; improved;) {
      improved = false;
      for (int k = 0; k < kCols; ++k)
        for (int c = 0; c < width_; ++c) {
          if (in[c]) continue;
          int trial[kCols];
          std::copy(best_, best_ + kCols, trial);
          trial[k] = c;
          const double value = subset_value(a_, rows_, width_, trial, kCols, n_);
          if (value > best_value_) {
            in[best_[k]] = false, in[c] = true;
            best_[k] = c, best_value_ = value, improved = true;
          }
        }
    }
  }

  TopTwo* state(int depth) noexcept { return state_.data() + static_cast<std::size_t>(depth) * rows_; }

  // Upper bound of any completion of the depth-p state with columns from order_[next..].
  double bound(int p, int next) {
    const int free_slots = kCols - p;
    const TopTwo* current = state(p);
    double sum = 0.0;
    for (int r = 0; r < rows_; ++r) {
      TopTwo t = current[r];
      const TopTwo& s = suffix_[static_cast<std::size_t>(next) * rows_ + r];
      t.push(s.first);
      if (free_slots >= 2) t.push(s.second);
      sum += t.keep(n_);
    }
    return sum;
  }

  // state(p) holds each row's two largest values over the p columns chosen so far.
  void dfs(int p, int next, int* chosen) {
    if (++nodes_ > budget_) return;
    if (p == kCols) {
      double value = 0.0;
      for (int r = 0; r < rows_; ++r) value += state(p)[r].keep(n_);
      if (value > best_value_) best_value_ = value, std::copy(chosen, chosen + kCols, best_);
      return;
    }
    for (int i = next; i <= width_ - (kCols - p); ++i) {
      if (bound(p, i) <= best_value_) return;  // later i see a subset of these columns: no better
      const int c = order_[i];
      const TopTwo* parent = state(p);
      TopTwo* child = state(p + 1);
      for (int r = 0; r < rows_; ++r) (child[r] = parent[r]).push(a_[r * width_ + c]);
      chosen[p] = c;
      dfs(p + 1, i + 1, chosen);
      if (nodes_ > budget_) return;
    }
  }

  const float* a_;
  int rows_, width_, n_;
  int64_t budget_;
  int64_t nodes_ = 0;
  std::vector<int> order_;
  std::vector<TopTwo> suffix_;
  std::vector<TopTwo> state_;  // (kCols + 1, rows): the DFS's per-depth row states
  int best_[kCols] = {0, 1, 2, 3};
  double best_value_ = -1.0;
};

// `mask` with every entry outside `allowed` pruned.
Mask keep_only(Mask mask, const Mask& allowed) {
  for (std::size_t i = 0; i < mask.keep.size(); ++i) mask.keep[i] &= allowed.keep[i];
  return mask;
}

}  // namespace

ScoreMatrix restrict_scores(ScoreMatrix score, const Mask& allowed) {
  require(allowed.rows == score.rows && allowed.cols == score.cols, ErrorCode::invalid_argument,
          "restrict_scores: the allowed mask's shape differs from the scores'");
  for (std::size_t i = 0; i < score.values.size(); ++i)
    if (!allowed.keep[i]) score.values[i] = 0.0f;
  return score;
}

Mask select_nm(const ScoreMatrix& score, int n, int m) {
  check_nm_pattern(n, m);
  Mask mask = Mask::none(score.rows, score.cols);
  const int64_t groups = ceil_div(score.cols, m);
  // The N best of each group by repeated selection (ties: the lower column): N and M are small, and a sort per
  // group would dominate the pruning's time.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < score.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * m;
      const int width = static_cast<int>(std::min<int64_t>(m, score.cols - c0));
      uint64_t taken = 0;  // M <= 32 (check_nm_pattern)
      for (int i = 0; i < std::min(n, width); ++i) {
        int best = -1;
        for (int j = 0; j < width; ++j)
          if (!((taken >> j) & 1u) && (best < 0 || score.at(r, c0 + j) > score.at(r, c0 + best))) best = j;
        taken |= uint64_t{1} << best;
        mask.set(r, c0 + best, true);
      }
    }
  return mask;
}

VnmColumnChoice choose_vnm_columns(const float* block_scores, int rows, int width, int n, int64_t node_budget) {
  require(width >= 1 && width <= kVnmMaxM && rows >= 1 && (n == 1 || n == 2), ErrorCode::invalid_argument,
          "choose_vnm_columns: needs rows >= 1, 1 <= width <= 256, N in {1, 2}");
  VnmColumnChoice out;
  if (width <= kCols) {  // a tail block: every real column is kept
    for (int i = 0; i < kCols; ++i) out.columns[i] = i;
    out.kept_score = subset_value(block_scores, rows, width, out.columns, width, n);
    return out;
  }
  return ColumnSearch(block_scores, rows, width, n, node_budget).run();
}

Mask select_vnm(const ScoreMatrix& score, int v, int n, int m, VnmSearchStats* stats) {
  check_vnm_pattern(v, n, m);
  Mask mask = Mask::none(score.rows, score.cols);
  const int64_t row_blocks = ceil_div(score.rows, v), groups = ceil_div(score.cols, m);
  int64_t proven = 0;
#pragma omp parallel for collapse(2) schedule(dynamic) reduction(+ : proven)
  for (int64_t rb = 0; rb < row_blocks; ++rb)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t r0 = rb * v, c0 = g * m;
      const int rows = static_cast<int>(std::min<int64_t>(v, score.rows - r0));
      const int width = static_cast<int>(std::min<int64_t>(m, score.cols - c0));
      std::vector<float> block(static_cast<std::size_t>(rows) * width);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < width; ++j) block[i * width + j] = score.at(r0 + i, c0 + j);
      const VnmColumnChoice choice = choose_vnm_columns(block.data(), rows, width, n);
      proven += choice.proven_optimal ? 1 : 0;
      // N largest of the chosen columns per row (ties: the lower column).
      for (int i = 0; i < rows; ++i) {
        int cols[kCols];
        int count = 0;
        for (int s = 0; s < kCols; ++s)
          if (choice.columns[s] < width) cols[count++] = choice.columns[s];
        // Insertion sort by score descending; stable, so ties keep the lower column.
        for (int s = 1; s < count; ++s)
          for (int t = s; t > 0 && block[i * width + cols[t]] > block[i * width + cols[t - 1]]; --t)
            std::swap(cols[t], cols[t - 1]);
        for (int s = 0; s < std::min(n, count); ++s) mask.set(r0 + i, c0 + cols[s], true);
      }
    }
  if (stats) {
    stats->blocks += row_blocks * groups;
    stats->proven_optimal += proven;
  }
  return mask;
}

Mask select_block_columns(const ScoreMatrix& score, int v, int m, int columns, const Mask* allowed) {
  if (allowed) return keep_only(select_block_columns(restrict_scores(score, *allowed), v, m, columns), *allowed);
  require(v >= 1 && m >= 1 && columns >= 1 && columns <= m, ErrorCode::invalid_argument,
          "block columns: needs V, M >= 1 and 1 <= columns <= M");
  Mask mask = Mask::none(score.rows, score.cols);
  const int64_t row_blocks = ceil_div(score.rows, v), groups = ceil_div(score.cols, m);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t rb = 0; rb < row_blocks; ++rb)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t r0 = rb * v, r1 = std::min<int64_t>(r0 + v, score.rows), c0 = g * m;
      const int width = static_cast<int>(std::min<int64_t>(m, score.cols - c0));
      std::vector<double> sum(static_cast<std::size_t>(width), 0.0);
      for (int64_t r = r0; r < r1; ++r)
        for (int j = 0; j < width; ++j) sum[j] += score.at(r, c0 + j);
      std::vector<int> order(static_cast<std::size_t>(width));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sum[a] > sum[b]; });
      for (int k = 0; k < std::min(columns, width); ++k)
        for (int64_t r = r0; r < r1; ++r) mask.set(r, c0 + order[k], true);
    }
  return mask;
}

TileMask select_tiles(const ScoreMatrix& score, int tile_rows, int tile_cols, double density) {
  check_tile_shape(tile_rows, tile_cols);
  require(density > 0.0 && density <= 1.0, ErrorCode::invalid_argument,
          "tile density must be in (0, 1], got " + std::to_string(density));
  TileMask mask{ceil_div(score.rows, tile_rows), ceil_div(score.cols, tile_cols), {}};
  const int64_t tiles = mask.grid_rows * mask.grid_cols;
  mask.keep.assign(static_cast<std::size_t>(tiles), 0);
  if (tiles == 0) return mask;
  std::vector<double> norm2(static_cast<std::size_t>(tiles), 0.0);
  for (int64_t r = 0; r < score.rows; ++r)
    for (int64_t c = 0; c < score.cols; ++c) {
      const double x = score.at(r, c);
      norm2[static_cast<std::size_t>((r / tile_rows) * mask.grid_cols + c / tile_cols)] += x * x;
    }
  const auto keep = std::clamp<int64_t>(std::llround(density * static_cast<double>(tiles)), 1, tiles);
  std::vector<int64_t> order(static_cast<std::size_t>(tiles));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return norm2[x] > norm2[y]; });
  for (int64_t i = 0; i < keep; ++i) mask.keep[static_cast<std::size_t>(order[i])] = 1;
  return mask;
}

Selection select_by_score(const ScoreMatrix& score, const FormatSpec& spec, const Mask* allowed) {
  if (allowed) {
    Selection selection = select_by_score(restrict_scores(score, *allowed), spec);
    selection.mask = keep_only(std::move(selection.mask), *allowed);
    return selection;
  }
  return std::visit(overloaded{
                        [&](const NmSpec& s) {
                          return Selection{select_nm(score, s.n, s.m), {}};
                        },
                        [&](const VnmSpec& s) {
                          return Selection{select_vnm(score, s.v, s.n, s.m), {}};
                        },
                        [&](const TileSpec& s) {
                          TileMask tiles = select_tiles(score, s.tile_rows, s.tile_cols, s.density);
                          Mask mask = expand(tiles, score.rows, score.cols, s.tile_rows, s.tile_cols);
                          return Selection{std::move(mask), std::move(tiles)};
                        },
                    },
                    spec);
}

PruneResult compress_selection(const DenseMatrix& original, const DenseMatrix& values, Selection selection,
                               const FormatSpec& spec) {
  const double e = energy(original, selection.mask);
  SparseMatrix compressed = std::visit(
      overloaded{
          [&](const NmSpec& s) -> SparseMatrix { return compress_nm(values, selection.mask, s.n, s.m); },
          [&](const VnmSpec& s) -> SparseMatrix { return compress_vnm(values, selection.mask, s.v, s.n, s.m); },
          [&](const TileSpec& s) -> SparseMatrix {
            return compress_tiles(values, selection.tiles, s.tile_rows, s.tile_cols);
          },
      },
      spec);
  return PruneResult{std::move(compressed), std::move(selection.mask), e};
}

PruneResult prune_by_score(const DenseMatrix& weight, const ScoreMatrix& score, const FormatSpec& spec,
                           const Mask* allowed) {
  require(score.rows == weight.rows && score.cols == weight.cols, ErrorCode::invalid_argument,
          "prune_by_score: score shape differs from the weight shape");
  require_finite(weight, "weight");
  Selection selection = select_by_score(score, spec, allowed);
  if (allowed && std::holds_alternative<TileSpec>(spec)) {
    // Entries outside `allowed` inside a kept tile are stored as zeros.
    const DenseMatrix kept = apply_mask(weight, selection.mask);
    return compress_selection(weight, kept, std::move(selection), spec);
  }
  return compress_selection(weight, weight, std::move(selection), spec);
}

}  // namespace nmkit
