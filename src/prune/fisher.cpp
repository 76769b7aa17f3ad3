#include "nmkit/prune/fisher.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "nmkit/error.hpp"
#include "nmkit/prune/energy.hpp"
#include "nmkit/util/overloaded.hpp"
#include "obs_groups.hpp"

namespace nmkit {
namespace {


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
          "gradients of '" + name + "' must have shape [samples, " + std::to_string(rows) + ", " + std::to_string(cols) + "]");
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
    require(nm->m <= 16, ErrorCode::unsupported, "Fisher OBS enumerates N:M kept sets up to M = 16");
  if (options.candidates == ObsCandidates::combinatorial) {
    const int pruned = std::visit(overloaded{[](const NmSpec& s) { return s.m - s.n; }, [](const VnmSpec& s) { return s.m - s.n; },
                                             [](const TileSpec&) { return 0; }},
                                  spec);
    require(pruned <= 16, ErrorCode::unsupported, "combinatorial candidates need at most 16 pruned entries per group; use pairwise");
  }
  const int64_t blocks = ceil_div(cols, block);
  std::vector<float> w = weight.to_float();
  Mask mask = Mask::none(rows, cols);

  // 1. Each row-block's inverse Fisher (kept: the mask choice of V:N:M and tiles spans rows).
  std::vector<std::vector<double>> finv(static_cast<std::size_t>(rows * blocks));
  const int64_t sample_stride = rows * cols;
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int width = static_cast<int>(std::min<int64_t>(block, cols - b * block));
      std::vector<float> g(static_cast<std::size_t>(grads.samples * width));
      for (int64_t s = 0; s < grads.samples; ++s)
        for (int j = 0; j < width; ++j) g[s * width + j] = grads.values[s * sample_stride + r * cols + b * block + j];
      finv[r * blocks + b] = fisher_inverse(g.data(), width, grads.samples, width, options.damp);
    }
  auto finv_at = [&](int64_t r, int64_t c) {  // diagonal of the row's inverse Fisher at column c
    const int64_t b = c / block;
    const int width = static_cast<int>(std::min<int64_t>(block, cols - b * block));
    return finv[r * blocks + b][(c - b * block) * width + (c - b * block)];
  };

  // 2. The mask: single-weight saliency w^2 / (2 F^-1_jj) for block columns and tiles, candidate sets per row.
  ScoreMatrix single{rows, cols, std::vector<float>(static_cast<std::size_t>(rows * cols))};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) single.values[r * cols + c] = static_cast<float>(w[r * cols + c] * w[r * cols + c] / finv_at(r, c));
  TileMask tiles;
  if (const auto* t = std::get_if<TileSpec>(&spec)) {
    for (float& x : single.values) x = std::sqrt(x);  // tiles sum squared scores
    tiles = prune_tiles_by_score(single, t->tile_rows, t->tile_cols, t->density);
    mask = expand(tiles, rows, cols, t->tile_rows, t->tile_cols);
  } else {
    const Mask diagonal = std::visit(overloaded{[&](const NmSpec& s) { return prune_nm_by_score(single, s.n, s.m); },
                                                [&](const VnmSpec& s) { return prune_vnm_by_score(single, s.v, s.n, s.m); },
                                                [&](const TileSpec&) { return Mask{}; }},
                                     spec);
    const int keep = std::visit(overloaded{[](const NmSpec& s) { return s.n; }, [](const VnmSpec& s) { return s.n; },
                                           [](const TileSpec&) { return 0; }},
                                spec);
    const auto* vnm = std::get_if<VnmSpec>(&spec);
    mask = diagonal;
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g0 = 0; g0 < cols; g0 += group) {
        const int width = static_cast<int>(std::min<int64_t>(group, cols - g0));
        const int64_t b = g0 / block;
        const int bwidth = static_cast<int>(std::min<int64_t>(block, cols - b * block));
        const int offset = static_cast<int>(g0 - b * block);
        std::vector<double> fg(static_cast<std::size_t>(width * width)), wg(static_cast<std::size_t>(width));
        for (int i = 0; i < width; ++i) {
          wg[i] = w[r * cols + g0 + i];
          for (int j = 0; j < width; ++j) fg[i * width + j] = finv[r * blocks + b][(offset + i) * bwidth + offset + j];
        }
        std::vector<int> cand;
        for (int j = 0; j < width; ++j) {
          if (!vnm) {
            cand.push_back(j);
            continue;
          }
          bool any = false;  // the block's chosen columns: kept by some row of the V rows
          for (int64_t rr = r / vnm->v * vnm->v; rr < std::min<int64_t>(rows, (r / vnm->v + 1) * vnm->v) && !any; ++rr)
            any = diagonal.at(rr, g0 + j);
          if (any) cand.push_back(j);
        }
        const uint32_t set =
            detail::best_kept_set(fg, width, wg, cand, std::min<int>(keep, static_cast<int>(cand.size())), options.candidates);
        for (int j = 0; j < width; ++j) mask.set(r, g0 + j, false);
        for (std::size_t c = 0; c < cand.size(); ++c)
          if ((set >> c) & 1u) mask.set(r, g0 + cand[c], true);
      }
  }

  // 3. The OBS update of each row-block: dw = -F^-1[:, Q] (F^-1_QQ)^-1 w_Q, then the pruned entries are zero.
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int width = static_cast<int>(std::min<int64_t>(block, cols - b * block));
      const std::vector<double>& f = finv[r * blocks + b];
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

  const DenseMatrix updated = DenseMatrix::from_float(rows, cols, w, weight.dtype());
  const double e = energy(weight, mask);
  return std::visit(overloaded{
                        [&](const NmSpec& s) { return PruneResult{compress_nm(updated, mask, s.n, s.m), mask, e}; },
                        [&](const VnmSpec& s) { return PruneResult{compress_vnm(updated, mask, s.v, s.n, s.m), mask, e}; },
                        [&](const TileSpec& s) { return PruneResult{compress_tiles(updated, tiles, s.tile_rows, s.tile_cols), mask, e}; },
                    },
                    spec);
}

}  // namespace nmkit
