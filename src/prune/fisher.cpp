#include "nmkit/prune/fisher.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/util/overloaded.hpp"
#include "obs_groups.hpp"

namespace nmkit {
namespace {

using detail::ColumnGroup;
using detail::GroupRow;
using detail::RowBlock;

// The inverse Fisher of every row-block: row r's columns [b * block, b * block + width(b)), width(b) x width(b)
// row-major.
struct RowBlockInverses {
  int64_t rows = 0;
  int64_t cols = 0;
  int block = 0;
  int64_t blocks = 0;
  std::vector<std::vector<double>> inverse;  // rows x blocks

  int width(int64_t b) const { return static_cast<int>(std::min<int64_t>(block, cols - b * block)); }
  const std::vector<double>& of(int64_t r, int64_t b) const { return inverse[r * blocks + b]; }
  // [F^-1]_cc of row r.
  double diagonal(int64_t r, int64_t c) const {
    const int64_t b = c / block;
    return of(r, b)[(c - b * block) * width(b) + (c - b * block)];
  }
  // (F^-1)_GG of row r: the group lies inside one block, as the block is a multiple of the group width.
  std::vector<double> group_inverse(int64_t r, ColumnGroup group) const {
    const int64_t b = group.c0 / block;
    const int offset = static_cast<int>(group.c0 - b * block), bwidth = width(b);
    std::vector<double> g(static_cast<std::size_t>(group.width * group.width));
    for (int i = 0; i < group.width; ++i)
      for (int j = 0; j < group.width; ++j) g[i * group.width + j] = of(r, b)[(offset + i) * bwidth + offset + j];
    return g;
  }
};

RowBlockInverses row_block_inverses(const GradientSamples& grads, int block, double damp) {
  const int64_t rows = grads.rows, cols = grads.cols, blocks = ceil_div(cols, block);
  RowBlockInverses out{rows, cols, block, blocks,
                       std::vector<std::vector<double>>(static_cast<std::size_t>(rows * blocks))};
  const int64_t sample_stride = rows * cols;
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int width = out.width(b);
      std::vector<float> g(static_cast<std::size_t>(grads.samples * width));
      for (int64_t s = 0; s < grads.samples; ++s)
        for (int j = 0; j < width; ++j) g[s * width + j] = grads.values[s * sample_stride + r * cols + b * block + j];
      out.inverse[r * blocks + b] = fisher_inverse(g.data(), width, grads.samples, width, damp);
    }
  return out;
}

// The mask: selection by the single-weight saliency w^2 / (2 F^-1_jj) (its square root for tiles, which sum
// squared scores), then for N:M and V:N:M each row's best set inside each group by the candidate saliency.
Selection fisher_selection(const std::vector<float>& w, const RowBlockInverses& finv, const FormatSpec& spec,
                           ObsCandidates mode) {
  const int64_t rows = finv.rows, cols = finv.cols;
  ScoreMatrix single{rows, cols, std::vector<float>(static_cast<std::size_t>(rows * cols))};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      single.values[r * cols + c] = static_cast<float>(w[r * cols + c] * w[r * cols + c] / finv.diagonal(r, c));
  if (std::holds_alternative<TileSpec>(spec)) {
    for (float& x : single.values) x = std::sqrt(x);
    return select_by_score(single, spec);
  }
  Selection selection = select_by_score(single, spec);
  const Mask diagonal = selection.mask;
  const int group = group_width(spec);
  const int keep = std::visit(overloaded{[](const NmSpec& s) { return s.n; }, [](const VnmSpec& s) { return s.n; },
                                         [](const TileSpec&) { return 0; }},
                              spec);
  const auto* vnm = std::get_if<VnmSpec>(&spec);
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      const ColumnGroup g{g0, static_cast<int>(std::min<int64_t>(group, cols - g0))};
      std::vector<double> wg(static_cast<std::size_t>(g.width));
      for (int i = 0; i < g.width; ++i) wg[i] = w[r * cols + g0 + i];
      std::vector<int> candidates(static_cast<std::size_t>(g.width));
      std::iota(candidates.begin(), candidates.end(), 0);
      if (vnm) candidates = detail::kept_columns(diagonal, RowBlock::of(r, vnm->v, rows), g);  // the block's columns
      const std::vector<double> fg = finv.group_inverse(r, g);
      detail::keep_best_set(GroupRow{r, g, fg, std::move(wg)}, candidates, keep, mode, selection.mask);
    }
  return selection;
}

// The OBS update of each row-block: dw = -F^-1[:, Q] (F^-1_QQ)^-1 w_Q, then the pruned entries are zero.
void update_kept_weights(std::vector<float>& w, const Mask& mask, const RowBlockInverses& finv) {
  const int64_t rows = finv.rows, cols = finv.cols, block = finv.block;
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < finv.blocks; ++b) {
      const int width = finv.width(b);
      const std::vector<double>& f = finv.of(r, b);
      std::vector<int> q;
      for (int j = 0; j < width; ++j)
        if (!mask.at(r, b * block + j)) q.push_back(j);
      if (q.empty()) continue;
      std::vector<double> a(q.size() * q.size()), x(q.size());
      for (std::size_t i = 0; i < q.size(); ++i) {
        x[i] = w[r * cols + b * block + q[i]];
        for (std::size_t j = 0; j < q.size(); ++j) a[i * q.size() + j] = f[q[i] * width + q[j]];
      }
      if (!detail::solve_spd(std::move(a), x)) continue;  // leave the block unchanged rather than apply a wrong update
      for (int j = 0; j < width; ++j) {
        double dw = 0.0;
        for (std::size_t i = 0; i < q.size(); ++i) dw -= f[j * width + q[i]] * x[i];
        w[r * cols + b * block + j] += static_cast<float>(dw);
      }
      for (int j : q) w[r * cols + b * block + j] = 0.0f;
    }
}

}  // namespace

void require_finite(const GradientSamples& grads, std::string_view what) {
  const int64_t per_sample = std::max<int64_t>(grads.rows * grads.cols, 1), cols = std::max<int64_t>(grads.cols, 1);
  for (std::size_t i = 0; i < grads.values.size(); ++i)
    require(std::isfinite(grads.values[i]), ErrorCode::invalid_argument, [&] {
      const auto at = static_cast<int64_t>(i);
      return std::string(what) + " sample " + std::to_string(at / per_sample) + ", row " +
             std::to_string(at % per_sample / cols) + ", column " + std::to_string(at % cols) + " is " +
             (std::isnan(grads.values[i]) ? "NaN" : "infinite") + "; a Fisher estimate needs finite gradients";
    });
}

GradientSamples read_gradients(const SafetensorsFile& file, const std::string& name, int64_t rows, int64_t cols) {
  const StTensor* t = file.find(name);
  require(t != nullptr, ErrorCode::io_error, "gradients file has no tensor '" + name + "'");
  require(t->shape.size() == 3 && t->shape[0] >= 1 && t->shape[1] == rows && t->shape[2] == cols, ErrorCode::io_error,
          "gradients of '" + name + "' must have shape [samples, " + std::to_string(rows) + ", " +
              std::to_string(cols) + "]");
  require(t->dtype == StDType::F32 || t->dtype == StDType::F16 || t->dtype == StDType::BF16, ErrorCode::io_error,
          "gradients of '" + name + "' must be F32, F16 or BF16");
  StTensor flat = *t;
  flat.shape = {t->shape[0] * rows, cols};
  GradientSamples grads{t->shape[0], rows, cols, to_dense_matrix(flat).to_float()};
  require_finite(grads, "gradients of '" + name + "'");
  return grads;
}

std::vector<double> fisher_inverse(const float* grads, int64_t stride, int64_t m, int block, double damp) {
  require(damp > 0.0 && m >= 1 && block >= 1, ErrorCode::invalid_argument, "fisher_inverse needs damp > 0 and samples");
  std::vector<double> f(static_cast<std::size_t>(block * block), 0.0);
  for (int i = 0; i < block; ++i) f[i * block + i] = 1.0 / damp;
  std::vector<double> fg(static_cast<std::size_t>(block));
  for (int64_t s = 0; s < m; ++s) {
    const float* g = grads + s * stride;
    // F^-1 <- F^-1 - (F^-1 g)(F^-1 g)^T / (m + g^T F^-1 g), the Woodbury update of F + g g^T / m.
    double denominator = static_cast<double>(m);
    for (int i = 0; i < block; ++i) {
      double v = 0.0;
      for (int j = 0; j < block; ++j) v += f[i * block + j] * g[j];
      fg[i] = v;
      denominator += g[i] * v;
    }
    for (int i = 0; i < block; ++i)
      for (int j = 0; j < block; ++j) f[i * block + j] -= fg[i] * fg[j] / denominator;
  }
  return f;
}

PruneResult prune_obs_fisher(const DenseMatrix& weight, const GradientSamples& grads, const FormatSpec& spec,
                             const FisherOptions& options) {
  const int64_t rows = weight.rows, cols = weight.cols;
  require(grads.rows == rows && grads.cols == cols && grads.samples >= 1 &&
              grads.values.size() == static_cast<std::size_t>(grads.samples * rows * cols),
          ErrorCode::invalid_argument, "Fisher OBS: the gradients do not match the weight's shape");
  require_finite(weight, "weight");
  require_finite(grads, "Fisher gradients");
  const int group = group_width(spec), block = options.block;
  require(block >= group && block % group == 0 && block <= 256, ErrorCode::invalid_argument,
          "Fisher OBS: the block (" + std::to_string(block) + ") must be a multiple of the group width " +
              std::to_string(group) + ", at most 256");
  if (const auto* nm = std::get_if<NmSpec>(&spec))
    require(nm->m <= detail::kMaxCombinatorialSet, ErrorCode::unsupported,
            "Fisher OBS enumerates N:M kept sets up to M = 16");
  if (options.candidates == ObsCandidates::combinatorial) {
    const int pruned =
        std::visit(overloaded{[](const NmSpec& s) { return s.m - s.n; }, [](const VnmSpec& s) { return s.m - s.n; },
                              [](const TileSpec&) { return 0; }},
                   spec);
    require(pruned <= detail::kMaxCombinatorialSet, ErrorCode::unsupported,
            "combinatorial candidates need at most 16 pruned entries per group; use pairwise");
  }
  // Each row-block's inverse Fisher is kept: the mask choice of V:N:M and tiles spans rows.
  const RowBlockInverses finv = row_block_inverses(grads, block, options.damp);
  std::vector<float> w = weight.to_float();
  Selection selection = fisher_selection(w, finv, spec, options.candidates);
  update_kept_weights(w, selection.mask, finv);
  const DenseMatrix updated = DenseMatrix::from_float(rows, cols, w, weight.dtype());
  return compress_selection(weight, updated, std::move(selection), spec);
}

}  // namespace nmkit
