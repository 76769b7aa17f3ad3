// DFSS attention ops (sddmm_nm, softmax_nm, spmm_nm_v, dfss_attention, attention_reference) against plain
// double-precision loops written here: scores, the N:M choice per group (largest score, ties to the lower key),
// masks, softmax over the kept scores, P*V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../src/cuda/attention/keep_two_of_four.cuh"
#include "nmkit/attention/dfss.hpp"
#include "nmkit/error.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

using test::random_nonzero;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Problem {
  int64_t sq = 0, sk = 0, d = 0, dv = 0;
  std::vector<float> q, k, v, additive;
  std::vector<uint8_t> padding;
  bool causal = false;
  float scale = 0.0f;

  Problem(int64_t sq_, int64_t sk_, int64_t d_, int64_t dv_, uint32_t seed)
      : sq(sq_),
        sk(sk_),
        d(d_),
        dv(dv_),
        q(random_nonzero(sq_ * d_, seed)),
        k(random_nonzero(sk_ * d_, seed + 1)),
        v(random_nonzero(sk_ * dv_, seed + 2)),
        scale(static_cast<float>(1.0 / std::sqrt(double(d_)))) {
    for (float& x : q) x *= 3.0f;  // spread the scores so that softmax is far from uniform
  }
  ConstMatrixRef qr() const { return {q.data(), sq, d}; }
  ConstMatrixRef kr() const { return {k.data(), sk, d}; }
  ConstMatrixRef vr() const { return {v.data(), sk, dv}; }
  DfssOptions options(int n, int m) const {
    DfssOptions o;
    o.n = n, o.m = m, o.scale = scale;
    o.mask.causal = causal, o.mask.key_padding = padding, o.mask.additive = additive;
    return o;
  }
};

// What the loops compute: the fp32 score of each entry (-inf when masked), the kept set, P, O and lse in double.
struct Expected {
  std::vector<float> score;   // sq x sk
  std::vector<uint8_t> kept;  // sq x sk
  std::vector<double> p;      // sq x sk
  std::vector<float> out;     // sq x dv
  std::vector<double> lse;    // sq
};

Expected expected(const Problem& pr, int n, int m, bool prune) {
  Expected e;
  e.score.assign(pr.sq * pr.sk, -std::numeric_limits<float>::infinity());
  e.kept.assign(pr.sq * pr.sk, 0);
  e.p.assign(pr.sq * pr.sk, 0.0);
  e.out.assign(pr.sq * pr.dv, 0.0f);
  e.lse.assign(pr.sq, -kInf);
  for (int64_t i = 0; i < pr.sq; ++i) {
    for (int64_t j = 0; j < pr.sk; ++j) {
      if ((pr.causal && j > i) || (!pr.padding.empty() && pr.padding[j])) continue;
      double dot = 0.0;
      for (int64_t t = 0; t < pr.d; ++t) dot += double{pr.q[i * pr.d + t]} * pr.k[j * pr.d + t];
      float s = static_cast<float>(dot * pr.scale);
      if (!pr.additive.empty()) s += pr.additive[i * pr.sk + j];
      e.score[i * pr.sk + j] = s;
    }
    for (int64_t g = 0; g * m < pr.sk; ++g) {
      std::vector<int64_t> valid;
      for (int64_t j = g * m; j < std::min<int64_t>(g * m + m, pr.sk); ++j)
        if (std::isfinite(e.score[i * pr.sk + j])) valid.push_back(j);
      // Largest score first, the lower key first among equal scores.
      std::stable_sort(valid.begin(), valid.end(),
                       [&](int64_t a, int64_t b) { return e.score[i * pr.sk + a] > e.score[i * pr.sk + b]; });
      if (prune && static_cast<int>(valid.size()) > n) valid.resize(n);
      for (int64_t j : valid) e.kept[i * pr.sk + j] = 1;
    }
    double mx = -kInf, sum = 0.0;
    for (int64_t j = 0; j < pr.sk; ++j)
      if (e.kept[i * pr.sk + j]) mx = std::max(mx, double{e.score[i * pr.sk + j]});
    if (mx == -kInf) continue;
    for (int64_t j = 0; j < pr.sk; ++j)
      if (e.kept[i * pr.sk + j]) sum += std::exp(double{e.score[i * pr.sk + j]} - mx);
    e.lse[i] = mx + std::log(sum);
    for (int64_t j = 0; j < pr.sk; ++j)
      if (e.kept[i * pr.sk + j]) e.p[i * pr.sk + j] = std::exp(double{e.score[i * pr.sk + j]} - mx) / sum;
    for (int64_t c = 0; c < pr.dv; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < pr.sk; ++j) acc += e.p[i * pr.sk + j] * pr.v[j * pr.dv + c];
      e.out[i * pr.dv + c] = static_cast<float>(acc);
    }
  }
  return e;
}

// Every slot of `a`: kept entries where the loops keep them, with their value; filler -inf; K padding 0.
template <class Value>
void expect_pattern(const NmMatrix& a, const Problem& pr, const Expected& e, Value&& value_of, double tol) {
  ASSERT_NO_THROW(validate(a));
  ASSERT_EQ(a.rows, pr.sq);
  ASSERT_EQ(a.cols, pr.sk);
  for (int64_t i = 0; i < a.rows; ++i) {
    std::vector<uint8_t> got(pr.sk, 0);
    for (int64_t g = 0; g < a.groups(); ++g)
      for (int s = 0; s < a.n; ++s) {
        const int64_t c = a.column_of(i, g, s);
        const float v = a.values.get((i * a.groups() + g) * a.n + s);
        if (c >= pr.sk) {
          ASSERT_EQ(v, 0.0f) << "K padding at row " << i << ", group " << g;
        } else if (e.kept[i * pr.sk + c]) {
          got[c] = 1;
          ASSERT_NEAR(v, value_of(i, c), tol) << "row " << i << ", key " << c;
        } else {
          ASSERT_TRUE(value_of(i, c) == -kInf || value_of(i, c) == 0.0 || v == 0.0f)
              << "row " << i << ": key " << c << " stored but not kept by the loop (value " << v << ")";
        }
      }
    for (int64_t j = 0; j < pr.sk; ++j) ASSERT_EQ(got[j], e.kept[i * pr.sk + j]) << "row " << i << ", key " << j;
  }
}

void expect_scores(const Problem& pr, int n, int m) {
  const Expected e = expected(pr, n, m, true);
  const NmMatrix s = sddmm_nm(pr.qr(), pr.kr(), pr.scale, pr.options(n, m).mask, n, m);
  ASSERT_EQ(s.n, n);
  ASSERT_EQ(s.m, m);
  ASSERT_EQ(s.dtype(), DType::f32);
  // Scores are exact (both fp32 of the same fp64 dot); filler slots must be -inf.
  expect_pattern(
      s, pr, e, [&](int64_t i, int64_t c) { return double{e.score[i * pr.sk + c]}; }, 0.0);
  for (int64_t i = 0; i < s.rows; ++i)
    for (int64_t g = 0; g < s.groups(); ++g)
      for (int t = 0; t < s.n; ++t) {
        const int64_t c = s.column_of(i, g, t);
        if (c < pr.sk && !e.kept[i * pr.sk + c]) ASSERT_EQ(s.values.get((i * s.groups() + g) * s.n + t), -INFINITY);
      }
}

void expect_attention(const Problem& pr, int n, int m) {
  const Expected e = expected(pr, n, m, true);
  std::vector<float> lse;
  const std::vector<float> out = dfss_attention(pr.qr(), pr.kr(), pr.vr(), pr.options(n, m), &lse);
  std::size_t worst = 0;
  EXPECT_LE(test::worst_element_excess(out, e.out, 1e-4, 1e-5, &worst), 1.0)
      << "element " << worst << ": " << out[worst] << " vs " << e.out[worst];
  ASSERT_EQ(lse.size(), static_cast<std::size_t>(pr.sq));
  for (int64_t i = 0; i < pr.sq; ++i) {
    if (e.lse[i] == -kInf)
      EXPECT_EQ(lse[i], -INFINITY) << "row " << i;
    else
      EXPECT_NEAR(lse[i], e.lse[i], 1e-5 * std::max(1.0, std::fabs(e.lse[i]))) << "row " << i;
  }
}

TEST(Dfss, ScoresMatchLoopAtOddLengths) {
  for (const auto& [n, m] : std::vector<std::pair<int, int>>{{2, 4}, {1, 2}, {3, 8}, {1, 4}}) {
    SCOPED_TRACE(std::to_string(n) + ":" + std::to_string(m));
    expect_scores(Problem(77, 77, 32, 16, 11), n, m);  // 77 % 4 = 1, 77 % 8 = 5: a tail group with K padding
    expect_scores(Problem(5, 13, 7, 3, 12), n, m);
  }
}

TEST(Dfss, AttentionMatchesLoop) {
  for (const auto& [n, m] : std::vector<std::pair<int, int>>{{2, 4}, {1, 2}, {3, 8}}) {
    SCOPED_TRACE(std::to_string(n) + ":" + std::to_string(m));
    expect_attention(Problem(77, 77, 64, 48, 21), n, m);
  }
}

TEST(Dfss, ThousandKeys) {
  const Problem pr(9, 1000, 64, 64, 31);
  expect_scores(pr, 2, 4);
  expect_attention(pr, 2, 4);
  expect_attention(pr, 1, 2);
  expect_attention(Problem(6, 1001, 32, 40, 32), 2, 4);  // one key in the last group
}

TEST(Dfss, TiesKeepTheLowerKey) {
  // d = 1, q = 1, scale 1: the scores are the keys themselves.
  Problem pr(1, 16, 1, 2, 41);
  pr.q = {1.0f}, pr.scale = 1.0f;
  pr.k = {0.5f,  0.5f,  0.5f,  0.5f,    // all equal: keys 0, 1
          0.1f,  0.7f,  0.7f,  0.7f,    // keys 5, 6
          0.9f,  0.2f,  0.9f,  0.9f,    // keys 8, 10
          -0.3f, -0.3f, -0.1f, -0.3f};  // keys 12, 14 (the larger, then the lower of the ties)
  const NmMatrix s = sddmm_nm(pr.qr(), pr.kr(), 1.0f, {}, 2, 4);
  std::vector<int64_t> cols;
  for (int64_t g = 0; g < s.groups(); ++g)
    for (int t = 0; t < 2; ++t) cols.push_back(s.column_of(0, g, t));
  EXPECT_EQ(cols, (std::vector<int64_t>{0, 1, 5, 6, 8, 10, 12, 14}));
  expect_scores(pr, 2, 4);
  // Identical keys everywhere: every group keeps its first N whatever the query.
  Problem same(7, 40, 8, 4, 42);
  for (int64_t j = 1; j < same.sk; ++j) std::copy_n(same.k.begin(), same.d, same.k.begin() + j * same.d);
  const NmMatrix t = sddmm_nm(same.qr(), same.kr(), same.scale, {}, 1, 2);
  for (int64_t i = 0; i < t.rows; ++i)
    for (int64_t g = 0; g < t.groups(); ++g) EXPECT_EQ(t.column_of(i, g, 0), 2 * g);
}

TEST(Dfss, Causal) {
  Problem pr(77, 77, 32, 16, 51);
  pr.causal = true;
  expect_scores(pr, 2, 4);
  expect_attention(pr, 2, 4);
  expect_attention(pr, 1, 2);
  // Row 0 attends to key 0 alone: exactly v's first row.
  const std::vector<float> out = dfss_attention(pr.qr(), pr.kr(), pr.vr(), pr.options(2, 4));
  for (int64_t c = 0; c < pr.dv; ++c) EXPECT_NEAR(out[c], pr.v[c], 1e-6);
  // Fewer queries than keys: still j > i masked.
  Problem wide(10, 50, 16, 8, 52);
  wide.causal = true;
  expect_attention(wide, 2, 4);
}

TEST(Dfss, KeyPadding) {
  Problem pr(33, 77, 32, 16, 61);
  std::mt19937 rng(7);
  pr.padding.resize(pr.sk);
  for (auto& p : pr.padding) p = std::bernoulli_distribution(0.35)(rng) ? 1 : 0;
  pr.padding[4] = pr.padding[5] = pr.padding[6] = pr.padding[7] = 1;  // a whole group of padding
  expect_scores(pr, 2, 4);
  expect_attention(pr, 2, 4);
  expect_attention(pr, 1, 2);
}

TEST(Dfss, AdditiveMask) {
  Problem pr(40, 77, 32, 16, 71);
  std::mt19937 rng(8);
  pr.additive.resize(pr.sq * pr.sk);
  for (auto& a : pr.additive)
    a = std::bernoulli_distribution(0.2)(rng) ? -INFINITY : std::uniform_real_distribution<float>(-2, 2)(rng);
  pr.causal = true;
  pr.padding.assign(pr.sk, 0);
  pr.padding[3] = pr.padding[60] = 1;
  expect_scores(pr, 2, 4);
  expect_attention(pr, 2, 4);
  expect_attention(pr, 3, 8);
}

TEST(Dfss, FullyMaskedRow) {
  Problem pr(12, 30, 16, 8, 81);
  pr.additive.assign(pr.sq * pr.sk, 0.0f);
  std::fill_n(pr.additive.begin() + 3 * pr.sk, pr.sk, -INFINITY);
  std::vector<float> lse;
  const NmMatrix p = softmax_nm(sddmm_nm(pr.qr(), pr.kr(), pr.scale, pr.options(2, 4).mask, 2, 4), &lse);
  EXPECT_EQ(lse[3], -INFINITY);
  for (int64_t vi = 3 * p.groups() * 2; vi < 4 * p.groups() * 2; ++vi) EXPECT_EQ(p.values.get(vi), 0.0f);
  const std::vector<float> out = dfss_attention(pr.qr(), pr.kr(), pr.vr(), pr.options(2, 4));
  for (int64_t c = 0; c < pr.dv; ++c) EXPECT_EQ(out[3 * pr.dv + c], 0.0f);
  const std::vector<float> dense = attention_reference(pr.qr(), pr.kr(), pr.vr(), pr.options(2, 4), &lse);
  for (int64_t c = 0; c < pr.dv; ++c) EXPECT_EQ(dense[3 * pr.dv + c], 0.0f);
  EXPECT_EQ(lse[3], -INFINITY);
  expect_attention(pr, 2, 4);
}

TEST(Dfss, SoftmaxRowsSumToOneAndLse) {
  Problem pr(20, 77, 32, 16, 91);
  pr.causal = true;
  for (const auto& [n, m] : std::vector<std::pair<int, int>>{{2, 4}, {1, 2}}) {
    const Expected e = expected(pr, n, m, true);
    const NmMatrix s = sddmm_nm(pr.qr(), pr.kr(), pr.scale, pr.options(n, m).mask, n, m);
    std::vector<float> lse;
    const NmMatrix p = softmax_nm(s, &lse);
    expect_pattern(
        p, pr, e, [&](int64_t i, int64_t c) { return e.p[i * pr.sk + c]; }, 1e-6);
    const int64_t per_row = p.groups() * n;
    for (int64_t i = 0; i < p.rows; ++i) {
      double sum = 0.0, sum_exp = 0.0;
      for (int64_t t = 0; t < per_row; ++t) {
        sum += p.values.get(i * per_row + t);
        const float sc = s.values.get(i * per_row + t);
        if (s.column_of(i, t / n, t % n) < pr.sk && std::isfinite(sc)) sum_exp += std::exp(double{sc});
      }
      EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << i;
      EXPECT_NEAR(lse[i], std::log(sum_exp), 1e-5 * std::max(1.0, std::fabs(std::log(sum_exp)))) << "row " << i;
    }
  }
}

// N = M is outside the format (N < M), so "nothing pruned" is checked where every group has at most N valid keys:
// the sparse path must then equal dense attention.
TEST(Dfss, NothingPrunedEqualsDense) {
  Problem pr(77, 77, 32, 24, 101);
  pr.padding.assign(pr.sk, 0);
  for (int64_t j = 3; j < pr.sk; j += 4) pr.padding[j] = 1;  // 3 valid keys per group of 4
  const DfssOptions o = pr.options(3, 4);
  std::vector<float> lse_sparse, lse_dense;
  const std::vector<float> sparse = dfss_attention(pr.qr(), pr.kr(), pr.vr(), o, &lse_sparse);
  const std::vector<float> dense = attention_reference(pr.qr(), pr.kr(), pr.vr(), o, &lse_dense);
  EXPECT_LE(test::worst_element_excess(sparse, dense, 1e-5, 1e-6), 1.0);
  for (int64_t i = 0; i < pr.sq; ++i) EXPECT_NEAR(lse_sparse[i], lse_dense[i], 1e-5);
  // The dense reference against the loops without pruning.
  const Expected e = expected(pr, 3, 4, false);
  EXPECT_LE(test::worst_element_excess(dense, e.out, 1e-5, 1e-6), 1.0);
  // Fewer keys than M: one group, all kept.
  const Problem small(7, 3, 16, 8, 102);
  EXPECT_LE(test::worst_element_excess(dfss_attention(small.qr(), small.kr(), small.vr(), small.options(3, 4)),
                                       attention_reference(small.qr(), small.kr(), small.vr(), small.options(3, 4)),
                                       1e-5, 1e-6),
            1.0);
}

TEST(Dfss, DenseReferenceMatchesLoop) {
  Problem pr(50, 77, 32, 16, 111);
  pr.causal = true;
  pr.padding.assign(pr.sk, 0);
  pr.padding[10] = 1;
  std::vector<float> lse;
  const std::vector<float> out = attention_reference(pr.qr(), pr.kr(), pr.vr(), pr.options(2, 4), &lse);
  const Expected e = expected(pr, 2, 4, false);
  EXPECT_LE(test::worst_element_excess(out, e.out, 1e-5, 1e-6), 1.0);
  for (int64_t i = 0; i < pr.sq; ++i) EXPECT_NEAR(lse[i], e.lse[i], 1e-5 * std::max(1.0, std::fabs(e.lse[i])));
}

TEST(Dfss, SpmmOfKnownP) {
  // P's values written by hand: O = P * V by the loop, the format decompressed independently.
  const Problem pr(5, 10, 4, 6, 121);
  const NmMatrix p = softmax_nm(sddmm_nm(pr.qr(), pr.kr(), pr.scale, {}, 1, 2));
  const DenseMatrix dp = decompress(p);
  const std::vector<float> out = spmm_nm_v(p, pr.vr());
  std::vector<float> want(pr.sq * pr.dv);
  for (int64_t i = 0; i < pr.sq; ++i)
    for (int64_t c = 0; c < pr.dv; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < pr.sk; ++j) acc += double{dp.at(i, j)} * pr.v[j * pr.dv + c];
      want[i * pr.dv + c] = static_cast<float>(acc);
    }
  EXPECT_LE(test::worst_element_excess(out, want, 1e-6, 1e-7), 1.0);
}

template <class Fn>
void expect_error(Fn&& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Dfss, BadInputsRefused) {
  const Problem pr(6, 10, 8, 4, 131);
  const Problem other(6, 10, 5, 4, 132);
  expect_error([&] { dfss_attention(pr.qr(), other.kr(), pr.vr(), pr.options(2, 4)); },
               "q is 6x8 and k is 10x5: their head dimensions d differ");
  const Problem fewer_v(6, 9, 8, 4, 133);
  expect_error([&] { dfss_attention(pr.qr(), pr.kr(), fewer_v.vr(), pr.options(2, 4)); },
               "v is 9x4 but k is 10x8: they need the same number of keys S_k");
  expect_error([&] { attention_reference(pr.qr(), pr.kr(), fewer_v.vr(), pr.options(2, 4)); }, "v is 9x4");
  expect_error([&] { spmm_nm_v(sddmm_nm(pr.qr(), pr.kr(), 1.0f, {}, 2, 4), fewer_v.vr()); },
               "P has S_k=10 columns but v is 9x4");
  const std::vector<uint8_t> padding(9, 0);
  AttentionMask mask;
  mask.key_padding = padding;
  expect_error([&] { sddmm_nm(pr.qr(), pr.kr(), 1.0f, mask, 2, 4); }, "key_padding has 9 entries, expected S_k=10");
  const std::vector<float> additive(59, 0.0f);
  mask = {};
  mask.additive = additive;
  expect_error([&] { sddmm_nm(pr.qr(), pr.kr(), 1.0f, mask, 2, 4); },
               "additive mask has 59 entries, expected S_q x S_k = 6x10");
  std::vector<float> nan_mask(60, 0.0f);
  nan_mask[13] = NAN;
  mask.additive = nan_mask;
  expect_error([&] { sddmm_nm(pr.qr(), pr.kr(), 1.0f, mask, 2, 4); }, "additive mask at query 1, key 3 is NaN");
  expect_error([&] { sddmm_nm(pr.qr(), pr.kr(), 1.0f, {}, 4, 4); }, "N:M needs 1 <= N < M, got 4:4");
  expect_error([&] { sddmm_nm(pr.qr(), pr.kr(), 1.0f, {}, 2, 64); }, "N:M needs 2 <= M <= 32, got M=64");
  Problem bad = pr;
  bad.q[2 * bad.d + 5] = NAN;
  expect_error([&] { sddmm_nm(bad.qr(), bad.kr(), 1.0f, {}, 2, 4); }, "attention: q row 2, column 5 is NaN");
  expect_error([&] { sddmm_nm(pr.qr(), pr.kr(), INFINITY, {}, 2, 4); }, "scale is not finite");
  const ConstMatrixRef col_major{pr.q.data(), pr.sq, pr.d, Layout::col_major};
  expect_error([&] { sddmm_nm(col_major, pr.kr(), 1.0f, {}, 2, 4); }, "q must be row-major");
}

// The GPU kernels' 2:4 rule (src/cuda/attention/keep_two_of_four.cuh, here compiled by the host compiler) against
// sddmm_nm on every group of four scores from {-inf, -1, 0, 0.5, 1, 2} (-inf by the additive mask): the same valid
// keys kept with the same scores; filler slots (fewer than two valid keys) hold -inf on both sides.
TEST(DfssRule, TheGpuRuleKeepsWhatTheOracleKeeps) {
  const float values[] = {-INFINITY, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
  const float q[] = {1.0f};
  int cases = 0;
  for (float x0 : values)
    for (float x1 : values)
      for (float x2 : values)
        for (float x3 : values) {
          const float x[4] = {x0, x1, x2, x3};
          float k[4];
          std::vector<float> additive(4);
          for (int i = 0; i < 4; ++i) {
            k[i] = std::isinf(x[i]) ? 0.0f : x[i];
            additive[i] = std::isinf(x[i]) ? -INFINITY : 0.0f;
          }
          const NmMatrix oracle = sddmm_nm({q, 1, 1}, {k, 4, 1}, 1.0f, {.additive = additive}, 2, 4);
          const cuda::attention::KeptPair kept = cuda::attention::keep_two_of_four(x0, x1, x2, x3);
          std::vector<std::pair<unsigned, float>> want, got;
          for (int slot = 0; slot < 2; ++slot) {
            if (const float v = oracle.values.get(slot); !std::isinf(v)) want.emplace_back(oracle.index(slot), v);
            const float v = slot == 0 ? kept.first : kept.second;
            if (!std::isinf(v))
              got.emplace_back((kept.nibble >> (2 * slot)) & 3u, v);
            else
              EXPECT_LT(v, 0.0f);
          }
          ASSERT_EQ(got, want) << "scores " << x0 << " " << x1 << " " << x2 << " " << x3;
          const unsigned i0 = kept.nibble & 3u, i1 = kept.nibble >> 2;
          EXPECT_LT(i0, i1) << "the metadata's indices must ascend";
          ++cases;
        }
  EXPECT_EQ(cases, 1296);
}

}  // namespace
}  // namespace nmkit
