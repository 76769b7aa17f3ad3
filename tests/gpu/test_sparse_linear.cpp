// SparseLinear: one layer object per weight, every format, against the CPU oracle over poisoned outputs, with the
// plan cache exercised by several token counts (tails included) and its refusals; 8-bit 2:4 weights against the
// quantized oracle (cpu/quantized_spmm.hpp) on x quantized per token, and their refusals (on the CPU where they
// need no device); and the transpose behind the V:N:M row gather.
#include "nmkit/gpu/sparse_linear.hpp"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "nmkit/cpu/quantized_spmm.hpp"
#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_8bit_spmm.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "../../src/cuda/transpose.hpp"

namespace nmkit::gpu {
namespace {

SparseMatrix pruned(int64_t rows, int64_t cols, DType dtype, const char* format, uint32_t seed) {
  const DenseMatrix w = DenseMatrix::from_float(rows, cols, test::random_nonzero(rows * cols, seed), dtype);
  return prune_magnitude(w, parse_format_spec(format)).compressed;
}

// M of a "vnm:V:2:M" format.
int gathers_m(const std::string& format) { return std::stoi(format.substr(format.rfind(':') + 1)); }

TEST(SparseLinearGpu, EveryFormatAndTokenCountAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* format;
    int64_t rows, cols;
  };
  // Tails in R and K; V:N:M in both forms (64:2:8 packs full 2:4 and runs the 2:4 kernel over K; 128:2:8 and 64:2:10
  // gather from x transposed, its rows padded to a multiple of 8 tokens, or at decode sizes on Hopper from x in
  // place by the skinny kernel); tiles of both kernel families (few tokens: warp-stream; many: Hopper).
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
        // condensed V:N:M transposes x into rows of 8 tokens at 1, 24 at 17, 40 at 33 and 304 at 300.
        for (int64_t tokens : {1, 5, 16, 17, 33, 64, 300, 512, 33}) {
          const std::string kernel = layer.kernel(tokens);
          const bool gathers = std::string(c.format) == "vnm:128:2:8" || std::string(c.format) == "vnm:64:2:10";
          const bool skinny = gathers && VnmSpmmPlan::takes_skinny_kernel(c.rows, c.cols, gathers_m(c.format), tokens,
                                                                          Layout::row_major);
          EXPECT_EQ(kernel.starts_with("x transposed"), gathers && !skinny) << c.format << " " << kernel;
          EXPECT_EQ(kernel.find("padded") != std::string::npos, gathers && !skinny && tokens % 8 != 0)
              << c.format << " " << kernel;
          EXPECT_EQ(kernel.find("condensed sm80_mma_sp_skinny") != std::string::npos, skinny)
              << c.format << " " << kernel;
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
  // A serving loop: 1000 token counts drawn from 1..4096 plan once per bucket (48 buckets), not once per count; tiles
  // plan per count but hold at most one plan per stream-kernel count (1..32) and y layout, and 32 of the others.
  for (const char* format : {"2:4", "vnm:128:2:8", "vnm:64:2:10", "tile:64x64:0.25"}) {
    SparseLinear layer = SparseLinear::create(pruned(256, 512, DType::f16, format, 3));
    std::mt19937 random(7);
    std::uniform_int_distribution<int64_t> tokens(1, 4096);
    for (int i = 0; i < 1000; ++i) EXPECT_FALSE(layer.kernel(tokens(random)).empty());
    EXPECT_LE(layer.plans(), 64u) << format;
  }
}

// Tile plans are made per token count: the stream kernels' counts (1..32) keep theirs, with their workspaces; of
// the others the 32 least recently used are kept, and a dropped count that comes back is planned again and agrees
// with the oracle.
TEST(SparseLinearGpu, TilePlansStayBoundedAndARemadePlanAgrees) {
  SKIP_WITHOUT_GPU();
  const SparseMatrix w = pruned(512, 1024, DType::f16, "tile:64x64:0.25", 13);
  SparseLinear layer = SparseLinear::create(w);
  constexpr int64_t kStreamTokens = 32;  // counts whose plans hold a workspace
  constexpr std::size_t kKept = 32;      // SparseLinear's tile plans without one
  for (int64_t tokens = 1; tokens <= kStreamTokens; ++tokens) EXPECT_FALSE(layer.kernel(tokens).empty());
  const std::size_t with_workspace = layer.plans();
  EXPECT_EQ(with_workspace, std::size_t{kStreamTokens});
  for (int64_t tokens = kStreamTokens + 1; tokens <= kStreamTokens + 3 * int64_t{kKept}; ++tokens) {
    EXPECT_FALSE(layer.kernel(tokens).empty());
    EXPECT_FALSE(layer.kernel(kStreamTokens + 1).empty());  // used again each time: never the one dropped
  }
  EXPECT_EQ(layer.plans(), with_workspace + kKept);
  EXPECT_FALSE(layer.kernel(1).empty());
  EXPECT_EQ(layer.plans(), with_workspace + kKept);
  // 34 was dropped long ago; 33, kept by its use, runs from its plan.
  for (int64_t tokens : {kStreamTokens + 2, kStreamTokens + 1}) {
    const Problem t{512,  1024, tokens, DType::f16,      DType::f16, Layout::col_major, Layout::col_major,
                    1.0f, 0.0f, false,  Activation::none};
    const double err = error_against_oracle(
        w, t, 17, [&](const void* x, const void*, void* y, const float*) { layer.run(nullptr, x, y, t.c); });
    EXPECT_LE(err, tolerance(t.dtype)) << tokens << " tokens: " << layer.kernel(t.c);
    EXPECT_EQ(layer.plans(), with_workspace + kKept);
  }
}

TEST(SparseLinearGpu, FeatureMajorActivationsAgreeWithTheOracle) {
  SKIP_WITHOUT_GPU();
  // Feature-major x: the row gather (vnm:128:2:8, 64:2:10) reads x^T in place (ldx a multiple of 8, or past the
  // tokens with NaN in the gap) or repadded in the workspace (ldx % 8 != 0), the skinny kernel (decode sizes, on
  // Hopper) in place at any ldx; 2:4, full-2:4 V:N:M (64:2:8) and tiles transpose it to x there. y^T is written as D
  // row-major by each.
  struct Case {
    const char* format;
    int64_t rows, cols;
    bool gathers;
  };
  const Case cases[] = {{"2:4", 1000, 520, false},
                        {"vnm:128:2:8", 384, 1024, true},
                        {"vnm:64:2:10", 300, 520, true},
                        {"vnm:64:2:8", 384, 1024, false},
                        {"tile:64x64:0.25", 512, 1024, false}};
  for (DType dtype : {DType::f16, DType::bf16})
    for (const Case& c : cases) {
      const SparseMatrix w = pruned(c.rows, c.cols, dtype, c.format, 13);
      SparseLinear layer = SparseLinear::create(w, Activation::gelu, /*bias=*/true);
      EXPECT_EQ(layer.reads_feature_major_in_place(), c.gathers) << c.format;
      for (int64_t tokens : {5, 16, 17, 24, 64, 300})
        for (ActivationLayout y : {ActivationLayout::token_major, ActivationLayout::feature_major})
          for (int64_t ldx : {int64_t{0}, round_up(tokens, 8) + 8}) {
            const RunLayout layout{ActivationLayout::feature_major, y, ldx};
            const Problem t{c.rows,
                            c.cols,
                            tokens,
                            dtype,
                            dtype,
                            Layout::row_major,
                            y == ActivationLayout::feature_major ? Layout::row_major : Layout::col_major,
                            1.0f,
                            0.0f,
                            true,
                            Activation::gelu,
                            ldx};
            const bool in_place = c.gathers && ((ldx == 0 ? tokens : ldx) % 8 == 0 ||
                                                VnmSpmmPlan::takes_skinny_kernel(c.rows, c.cols, gathers_m(c.format),
                                                                                 tokens, Layout::row_major));
            const std::size_t bytes = layer.workspace_bytes(tokens, layout);
            EXPECT_EQ(bytes > 0, !in_place) << c.format << " " << tokens;
            DeviceBytes workspace(bytes);
            const std::string kernel = layer.kernel(tokens, layout);
            const double err =
                error_against_oracle(w, t, 7, [&](const void* x, const void*, void* out, const float* b) {
                  layer.run(nullptr, x, out, tokens, b, {workspace.ptr, bytes}, layout);
                });
            EXPECT_LE(err, tolerance(dtype)) << c.format << " " << describe(t) << " (" << kernel << ")";
            EXPECT_EQ(kernel.find("x feature-major") != std::string::npos, in_place) << kernel;
          }
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
  // Feature-major x whose rows are shorter than its tokens.
  const RunLayout short_rows{ActivationLayout::feature_major, ActivationLayout::token_major, 7};
  EXPECT_THROW(layer.run(nullptr, x.ptr, y.ptr, 8, static_cast<const float*>(bias.ptr), {}, short_rows), Error);
}

QuantizedNmMatrix quantized(int64_t rows, int64_t cols, QuantType type, uint32_t seed, int n = 2, int m = 4) {
  const DenseMatrix w = test::random_matrix(rows, cols, DType::f32, seed);
  return quantize_nm(compress_nm(w, prune_nm_magnitude(w, n, m), n, m), type);
}

// Whether this machine runs the 8-bit kernel for `type` (an sm_90 device and a kernel built for the type): the
// plan says, so that a type it comes to take is tested without a change here.
bool runs_8bit(QuantType type) {
  try {
    detail::Nm24x8SpmmPlan::create({128, 128, 16, type});
    return true;
  } catch (const Error&) {
    return false;
  }
}

// An 8-bit layer's y[T, R] for x of `dtype` values against quantized_spmm of the weight and x quantized on the host
// (quantize_rows of the same 16-bit values, which the GPU quantizer matches bit for bit), y poisoned first. With
// `prequantized`, the layer gets those host codes and scales (run_quantized) instead of x. Returns the relative
// Frobenius error, or 1 (and a failure) where an element was not written.
double error_8bit(SparseLinear& layer, const QuantizedNmMatrix& w, int64_t tokens, DType dtype, bool bias,
                  Activation act, uint32_t seed, bool prequantized = false) {
  const int64_t r = w.rows, k = w.cols;
  const std::vector<float> x = rounded_random(static_cast<std::size_t>(tokens * k), dtype, seed);
  const std::vector<float> b = test::random_nonzero(static_cast<std::size_t>(r), seed + 1);
  const QuantizedRows qx = quantize_rows(x, tokens, k, w.type());
  const auto x_bytes = encode(x, dtype);
  const std::size_t y_bytes = static_cast<std::size_t>(tokens * r) * dtype_size(dtype);
  DeviceBytes dx(x_bytes.size()), dcodes(qx.values.codes.size()), dscales(qx.scales.size() * 4), dy(y_bytes),
      dbias(b.size() * 4);
  check(cudaMemcpy(dx.ptr, x_bytes.data(), x_bytes.size(), cudaMemcpyHostToDevice), "copy x");
  check(cudaMemcpy(dcodes.ptr, qx.values.codes.data(), qx.values.codes.size(), cudaMemcpyHostToDevice), "copy codes");
  check(cudaMemcpy(dscales.ptr, qx.scales.data(), qx.scales.size() * 4, cudaMemcpyHostToDevice), "copy scales");
  check(cudaMemcpy(dbias.ptr, b.data(), b.size() * 4, cudaMemcpyHostToDevice), "copy bias");
  check(cudaMemset(dy.ptr, 0xff, y_bytes), "poison y");  // NaN in f16 and bf16
  const float* bias_ptr = bias ? static_cast<const float*>(dbias.ptr) : nullptr;
  if (prequantized)
    layer.run_quantized(nullptr, static_cast<const uint8_t*>(dcodes.ptr), static_cast<const float*>(dscales.ptr),
                        dy.ptr, tokens, bias_ptr);
  else
    layer.run(nullptr, dx.ptr, dy.ptr, tokens, bias_ptr);
  check(cudaDeviceSynchronize(), "8-bit layer");
  std::vector<std::byte> y_host(y_bytes);
  check(cudaMemcpy(y_host.data(), dy.ptr, y_bytes, cudaMemcpyDeviceToHost), "copy y");
  // y[T, R] row-major is D (R x T) col-major.
  std::vector<float> want(static_cast<std::size_t>(r * tokens));
  quantized_spmm(w, qx, {nullptr, r, tokens, Layout::col_major}, {want.data(), r, tokens, Layout::col_major},
                 {1.0f, 0.0f, bias ? b.data() : nullptr, act}, dtype);
  const std::vector<float> got = decode(y_host, dtype);
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << "y[" << i / r << ", " << i % r << "] not written or not finite";
      return 1.0;
    }
  // Each element within twice the norm's tolerance of the RMS: fp8 sums in the tensor cores' reduced-precision
  // accumulators, whose error an element may carry a few times over (a wrong or unwritten block is off by ~RMS).
  std::size_t worst = 0;
  const double out_eps = dtype == DType::bf16 ? 0x1p-8 : 0x1p-11;
  if (test::worst_element_excess(got, want, 2.0 * out_eps, 2.0 * tolerance(dtype), &worst) > 1.0)
    ADD_FAILURE() << "y[" << worst / r << ", " << worst % r << "] is " << got[worst] << ", the oracle says "
                  << want[worst];
  return test::relative_frobenius(got, want);
}

TEST(SparseLinear8bitGpu, EveryTypeAndTokenCountAgreesWithTheQuantizedOracle) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, cols;
    Activation act;
    bool bias;
  };
  // Odd R (a tail in the 128-row tiles), K multiples of 16 that are not of 64 or 128, every epilogue.
  const Case cases[] = {
      {1000, 528, Activation::gelu, true}, {77, 144, Activation::relu, false}, {200, 64, Activation::none, true}};
  int types_run = 0;
  uint32_t seed = 300;
  for (QuantType type : {QuantType::e4m3, QuantType::e5m2, QuantType::int8}) {
    if (!runs_8bit(type)) {
      std::printf("SparseLinear 8-bit: %s not run (the 8-bit plan refuses it here)\n", quant_type_name(type));
      continue;
    }
    ++types_run;
    for (DType dtype : {DType::f16, DType::bf16})
      for (const Case& c : cases) {
        const QuantizedNmMatrix w = quantized(c.rows, c.cols, type, seed += 10);
        SparseLinear layer = SparseLinear::create(w, dtype, c.act, c.bias);
        EXPECT_EQ(layer.format(), std::string("2:4 ") + quant_type_name(type));
        EXPECT_EQ(layer.quantized(), type);
        EXPECT_EQ(layer.dtype(), dtype);
        EXPECT_EQ(layer.in_features(), c.cols);
        EXPECT_EQ(layer.out_features(), c.rows);
        // 33 twice: the bucket's remade plan kept; 17, 33 and 300 run plans of their buckets' choices (20, 40, 320).
        for (int64_t tokens : {1, 7, 17, 33, 300, 33}) {
          const std::string kernel = layer.kernel(tokens);
          EXPECT_NE(kernel.find(std::string("x quantized per token to ") + quant_type_name(type)), std::string::npos)
              << kernel;
          const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " T " +
                                   std::to_string(tokens) + " " + quant_type_name(type) + " " + dtype_name(dtype) +
                                   " " + activation_name(c.act) + (c.bias ? " bias" : "") + " (" + kernel + ")";
          EXPECT_LE(error_8bit(layer, w, tokens, dtype, c.bias, c.act, seed += 10), tolerance(dtype)) << what;
        }
      }
  }
  if (types_run == 0) GTEST_SKIP() << "no device runs the 8-bit kernel (it needs sm_90)";
}

TEST(SparseLinear8bitGpu, PrequantizedXGivesTheSameProduct) {
  SKIP_WITHOUT_GPU();
  if (!runs_8bit(QuantType::e4m3)) GTEST_SKIP() << "no device runs the 8-bit kernel (it needs sm_90)";
  const QuantizedNmMatrix w = quantized(384, 256, QuantType::e4m3, 41);
  SparseLinear layer = SparseLinear::create(w, DType::bf16, Activation::none, /*bias=*/true);
  for (int64_t tokens : {5, 64, 129})
    EXPECT_LE(error_8bit(layer, w, tokens, DType::bf16, true, Activation::none, 50 + tokens, /*prequantized=*/true),
              tolerance(DType::bf16))
        << tokens << " tokens";
}

TEST(SparseLinear8bitGpu, AnyTokenCountTakesABoundedNumberOfPlans) {
  SKIP_WITHOUT_GPU();
  if (!runs_8bit(QuantType::e4m3)) GTEST_SKIP() << "no device runs the 8-bit kernel (it needs sm_90)";
  SparseLinear layer = SparseLinear::create(quantized(256, 512, QuantType::e4m3, 3), DType::f16);
  EXPECT_EQ(layer.plans(), 1u);  // create's plan for one token
  std::mt19937 random(7);
  std::uniform_int_distribution<int64_t> tokens(1, 4096);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(layer.kernel(tokens(random)).empty());
  EXPECT_LE(layer.plans(), 48u);  // detail::token_bucket's buckets of 1..4096
}

TEST(SparseLinear8bitGpu, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
  if (!runs_8bit(QuantType::e4m3)) GTEST_SKIP() << "no device runs the 8-bit kernel (it needs sm_90)";
  SparseLinear layer =
      SparseLinear::create(quantized(128, 64, QuantType::e4m3, 1), DType::f16, Activation::none, /*bias=*/true);
  DeviceBytes x(64 * 8 * 2), y(128 * 8 * 2), codes(64 * 8), scales(8 * 4), bias(128 * 4);
  const auto* b = static_cast<const float*>(bias.ptr);
  EXPECT_NMKIT_ERROR(layer.run(nullptr, x.ptr, y.ptr, 8, nullptr), ErrorCode::invalid_argument, "has a bias");
  EXPECT_NMKIT_ERROR(layer.run(nullptr, nullptr, y.ptr, 8, b), ErrorCode::invalid_argument, "must not be null");
  EXPECT_NMKIT_ERROR(layer.run(nullptr, x.ptr, y.ptr, -1, b), ErrorCode::invalid_argument, ">= 0");
  EXPECT_NO_THROW(layer.run(nullptr, nullptr, nullptr, 0, nullptr));  // an empty batch launches nothing
  const auto* c = static_cast<const uint8_t*>(codes.ptr);
  EXPECT_NMKIT_ERROR(layer.run_quantized(nullptr, c + 1, static_cast<const float*>(scales.ptr), y.ptr, 8, b),
                     ErrorCode::invalid_argument, "16-byte aligned");
  EXPECT_NMKIT_ERROR(layer.run_quantized(nullptr, c, nullptr, y.ptr, 8, b), ErrorCode::invalid_argument, "scales");
  const std::size_t bytes = layer.workspace_bytes(8);
  DeviceBytes workspace(bytes);
  EXPECT_NMKIT_ERROR(layer.run(nullptr, x.ptr, y.ptr, 8, b, {workspace.ptr, bytes}, {ActivationLayout::feature_major}),
                     ErrorCode::unsupported, "token-major x only");
  SparseLinear dense16 = SparseLinear::create(pruned(128, 64, DType::f16, "2:4", 1));
  EXPECT_FALSE(dense16.quantized().has_value());
  EXPECT_NMKIT_ERROR(dense16.run_quantized(nullptr, c, static_cast<const float*>(scales.ptr), y.ptr, 8, nullptr),
                     ErrorCode::invalid_argument, "not 8-bit");
  check(cudaDeviceSynchronize(), "nothing launched");
}

// run() on the caller's workspace against run() on the layer's own: the same launches on the same x, so the same
// y, for layers that need scratch (condensed V:N:M and 8-bit, at any count) and one that does
// not; a workspace too small, missing or misaligned is refused before anything runs.
TEST(SparseLinearGpu, TheCallersWorkspaceGivesTheLayersOwnResult) {
  SKIP_WITHOUT_GPU();
  std::vector<std::pair<std::string, SparseLinear>> layers;
  layers.emplace_back("vnm:128:2:8", SparseLinear::create(pruned(384, 1024, DType::f16, "vnm:128:2:8", 5)));
  layers.emplace_back("2:4", SparseLinear::create(pruned(384, 1024, DType::f16, "2:4", 6)));
  if (runs_8bit(QuantType::e4m3))
    layers.emplace_back("2:4 e4m3", SparseLinear::create(quantized(384, 1024, QuantType::e4m3, 7), DType::f16));
  for (auto& [name, layer] : layers)
    for (int64_t tokens : {5, 100}) {
      // vnm: x transposed for the row gather, except where the skinny kernel reads it in place.
      const bool needs = name == "2:4 e4m3" || (name == "vnm:128:2:8" && !VnmSpmmPlan::takes_skinny_kernel(
                                                                             384, 1024, 8, tokens, Layout::row_major));
      const std::size_t bytes = layer.workspace_bytes(tokens);
      EXPECT_EQ(bytes > 0, needs) << name << " " << tokens << " tokens: " << bytes << " bytes";
      const auto x = encode(rounded_random(static_cast<std::size_t>(tokens * 1024), DType::f16, 9), DType::f16);
      const std::size_t y_bytes = static_cast<std::size_t>(tokens * 384) * 2;
      DeviceBytes dx(x.size()), own(y_bytes), given(y_bytes), workspace(bytes + 16);
      check(cudaMemcpy(dx.ptr, x.data(), x.size(), cudaMemcpyHostToDevice), "copy x");
      check(cudaMemset(own.ptr, 0xff, y_bytes), "poison y");
      check(cudaMemset(given.ptr, 0xff, y_bytes), "poison y");
      layer.run(nullptr, dx.ptr, own.ptr, tokens);
      layer.run(nullptr, dx.ptr, given.ptr, tokens, nullptr, SparseLinear::Workspace{workspace.ptr, bytes});
      check(cudaDeviceSynchronize(), "layers");
      std::vector<std::byte> a(y_bytes), b(y_bytes);
      check(cudaMemcpy(a.data(), own.ptr, y_bytes, cudaMemcpyDeviceToHost), "copy y");
      check(cudaMemcpy(b.data(), given.ptr, y_bytes, cudaMemcpyDeviceToHost), "copy y");
      // The same launches; a split-K plan's fp32 reduction may sum in another order, so not bit for bit.
      const std::vector<float> fa = decode(a, DType::f16), fb = decode(b, DType::f16);
      for (float v : fb) ASSERT_TRUE(std::isfinite(v)) << name << " " << tokens << " tokens: y not written";
      EXPECT_LE(test::relative_frobenius(fb, fa), 1e-3) << name << " " << tokens << " tokens";
      if (!needs) continue;
      const auto refused = [&](SparseLinear::Workspace w, const char* why) {
        try {
          layer.run(nullptr, dx.ptr, given.ptr, tokens, nullptr, w);
          ADD_FAILURE() << name << ": a workspace that " << why << " was taken";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
        }
      };
      refused({workspace.ptr, bytes - 1}, "is a byte short");
      refused({nullptr, bytes}, "is null");
      refused({static_cast<char*>(workspace.ptr) + 8, bytes}, "is 8-byte aligned");
    }
}

// A source of rows x src_ld 16-bit values (never zero, so that padding must be written) `offset` elements into a
// device buffer, and a poisoned destination of dst_elements: what the two copies below read and write.
struct CopyBuffers {
  std::vector<uint16_t> src;
  DeviceBytes d_src, d_dst;
  std::size_t dst_elements;
  CopyBuffers(int64_t src_elements, int64_t offset, int64_t dst_elements, uint32_t seed)
      : src(static_cast<std::size_t>(src_elements + offset)),
        d_src(src.size() * 2),
        d_dst(static_cast<std::size_t>(dst_elements) * 2),
        dst_elements(static_cast<std::size_t>(dst_elements)) {
    std::mt19937 rng(seed);
    for (uint16_t& v : src) v = static_cast<uint16_t>(rng() | 1u);
    check(cudaMemcpy(d_src.ptr, src.data(), src.size() * 2, cudaMemcpyHostToDevice), "copy src");
    check(cudaMemset(d_dst.ptr, 0xff, this->dst_elements * 2), "poison dst");
  }
  const uint16_t* source(int64_t offset) const { return static_cast<const uint16_t*>(d_src.ptr) + offset; }
  std::vector<uint16_t> result() const {
    check(cudaDeviceSynchronize(), "copy kernel");
    std::vector<uint16_t> dst(dst_elements);
    check(cudaMemcpy(dst.data(), d_dst.ptr, dst_elements * 2, cudaMemcpyDeviceToHost), "copy dst");
    return dst;
  }
};

// The transposes behind the V:N:M row gather (x to x^T) and feature-major x for the other kernels (x^T to x),
// exactly, over a poisoned destination: the 8 x 8 block path (aligned, K % 8 == 0) and the element path (K % 8 != 0,
// an odd destination or source stride, a source one element off alignment), tile tails in both dimensions and the
// zero padding of the tokens; 1100000 x 16 has more of the block path's CTA tiles than its grid has CTAs.
TEST(TransposeGpu, OddShapesPaddingAndAlignment) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, cols, dst_ld, src_offset, src_ld;  // src_ld 0: cols
  };
  const Case cases[] = {{1, 4096, 8, 0, 0},   {17, 520, 24, 0, 0},   {77, 1000, 80, 0, 0},        {64, 64, 64, 0, 0},
                        {300, 77, 304, 0, 0}, {5, 3, 7, 0, 0},       {33, 96, 40, 1, 0},          {130, 200, 130, 0, 0},
                        {96, 24, 96, 0, 40},  {520, 17, 520, 0, 21}, {1100000, 16, 1100000, 0, 0}};
  for (const Case& c : cases) {
    const int64_t src_ld = c.src_ld > 0 ? c.src_ld : c.cols;
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.cols << " (stride " << src_ld << ") into stride "
                                    << c.dst_ld << ", source offset " << c.src_offset);
    CopyBuffers b(c.rows * src_ld, c.src_offset, c.cols * c.dst_ld, static_cast<uint32_t>(c.rows * 7919 + c.cols));
    transpose_16bit(nullptr, b.source(c.src_offset), src_ld, b.d_dst.ptr, c.rows, c.cols, c.dst_ld);
    const std::vector<uint16_t> dst = b.result();
    int64_t wrong = 0;
    for (int64_t k = 0; k < c.cols; ++k)
      for (int64_t t = 0; t < c.dst_ld; ++t) {
        const uint16_t want = t < c.rows ? b.src[static_cast<std::size_t>(c.src_offset + t * src_ld + k)] : 0;
        wrong += dst[static_cast<std::size_t>(k * c.dst_ld + t)] != want;
      }
    EXPECT_EQ(wrong, 0);
  }
}

// The repad of feature-major x for the row gather: rows of any stride and alignment into 16-byte rows, zero past the
// columns, exactly.
TEST(TransposeGpu, RowCopyRepadsAnyStride) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, cols, src_ld, dst_ld, src_offset;
  };
  const Case cases[] = {{1000, 13, 13, 16, 0}, {520, 4095, 4095, 4096, 1}, {7, 1, 3, 8, 0}, {64, 24, 40, 32, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.cols << " from stride " << c.src_ld << " to " << c.dst_ld
                                    << ", source offset " << c.src_offset);
    CopyBuffers b(c.rows * c.src_ld, c.src_offset, c.rows * c.dst_ld, static_cast<uint32_t>(c.rows + c.cols));
    copy_rows_16bit(nullptr, b.source(c.src_offset), c.src_ld, b.d_dst.ptr, c.dst_ld, c.rows, c.cols);
    const std::vector<uint16_t> dst = b.result();
    int64_t wrong = 0;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t j = 0; j < c.dst_ld; ++j) {
        const uint16_t want = j < c.cols ? b.src[static_cast<std::size_t>(c.src_offset + r * c.src_ld + j)] : 0;
        wrong += dst[static_cast<std::size_t>(r * c.dst_ld + j)] != want;
      }
    EXPECT_EQ(wrong, 0);
  }
}

// Refused before the device is needed: these run on machines without a GPU too.
TEST(SparseLinear8bit, RefusesOnTheHostWhatNoKernelTakes) {
  EXPECT_NMKIT_ERROR(SparseLinear::create(quantized(64, 64, QuantType::e4m3, 1, 2, 8), DType::f16),
                     ErrorCode::unsupported, "takes 2:4");
  EXPECT_NMKIT_ERROR(SparseLinear::create(quantized(64, 64, QuantType::int8, 1, 1, 4), DType::bf16),
                     ErrorCode::unsupported, "(int8) 1:4");
  EXPECT_NMKIT_ERROR(SparseLinear::create(quantized(64, 64, QuantType::e4m3, 1), DType::f32), ErrorCode::unsupported,
                     "f16 or bf16 x and y, got f32");
  EXPECT_NMKIT_ERROR(SparseLinear::create(quantized(64, 72, QuantType::e5m2, 1), DType::f16), ErrorCode::unsupported,
                     "multiple of 16");
  QuantizedNmMatrix broken = quantized(64, 64, QuantType::e4m3, 1);
  broken.scales[3] = -1.0f;
  EXPECT_THROW(SparseLinear::create(broken, DType::f16), Error);  // validated while packing, on the host
}

}  // namespace
}  // namespace nmkit::gpu
