// SparseLinear: one layer object per weight, every format, against the CPU oracle over poisoned outputs, with the
// plan cache exercised by several token counts (tails included) and its refusals.
#include "nmkit/gpu/sparse_linear.hpp"

#include <random>

#include "gpu_test_util.hpp"
#include "nmkit/error.hpp"
#include "nmkit/prune/magnitude.hpp"

namespace nmkit::gpu {
namespace {

SparseMatrix pruned(int64_t rows, int64_t cols, DType dtype, const char* format, uint32_t seed) {
  const DenseMatrix w = DenseMatrix::from_float(rows, cols, test::random_nonzero(rows * cols, seed), dtype);
  return prune_magnitude(w, parse_format_spec(format)).compressed;
}

TEST(SparseLinearGpu, EveryFormatAndTokenCountAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* format;
    int64_t rows, cols;
  };
  // Tails in R and K; V:N:M in both forms (64:2:8 packs full 2:4 and runs the 2:4 kernel over K; 128:2:8 and 64:2:10
  // gather, transposing x from 64 tokens on); tiles of both kernel families (few tokens: warp-stream; many: Hopper).
  const Case cases[] = {{"2:4", 1000, 520},        {"vnm:64:2:8", 384, 1024},      {"vnm:128:2:8", 384, 1024},
                        {"vnm:64:2:10", 300, 520}, {"tile:64x64:0.25", 512, 1024}, {"tile:32x32:0.5", 200, 96}};
  for (DType dtype : {DType::f16, DType::bf16})
    for (const Case& c : cases)
      for (Activation act : {Activation::none, Activation::gelu}) {
        const bool bias = act == Activation::gelu;
        const SparseMatrix w = pruned(c.rows, c.cols, dtype, c.format, 11);
        SparseLinear layer = SparseLinear::create(w, act, bias);
        EXPECT_EQ(layer.in_features(), c.cols);
        EXPECT_EQ(layer.out_features(), c.rows);
        EXPECT_EQ(layer.format(), format_name(w));
        // 33 twice: the cached plan; 17, 33 and 300 run their buckets' plans (20, 40, 320) with fewer tokens;
        // condensed V:N:M from 64 tokens transposes x (300: 296 tokens so, the last 4 from x).
        for (int64_t tokens : {1, 17, 33, 64, 300, 512, 33}) {
          const std::string kernel = layer.kernel(tokens);
          const bool gathers = std::string(c.format) == "vnm:128:2:8" || std::string(c.format) == "vnm:64:2:10";
          EXPECT_EQ(kernel.starts_with("x transposed"), gathers && tokens >= 64) << c.format << " " << kernel;
          // y[T, R] = x[T, K] W^T: the oracle's B is x as a col-major K x T matrix, D y as a col-major R x T one.
          const Problem t{c.rows, c.cols, tokens, dtype, dtype, Layout::col_major, Layout::col_major,
                          1.0f,   0.0f,   bias,   act};
          const double err = error_against_oracle(w, t, 5, [&](const void* x, const void*, void* y, const float* b) {
            layer.run(nullptr, x, y, tokens, bias ? b : nullptr);
          });
          EXPECT_LE(err, tolerance(dtype)) << c.format << " " << describe(t) << " (" << layer.kernel(tokens) << ")";
        }
      }
}

TEST(SparseLinearGpu, AnyTokenCountTakesABoundedNumberOfPlans) {
  SKIP_WITHOUT_GPU();
  // A serving loop: 1000 token counts drawn from 1..4096 plan once per bucket (48 buckets; a condensed V:N:M
  // weight has buckets of x as it is and of x transposed), not once per count.
  for (const char* format : {"2:4", "vnm:128:2:8", "vnm:64:2:10"}) {
    SparseLinear layer = SparseLinear::create(pruned(256, 512, DType::f16, format, 3));
    std::mt19937 random(7);
    std::uniform_int_distribution<int64_t> tokens(1, 4096);
    for (int i = 0; i < 1000; ++i) EXPECT_FALSE(layer.kernel(tokens(random)).empty());
    EXPECT_LE(layer.plans(), 64u) << format;
  }
}

TEST(SparseLinearGpu, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
  EXPECT_THROW(SparseLinear::create(pruned(64, 64, DType::f16, "2:8", 1)), Error);  // N:M other than 2:4
  EXPECT_THROW(SparseLinear::create(pruned(64, 64, DType::f32, "2:4", 1)), Error);  // fp32 values
  SparseLinear layer = SparseLinear::create(pruned(128, 64, DType::f16, "2:4", 1), Activation::none, /*bias=*/true);
  DeviceBytes x(64 * 8 * 2), y(128 * 8 * 2), bias(128 * 4);
  EXPECT_THROW(layer.run(nullptr, x.ptr, y.ptr, 8, nullptr), Error);  // the layer has a bias
  EXPECT_THROW(layer.run(nullptr, nullptr, y.ptr, 8, static_cast<const float*>(bias.ptr)), Error);
  EXPECT_THROW(layer.run(nullptr, x.ptr, y.ptr, -1, static_cast<const float*>(bias.ptr)), Error);
  EXPECT_NO_THROW(layer.run(nullptr, nullptr, nullptr, 0, nullptr));  // an empty batch launches nothing
}

}  // namespace
}  // namespace nmkit::gpu
