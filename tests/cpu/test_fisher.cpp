// OBS with an empirical Fisher: the Woodbury inverse, the loss it minimises, and bad gradient files.
#include <gtest/gtest.h>

#include <random>

#include "nmkit/error.hpp"
#include "nmkit/prune/fisher.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

GradientSamples random_gradients(int64_t m, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  GradientSamples g{m, rows, cols, std::vector<float>(static_cast<std::size_t>(m * rows * cols))};
  std::vector<float> shared(static_cast<std::size_t>(m * cols));
  for (auto& x : shared) x = normal(rng);
  for (int64_t s = 0; s < m; ++s)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        g.values[(s * rows + r) * cols + c] = normal(rng) + 2.0f * shared[s * cols + c];
  return g;
}

TEST(Fisher, WoodburyInverseMatchesTheDirectInverse) {
  const int m = 20, b = 6;
  const double damp = 0.1;
  const std::vector<float> g = test::random_nonzero(m * b, 3);
  const std::vector<double> inv = fisher_inverse(g.data(), b, m, b, damp);
  std::vector<double> f(b * b, 0.0);
  for (int i = 0; i < b; ++i) f[i * b + i] = damp;
  for (int s = 0; s < m; ++s)
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < b; ++j) f[i * b + j] += double{g[s * b + i]} * g[s * b + j] / m;
  for (int i = 0; i < b; ++i)  // F * F^-1 = I
    for (int j = 0; j < b; ++j) {
      double v = 0.0;
      for (int k = 0; k < b; ++k) v += f[i * b + k] * inv[k * b + j];
      EXPECT_NEAR(v, i == j ? 1.0 : 0.0, 1e-9) << i << "," << j;
    }
}

// 1/2 dW^T F dW summed over the row-blocks: the loss increase the Fisher OBS minimises.
double fisher_loss(const DenseMatrix& before, const DenseMatrix& after, const GradientSamples& g, int block,
                   double damp) {
  double loss = 0.0;
  for (int64_t r = 0; r < before.rows; ++r)
    for (int64_t b0 = 0; b0 < before.cols; b0 += block) {
      std::vector<double> d(static_cast<std::size_t>(block));
      for (int j = 0; j < block; ++j) d[j] = double{after.at(r, b0 + j)} - before.at(r, b0 + j);
      double quad = 0.0;
      for (int j = 0; j < block; ++j) quad += damp * d[j] * d[j];
      for (int64_t s = 0; s < g.samples; ++s) {
        double dot = 0.0;
        for (int j = 0; j < block; ++j) dot += d[j] * g.values[(s * g.rows + r) * g.cols + b0 + j];
        quad += dot * dot / g.samples;
      }
      loss += 0.5 * quad;
    }
  return loss;
}

TEST(Fisher, ObsLowersTheFisherLossBelowMagnitude) {
  const DenseMatrix w = test::random_matrix(16, 32, DType::f32, 5);
  const GradientSamples g = random_gradients(24, 16, 32, 6);
  FisherOptions options;
  options.block = 16;
  options.damp = 1e-3;
  for (const char* format : {"2:4", "vnm:8:2:8", "tile:4x8:0.5"}) {
    const FormatSpec spec = parse_format_spec(format);
    const PruneResult obs = prune_obs_fisher(w, g, spec, options);
    EXPECT_NO_THROW(validate(obs.compressed));
    const DenseMatrix pruned = decompress(obs.compressed);
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c = 0; c < w.cols; ++c)
        if (!obs.mask.at(r, c)) ASSERT_EQ(pruned.at(r, c), 0.0f);
    const double l_obs = fisher_loss(w, pruned, g, 16, options.damp);
    const double l_mag = fisher_loss(w, decompress(prune_magnitude(w, spec).compressed), g, 16, options.damp);
    EXPECT_LT(l_obs, l_mag) << format;
  }
}

TEST(Fisher, RejectsGradientsThatDoNotFit) {
  SafetensorsFile file;
  file.tensors.push_back({"w", StDType::F32, {4, 8, 16}, std::vector<std::byte>(4 * 8 * 16 * 4)});
  EXPECT_NO_THROW(read_gradients(file, "w", 8, 16));
  EXPECT_NMKIT_ERROR(read_gradients(file, "v", 8, 16), ErrorCode::io_error, "no tensor 'v'");
  EXPECT_NMKIT_ERROR(read_gradients(file, "w", 8, 32), ErrorCode::io_error, "[samples, 8, 32]");
  const DenseMatrix w = test::random_matrix(8, 16, DType::f32, 7);
  FisherOptions options;
  options.block = 6;
  EXPECT_NMKIT_ERROR(prune_obs_fisher(w, random_gradients(4, 8, 16, 8), parse_format_spec("2:4"), options),
                     ErrorCode::invalid_argument, "multiple of the group width");
  EXPECT_NMKIT_ERROR(prune_obs_fisher(w, random_gradients(4, 8, 8, 8), parse_format_spec("2:4")),
                     ErrorCode::invalid_argument, "do not match");
}

}  // namespace
}  // namespace nmkit
