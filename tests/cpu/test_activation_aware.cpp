// Wanda and OBS on small synthetic layers: patterns hold, the reconstruction error ranks as it must,
// and the degenerate cases reduce to magnitude pruning.
#include <gtest/gtest.h>

#include <random>

#include "nmkit/error.hpp"
#include "nmkit/prune/activation_aware.hpp"
#include "nmkit/prune/prune_model.hpp"
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
  ScoreMatrix squared = ScoreMatrix::magnitude(w);
  for (float& x : squared.values) x *= x;
  for (const char* format : {"2:4", "vnm:8:2:10"}) {
    const FormatSpec spec = parse_format_spec(format);
    const PruneResult mag = prune_magnitude(w, spec), obs = prune_obs(w, identity, spec), wanda = prune_wanda(w, identity, spec);
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
  const std::map<std::string, LayerStatistics> stats;
  options.statistics = &stats;
  EXPECT_NMKIT_ERROR(prune_model(model, options), ErrorCode::invalid_argument, "'layer.weight'");
}

}  // namespace
}  // namespace nmkit
