#include "nmkit/attention/dfss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/format/spec.hpp"

namespace nmkit {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

std::string shape(ConstMatrixRef a) { return std::to_string(a.rows) + "x" + std::to_string(a.cols); }

void check_operand(ConstMatrixRef a, const char* name) {
  require(a.rows >= 0 && a.cols >= 0, ErrorCode::invalid_argument,
          std::string("attention: ") + name + " has a negative shape");
  require(a.layout == Layout::row_major, ErrorCode::invalid_argument,
          std::string("attention: ") + name + " must be row-major");
  require(a.data != nullptr || a.rows * a.cols == 0, ErrorCode::invalid_argument,
          std::string("attention: ") + name + " is null");
  require_finite(std::span<const float>(a.data, static_cast<std::size_t>(a.rows * a.cols)), a.cols,
                 std::string("attention: ") + name);
}

// Shapes of q, k and the masks; v separately where it is used.
void check_scores_inputs(ConstMatrixRef q, ConstMatrixRef k, float scale, const AttentionMask& mask) {
  check_operand(q, "q");
  check_operand(k, "k");
  require(q.cols == k.cols, ErrorCode::invalid_argument,
          "attention: q is " + shape(q) + " and k is " + shape(k) + ": their head dimensions d differ");
  require(std::isfinite(scale), ErrorCode::invalid_argument, "attention: the scale is not finite");
  require(mask.key_padding.empty() || static_cast<int64_t>(mask.key_padding.size()) == k.rows,
          ErrorCode::invalid_argument,
          "attention: key_padding has " + std::to_string(mask.key_padding.size()) +
              " entries, expected S_k=" + std::to_string(k.rows));
  require(mask.additive.empty() || static_cast<int64_t>(mask.additive.size()) == q.rows * k.rows,
          ErrorCode::invalid_argument,
          "attention: the additive mask has " + std::to_string(mask.additive.size()) +
              " entries, expected S_q x S_k = " + std::to_string(q.rows) + "x" + std::to_string(k.rows));
  for (std::size_t i = 0; i < mask.additive.size(); ++i) {
    const float a = mask.additive[i];
    require(!std::isnan(a) && a != -kMinusInf, ErrorCode::invalid_argument, [&] {
      const auto cols = static_cast<std::size_t>(k.rows);
      return "attention: the additive mask at query " + std::to_string(i / cols) + ", key " + std::to_string(i % cols) +
             " is " + (std::isnan(a) ? "NaN" : "+inf") + "; only -inf masks";
    });
  }
}

void check_v(ConstMatrixRef k, ConstMatrixRef v) {
  check_operand(v, "v");
  require(v.rows == k.rows, ErrorCode::invalid_argument,
          "attention: v is " + shape(v) + " but k is " + shape(k) + ": they need the same number of keys S_k");
}

// Row i of scale * q k^T plus the masks; masked entries are -inf. Accumulates in fp64 so that the result does not
// depend on the summation order (the GPU kernel's fp32 order differs, its ties are its own scores').
void masked_scores(ConstMatrixRef q, ConstMatrixRef k, float scale, const AttentionMask& mask, int64_t i,
                   std::vector<float>& row) {
  row.resize(static_cast<std::size_t>(k.rows));
  const float* qi = q.data + i * q.cols;
  for (int64_t j = 0; j < k.rows; ++j) {
    const bool masked = (mask.causal && j > i) || (!mask.key_padding.empty() && mask.key_padding[j] != 0);
    float s = kMinusInf;
    if (!masked) {
      const float* kj = k.data + j * k.cols;
      double dot = 0.0;
      for (int64_t d = 0; d < q.cols; ++d) dot += double{qi[d]} * kj[d];
      s = static_cast<float>(dot * scale);
      if (!mask.additive.empty()) s += mask.additive[static_cast<std::size_t>(i * k.rows + j)];
      require(s == kMinusInf || std::isfinite(s), ErrorCode::invalid_argument, [&] {
        return "attention: the score of query " + std::to_string(i) + ", key " + std::to_string(j) +
               " is not finite (scale * q.k overflows)";
      });
    }
    row[static_cast<std::size_t>(j)] = s;
  }
}

}  // namespace

NmMatrix sddmm_nm(ConstMatrixRef q, ConstMatrixRef k, float scale, const AttentionMask& mask, int n, int m) {
  check_nm_pattern(n, m);
  check_scores_inputs(q, k, scale, mask);
  const int64_t rows = q.rows, cols = k.rows, groups = ceil_div(cols, m);
  DenseMatrix dense = DenseMatrix::zeros(rows, cols, DType::f32);
  Mask keep = Mask::none(rows, cols);
  std::vector<float> row;
  for (int64_t i = 0; i < rows; ++i) {
    masked_scores(q, k, scale, mask, i, row);
    for (int64_t j = 0; j < cols; ++j) dense.set(i, j, row[static_cast<std::size_t>(j)]);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * m, end = std::min(begin + m, cols);
      bool taken[32] = {};
      for (int pick = 0; pick < n; ++pick) {
        // Strictly greater: among equal scores the first (lowest key index) wins.
        int64_t best = -1;
        for (int64_t j = begin; j < end; ++j) {
          const float s = row[static_cast<std::size_t>(j)];
          if (!taken[j - begin] && s != kMinusInf && (best < 0 || s > row[static_cast<std::size_t>(best)])) best = j;
        }
        if (best < 0) break;  // fewer than N valid keys in this group
        taken[best - begin] = true;
        keep.set(i, best, true);
      }
    }
  }
  NmMatrix out = compress_nm(dense, keep, n, m);
  // The format stores unused slots as explicit zeros; inside the row a zero would be a real score, so filler
  // slots say -inf (K-padding slots keep the format's zero).
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < groups; ++g)
      for (int s = 0; s < n; ++s) {
        const int64_t c = out.column_of(i, g, s);
        if (c < cols && !keep.at(i, c)) out.values.set(static_cast<std::size_t>((i * groups + g) * n + s), kMinusInf);
      }
  return out;
}

NmMatrix softmax_nm(const NmMatrix& scores, std::vector<float>* lse) {
  validate(scores);
  NmMatrix p = scores;
  p.values = TypedBuffer(DType::f32, static_cast<std::size_t>(scores.value_count()));
  if (lse) lse->assign(static_cast<std::size_t>(scores.rows), kMinusInf);
  const int64_t groups = scores.groups(), per_row = groups * scores.n;
  for (int64_t r = 0; r < scores.rows; ++r) {
    const auto kept = [&](int64_t slot) {  // slot within the row; false for filler and K padding
      const float s = scores.values.get(static_cast<std::size_t>(r * per_row + slot));
      require(!std::isnan(s) && s != -kMinusInf, ErrorCode::invalid_argument, [&] {
        return "softmax_nm: row " + std::to_string(r) + ", slot " + std::to_string(slot) + " holds " +
               (std::isnan(s) ? "NaN" : "+inf");
      });
      return scores.column_of(r, slot / scores.n, static_cast<int>(slot % scores.n)) < scores.cols && s != kMinusInf;
    };
    float max_score = kMinusInf;
    for (int64_t slot = 0; slot < per_row; ++slot)
      if (kept(slot)) max_score = std::max(max_score, scores.values.get(static_cast<std::size_t>(r * per_row + slot)));
    if (max_score == kMinusInf) continue;  // nothing kept: zeros, lse -inf
    double sum = 0.0;
    for (int64_t slot = 0; slot < per_row; ++slot)
      if (kept(slot))
        sum += std::exp(double{scores.values.get(static_cast<std::size_t>(r * per_row + slot))} - max_score);
    for (int64_t slot = 0; slot < per_row; ++slot) {
      const auto vi = static_cast<std::size_t>(r * per_row + slot);
      if (kept(slot)) p.values.set(vi, static_cast<float>(std::exp(double{scores.values.get(vi)} - max_score) / sum));
    }
    if (lse) (*lse)[static_cast<std::size_t>(r)] = static_cast<float>(max_score + std::log(sum));
  }
  return p;
}

std::vector<float> spmm_nm_v(const NmMatrix& p, ConstMatrixRef v) {
  check_operand(v, "v");
  require(v.rows == p.cols, ErrorCode::invalid_argument,
          "spmm_nm_v: P has S_k=" + std::to_string(p.cols) + " columns but v is " + shape(v));
  std::vector<float> out(static_cast<std::size_t>(p.rows * v.cols));
  spmm(SparseMatrix(p), v, {}, MatrixRef{out.data(), p.rows, v.cols});
  return out;
}

std::vector<float> dfss_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, const DfssOptions& options,
                                  std::vector<float>* lse) {
  check_v(k, v);
  const float scale = options.scale.value_or(1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(q.cols, 1))));
  return spmm_nm_v(softmax_nm(sddmm_nm(q, k, scale, options.mask, options.n, options.m), lse), v);
}

std::vector<float> attention_reference(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, const DfssOptions& options,
                                       std::vector<float>* lse) {
  const float scale = options.scale.value_or(1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(q.cols, 1))));
  check_scores_inputs(q, k, scale, options.mask);
  check_v(k, v);
  std::vector<float> out(static_cast<std::size_t>(q.rows * v.cols), 0.0f), row;
  if (lse) lse->assign(static_cast<std::size_t>(q.rows), kMinusInf);
  std::vector<double> acc(static_cast<std::size_t>(v.cols));
  for (int64_t i = 0; i < q.rows; ++i) {
    masked_scores(q, k, scale, options.mask, i, row);
    float max_score = kMinusInf;
    for (float s : row) max_score = std::max(max_score, s);
    if (max_score == kMinusInf) continue;
    double sum = 0.0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k.rows; ++j) {
      const float s = row[static_cast<std::size_t>(j)];
      if (s == kMinusInf) continue;
      const double w = std::exp(double{s} - max_score);
      sum += w;
      for (int64_t d = 0; d < v.cols; ++d) acc[static_cast<std::size_t>(d)] += w * v.data[j * v.cols + d];
    }
    for (int64_t d = 0; d < v.cols; ++d)
      out[static_cast<std::size_t>(i * v.cols + d)] = static_cast<float>(acc[static_cast<std::size_t>(d)] / sum);
    if (lse) (*lse)[static_cast<std::size_t>(i)] = static_cast<float>(max_score + std::log(sum));
  }
  return out;
}

}  // namespace nmkit
