// Wanda and OBS on small synthetic layers: patterns hold, the reconstruction error ranks as it must,
// and the degenerate cases reduce to magnitude pruning.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "nmkit/error.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/obs.hpp"
#include "nmkit/prune/prune_model.hpp"
#include "nmkit/prune/wanda.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

// Correlated inputs: x = z A with a random mixing matrix, so that H = X^T X is far from diagonal.
LayerStatistics correlated_stats(int64_t k, int64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> mix(static_cast<std::size_t>(k * k));
  for (auto& x : mix) x = normal(rng);
  LayerStatistics s{k, tokens, std::vector<double>(static_cast<std::size_t>(k * k), 0.0)};
  std::vector<double> z(static_cast<std::size_t>(k)), x(static_cast<std::size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    for (auto& e : z) e = normal(rng);
    for (int64_t j = 0; j < k; ++j) {
      x[j] = 0.0;
      for (int64_t i = 0; i < k; ++i) x[j] += z[i] * mix[i * k + j] * (i == j ? 3.0 : 0.3);
    }
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) s.xtx[i * k + j] += x[i] * x[j];
  }
  return s;
}

// ||(W - W') X^T||_F^2 / ||W X^T||_F^2 = tr(D H D^T) / tr(W H W^T).
double output_error(const DenseMatrix& w, const DenseMatrix& pruned, const LayerStatistics& s) {
  const int64_t k = w.cols;
  double num = 0.0, den = 0.0;
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const double h = s.xtx[i * k + j];
        num += (w.at(r, i) - pruned.at(r, i)) * h * (w.at(r, j) - pruned.at(r, j));
        den += w.at(r, i) * h * w.at(r, j);
      }
  return num / den;
}

TEST(ActivationAware, ObsBeatsWandaBeatsMagnitudeOnCorrelatedInputs) {
  const DenseMatrix w = test::random_matrix(48, 64, DType::f32, 3);
  const LayerStatistics s = correlated_stats(64, 400, 4);
  for (const char* format : {"2:4", "vnm:16:2:8", "tile:8x8:0.5"}) {
    const FormatSpec spec = parse_format_spec(format);
    const double e_mag = output_error(w, decompress(prune_magnitude(w, spec).compressed), s);
    const double e_wanda = output_error(w, decompress(prune_wanda(w, s, spec).compressed), s);
    const PruneResult obs = prune_obs(w, s, spec);
    const double e_obs = output_error(w, decompress(obs.compressed), s);
    EXPECT_LT(e_obs, e_wanda) << format;
    EXPECT_LE(e_wanda, e_mag * 1.05) << format;
    EXPECT_NO_THROW(validate(obs.compressed));
    // The compressed weight holds exactly the mask's entries.
    const DenseMatrix d = decompress(obs.compressed);
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c = 0; c < w.cols; ++c)
        if (!obs.mask.at(r, c)) ASSERT_EQ(d.at(r, c), 0.0f) << format << " at " << r << "," << c;
  }
}

TEST(ActivationAware, UncorrelatedUnitInputsReduceToMagnitude) {
  // H = I: no error propagates between columns and every saliency is proportional to w^2.
  const DenseMatrix w = test::random_matrix(32, 40, DType::f32, 5);
  LayerStatistics identity{40, 1, std::vector<double>(40 * 40, 0.0)};
  for (int j = 0; j < 40; ++j) identity.xtx[j * 40 + j] = 1.0;
  ScoreMatrix squared = magnitude_scores(w);
  for (float& x : squared.values) x *= x;
  for (const char* format : {"2:4", "vnm:8:2:10"}) {
    const FormatSpec spec = parse_format_spec(format);
    const PruneResult mag = prune_magnitude(w, spec), obs = prune_obs(w, identity, spec),
                      wanda = prune_wanda(w, identity, spec);
    EXPECT_EQ(wanda.mask.keep, mag.mask.keep) << format;
    // OBS sums the saliency w^2 over a block's rows when it chooses V:N:M columns: magnitude, squared.
    const PruneResult mag2 = prune_by_score(w, squared, spec);
    EXPECT_EQ(obs.mask.keep, mag2.mask.keep) << format;
    test::expect_same_matrix(decompress(obs.compressed), decompress(mag2.compressed));
  }
}

TEST(ActivationAware, RejectsStatisticsThatDoNotFit) {
  const DenseMatrix w = test::random_matrix(8, 16, DType::f32, 6);
  const LayerStatistics wrong{12, 10, std::vector<double>(144, 1.0)};
  EXPECT_NMKIT_ERROR(prune_obs(w, wrong, parse_format_spec("2:4")), ErrorCode::invalid_argument, "16 columns");
  EXPECT_NMKIT_ERROR(prune_wanda(w, wrong, parse_format_spec("2:4")), ErrorCode::invalid_argument, "input features");
  const LayerStatistics empty{16, 0, std::vector<double>(256, 0.0)};
  EXPECT_NMKIT_ERROR(prune_obs(w, empty, parse_format_spec("2:4")), ErrorCode::invalid_argument, "0 tokens");
  EXPECT_NMKIT_ERROR(parse_prune_method("sparsegpt"), ErrorCode::invalid_argument, "unknown pruning method");

  ModelFile model;
  model.weights.push_back({"layer.weight", to_tensor("layer.weight", w)});
  ModelPruneOptions options;
  options.method = PruneMethod::obs;
  EXPECT_NMKIT_ERROR(prune_model(model, options), ErrorCode::invalid_argument, "needs calibration statistics");
}

TEST(ActivationAware, WeightsWithoutStatisticsAreKeptDenseAndListed) {
  // BERT's pooler is a linear layer the calibration forward never runs: OBS keeps it dense and says so.
  const DenseMatrix w = test::random_matrix(8, 16, DType::f32, 6);
  ModelFile model;
  model.weights.push_back({"encoder.dense.weight", to_tensor("encoder.dense.weight", w)});
  model.weights.push_back({"pooler.dense.weight", to_tensor("pooler.dense.weight", w)});
  std::map<std::string, LayerStatistics> stats;
  stats["encoder.dense.weight"] = correlated_stats(16, 100, 7);
  ModelPruneOptions options;
  options.method = PruneMethod::obs;
  options.statistics = &stats;
  const ModelPruneReport report = prune_model(model, options);
  EXPECT_EQ(report.pruned_count, 1);
  EXPECT_EQ(report.skipped, std::vector<std::string>{"pooler.dense.weight"});
  EXPECT_TRUE(std::holds_alternative<SparseMatrix>(model.weights[0].weight));
  EXPECT_TRUE(std::holds_alternative<StTensor>(model.weights[1].weight));
}

// prune_model_in_stages: each stage's statistics are collected on the model with the stages before it pruned; a
// selected weight of no stage is a last stage; with statistics that do not depend on the model, the result is the
// one-shot prune_model's.
TEST(ActivationAware, StagesAreCalibratedOnTheModelAsItStands) {
  const auto make = [] {
    ModelFile model;
    for (const char* name :
         {"layer.0.a.weight", "layer.0.b.weight", "embeddings.weight", "layer.1.a.weight", "pooler.weight"})
      model.weights.push_back({name, to_tensor(name, test::random_matrix(8, 16, DType::f32, name[6] + name[8]))});
    return model;
  };
  std::map<std::string, LayerStatistics> stats;
  uint32_t seed = 40;
  for (const char* name : {"layer.0.a.weight", "layer.0.b.weight", "layer.1.a.weight"})
    stats[name] = correlated_stats(16, 100, seed++);
  const std::vector<std::vector<std::string>> stages{{"layer.0.a.weight", "layer.0.b.weight"}, {"layer.1.a.weight"}};
  ModelPruneOptions options;
  options.method = PruneMethod::obs;

  ModelFile model = make();
  std::vector<std::vector<std::string>> compressed_at_call;
  const auto collect = [&](const ModelFile& current) {
    std::vector<std::string> compressed;
    for (const NamedWeight& w : current.weights)
      if (std::holds_alternative<SparseMatrix>(w.weight)) compressed.push_back(w.name);
    compressed_at_call.push_back(compressed);
    return stats;
  };
  const ModelPruneReport report = prune_model_in_stages(model, options, stages, collect);
  const std::vector<std::vector<std::string>> want_calls{
      {}, {"layer.0.a.weight", "layer.0.b.weight"}, {"layer.0.a.weight", "layer.0.b.weight", "layer.1.a.weight"}};
  EXPECT_EQ(compressed_at_call, want_calls);  // the pooler's pass comes last, and finds no statistics for it
  EXPECT_EQ(report.pruned_count, 3);
  EXPECT_EQ(report.skipped, std::vector<std::string>{"pooler.weight"});
  ASSERT_EQ(report.tensors.size(), model.weights.size());
  std::size_t after = 0;
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    EXPECT_EQ(report.tensors[i].name, model.weights[i].name);
    EXPECT_EQ(report.tensors[i].pruned, std::holds_alternative<SparseMatrix>(model.weights[i].weight));
    after += report.tensors[i].bytes_after;
  }
  EXPECT_EQ(report.bytes_after, after);

  ModelFile one_shot = make();
  options.statistics = &stats;
  const ModelPruneReport once = prune_model(one_shot, options);
  EXPECT_DOUBLE_EQ(report.energy.ratio(), once.energy.ratio());
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const auto* a = std::get_if<SparseMatrix>(&model.weights[i].weight);
    const auto* b = std::get_if<SparseMatrix>(&one_shot.weights[i].weight);
    ASSERT_EQ(a != nullptr, b != nullptr) << model.weights[i].name;
    if (!a) continue;
    const DenseMatrix da = decompress(*a), db = decompress(*b);
    for (int64_t r = 0; r < da.rows; ++r)
      for (int64_t c = 0; c < da.cols; ++c) ASSERT_EQ(da.at(r, c), db.at(r, c)) << model.weights[i].name;
  }
  EXPECT_NMKIT_ERROR(prune_model_in_stages(model, options, stages, {}), ErrorCode::invalid_argument, "collector");
}

}  // namespace
}  // namespace nmkit

namespace nmkit {
namespace {

TEST(ObsCandidates, SaliencyOfSmallSetsMatchesTheFormula) {
  // A 3 x 3 inverse Hessian and one row: rho_Q = 1/2 w_Q^T (Hinv_QQ)^-1 w_Q computed by hand.
  const std::vector<double> h{2.0, 0.5, 0.2, 0.5, 1.0, 0.3, 0.2, 0.3, 1.5};
  const std::vector<double> w{1.0, -2.0, 0.5};
  EXPECT_NEAR(group_saliency(h, 3, w, {1}, ObsCandidates::combinatorial), 0.5 * 4.0 / 1.0, 1e-12);
  const double det = 2.0 * 1.0 - 0.5 * 0.5;  // Q = {0, 1}
  const double want = 0.5 * (1.0 * 1.0 * 1.0 - 2 * 1.0 * -2.0 * 0.5 + 4.0 * 2.0) / det;
  EXPECT_NEAR(group_saliency(h, 3, w, {0, 1}, ObsCandidates::combinatorial), want, 1e-12);
  EXPECT_NEAR(group_saliency(h, 3, w, {0, 1}, ObsCandidates::pairwise), want, 1e-12);  // exact for pairs
  EXPECT_NEAR(group_saliency(h, 3, w, {0, 1}, ObsCandidates::diagonal), 0.5 * (1.0 / 2.0 + 4.0 / 1.0), 1e-12);
}

// (H + 0.01 mean(diag H) I) restricted to the columns first.. and inverted by Gauss-Jordan: the inverse Hessian
// of the columns OBS has not yet made final (row-major, (k - first)^2).
std::vector<double> trailing_inverse(const LayerStatistics& s, int64_t first) {
  const int64_t k = s.in_features, n = k - first;
  double mean = 0.0;
  for (int64_t j = 0; j < k; ++j) mean += s.xtx[j * k + j] / k;
  std::vector<double> a(static_cast<std::size_t>(n * n)), inv(static_cast<std::size_t>(n * n), 0.0);
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t q = 0; q < n; ++q) a[p * n + q] = s.xtx[(first + p) * k + first + q];
    a[p * n + p] += 0.01 * mean;
    inv[p * n + p] = 1.0;
  }
  for (int64_t c = 0; c < n; ++c) {
    const double pivot = a[c * n + c];
    for (int64_t q = 0; q < n; ++q) a[c * n + q] /= pivot, inv[c * n + q] /= pivot;
    for (int64_t p = 0; p < n; ++p)
      if (p != c) {
        const double f = a[p * n + c];
        for (int64_t q = 0; q < n; ++q) a[p * n + q] -= f * a[c * n + q], inv[p * n + q] -= f * inv[c * n + q];
      }
  }
  return inv;
}

// The leading width x width block of the full inverse: the first group's inverse Hessian.
std::vector<double> leading_inverse_block(const LayerStatistics& s, int width) {
  const int64_t k = s.in_features;
  const std::vector<double> inv = trailing_inverse(s, 0);
  std::vector<double> g(static_cast<std::size_t>(width * width));
  for (int i = 0; i < width; ++i)
    for (int j = 0; j < width; ++j) g[i * width + j] = inv[i * k + j];
  return g;
}

// The sweep against the algorithm written plainly: column by column, the inverse of the damped Hessian of the
// columns not yet final computed afresh by Gauss-Jordan (no Cholesky factor, no lazy blocks), each pruned weight's
// error w_i / G_ii spread as -e G_ij over the columns right of it. The mask is forced by `allowed` (two columns per
// group), so only the update is compared; lazy blocks of 4 and 8 columns cross the groups.
TEST(ObsCandidates, SweepMatchesColumnByColumnObsWithExplicitInverses) {
  constexpr int64_t kRows = 5, kCols = 16;
  const DenseMatrix w = test::random_matrix(kRows, kCols, DType::f32, 31);
  const LayerStatistics s = correlated_stats(kCols, 64, 32);
  Mask allowed = Mask::none(kRows, kCols);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t g = 0; g < kCols; g += 4)
      for (int64_t j : {(r + g / 4) % 4, (r + g / 4 + 1 + r % 3) % 4}) allowed.set(r, g + j, true);  // 2 distinct

  std::vector<double> want(static_cast<std::size_t>(kRows * kCols));
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) want[r * kCols + c] = w.at(r, c);
  for (int64_t i = 0; i < kCols; ++i) {
    const int64_t n = kCols - i;
    const std::vector<double> g = trailing_inverse(s, i);
    for (int64_t r = 0; r < kRows; ++r) {
      if (allowed.at(r, i)) continue;
      const double e = want[r * kCols + i] / g[0];
      for (int64_t q = 1; q < n; ++q) want[r * kCols + i + q] -= e * g[q];
      want[r * kCols + i] = 0.0;
    }
  }

  for (int block_cols : {4, 8, 128}) {
    ObsOptions options;
    options.allowed = &allowed;
    options.block_cols = block_cols;
    const ObsSweep sweep = obs_sweep(w, s, parse_format_spec("2:4"), options);
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kCols; ++c) {
        ASSERT_EQ(sweep.mask.at(r, c), allowed.at(r, c)) << "row " << r << " column " << c;
        EXPECT_NEAR(sweep.weight.at(r, c), want[r * kCols + c], 1e-5 * (1.0 + std::fabs(want[r * kCols + c])))
            << "lazy block " << block_cols << ", row " << r << " column " << c;
      }
  }
}

// Brute force: for each row the kept pair of a 2:4 group that minimises the exact saliency.
TEST(ObsCandidates, CombinatorialChoiceIsTheBestSetForTheFirstGroup) {
  const DenseMatrix w = test::random_matrix(24, 16, DType::f32, 21);
  std::mt19937 rng(22);
  std::normal_distribution<double> normal;
  LayerStatistics s{16, 64, std::vector<double>(256, 0.0)};
  for (int t = 0; t < 64; ++t) {
    std::vector<double> x(16);
    const double shared = normal(rng);
    for (auto& e : x) e = normal(rng) + 1.5 * shared;  // strongly correlated columns
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) s.xtx[i * 16 + j] += x[i] * x[j];
  }
  ObsOptions options;
  options.candidates = ObsCandidates::combinatorial;
  const ObsSweep sweep = obs_sweep(w, s, parse_format_spec("2:4"), options);
  // The first group is decided on the original weights with the full inverse Hessian.
  const std::vector<double> g = leading_inverse_block(s, 4);
  for (int64_t r = 0; r < w.rows; ++r) {
    const std::vector<double> wg{w.at(r, 0), w.at(r, 1), w.at(r, 2), w.at(r, 3)};
    double best = 1e300;
    std::pair<int, int> best_pair;
    for (int a0 = 0; a0 < 4; ++a0)
      for (int a1 = a0 + 1; a1 < 4; ++a1) {
        std::vector<int> pruned;
        for (int j = 0; j < 4; ++j)
          if (j != a0 && j != a1) pruned.push_back(j);
        const double rho = group_saliency(g, 4, wg, pruned, ObsCandidates::combinatorial);
        if (rho < best) best = rho, best_pair = {a0, a1};
      }
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(sweep.mask.at(r, j), j == best_pair.first || j == best_pair.second) << "row " << r << " column " << j;
  }
}

TEST(ObsCandidates, VnmColumnsAreTheBestSetForTheFirstGroup) {
  // One 6-row block, M = 6: the 4 columns and each row's pair must minimise the summed exact saliency.
  const DenseMatrix w = test::random_matrix(6, 12, DType::f32, 31);
  const LayerStatistics s = correlated_stats(12, 200, 32);
  ObsOptions options;
  options.candidates = ObsCandidates::combinatorial;
  const ObsSweep sweep = obs_sweep(w, s, parse_format_spec("vnm:6:2:6"), options);
  const std::vector<double> g = leading_inverse_block(s, 6);
  double best = 1e300;
  for (uint32_t columns = 0; columns < 64; ++columns) {
    if (std::popcount(columns) != 4) continue;
    double cost = 0.0;
    for (int64_t r = 0; r < 6; ++r) {
      std::vector<double> wg(6);
      for (int j = 0; j < 6; ++j) wg[j] = w.at(r, j);
      double row_best = 1e300;
      for (int a = 0; a < 6; ++a)
        for (int b = a + 1; b < 6; ++b) {
          if (!((columns >> a) & 1u) || !((columns >> b) & 1u)) continue;
          std::vector<int> pruned;
          for (int j = 0; j < 6; ++j)
            if (j != a && j != b) pruned.push_back(j);
          row_best = std::min(row_best, group_saliency(g, 6, wg, pruned, ObsCandidates::combinatorial));
        }
      cost += row_best;
    }
    best = std::min(best, cost);
  }
  double chosen = 0.0;  // the saliency of what the sweep pruned in the first group
  for (int64_t r = 0; r < 6; ++r) {
    std::vector<double> wg(6);
    std::vector<int> pruned;
    for (int j = 0; j < 6; ++j) {
      wg[j] = w.at(r, j);
      if (!sweep.mask.at(r, j)) pruned.push_back(j);
    }
    ASSERT_EQ(pruned.size(), 4u);
    chosen += group_saliency(g, 6, wg, pruned, ObsCandidates::combinatorial);
  }
  EXPECT_NEAR(chosen, best, 1e-9 * best);
}

TEST(ObsCandidates, RejectsSetsTooLargeToEnumerate) {
  const DenseMatrix w = test::random_matrix(8, 40, DType::f32, 23);
  LayerStatistics s{40, 10, std::vector<double>(1600, 0.0)};
  for (int j = 0; j < 40; ++j) s.xtx[j * 40 + j] = 1.0;
  ObsOptions options;
  options.candidates = ObsCandidates::combinatorial;
  EXPECT_NMKIT_ERROR(prune_obs(w, s, parse_format_spec("vnm:8:2:20"), options), ErrorCode::unsupported, "use pairwise");
  options.candidates = ObsCandidates::pairwise;
  EXPECT_NO_THROW(prune_obs(w, s, parse_format_spec("vnm:8:2:20"), options));
  EXPECT_NMKIT_ERROR(parse_obs_candidates("triples"), ErrorCode::invalid_argument, "candidate set");
}

}  // namespace
}  // namespace nmkit
