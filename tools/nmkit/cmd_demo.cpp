// The main job on the embedded default: a real model's weights pruned to 2:4 and V:N:M, energy and
// storage reported, one layer's SpMM run on the best backend available and verified against dense.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <sstream>

#include "commands.hpp"
#include "nmkit/cpu/spmm.hpp"
#include "nmkit/device.hpp"
#include "nmkit/error.hpp"
#include "nmkit/io/model.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/prune_model.hpp"
#if defined(NMKIT_WITH_CUDA)
#include "nmkit/gpu/detail/device_buffer.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#endif

namespace nmkit::cli {
namespace {

constexpr const char* kDemoLayer = "encoder.layer.0.intermediate.dense.weight";
constexpr double kFp16Tolerance = 2e-3;  // relative Frobenius error, fp16 values with fp32 accumulation

// y = x * W^T for a linear layer, x (T x K) row-major: B = x^T is K x T column-major, D = y^T.
bool run_layer(const DenseMatrix& weight, const FormatSpec& spec, int64_t tokens) {
  const DenseMatrix w16 = DenseMatrix::from_float(weight.rows, weight.cols, weight.to_float(), DType::f16);
  const PruneResult pruned = prune_magnitude(w16, spec);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens * weight.cols));
  for (float& v : x) v = round_to(DType::f16, uniform(rng));
  std::vector<float> y_sparse(static_cast<std::size_t>(weight.rows * tokens)), y_dense(y_sparse.size());
  const ConstMatrixRef b{x.data(), weight.cols, tokens, Layout::col_major};
  const MatrixRef d_sparse{y_sparse.data(), weight.rows, tokens, Layout::col_major};
  const MatrixRef d_dense{y_dense.data(), weight.rows, tokens, Layout::col_major};

  const auto t0 = std::chrono::steady_clock::now();
  spmm(pruned.compressed, b, {}, d_sparse);
  const auto t1 = std::chrono::steady_clock::now();
  gemm(decompress(pruned.compressed), b, {}, d_dense);
  const auto t2 = std::chrono::steady_clock::now();
  const double error = relative_frobenius_error(y_sparse, y_dense);
  const bool ok = error <= kFp16Tolerance;
  const auto ms = [](auto a, auto z) { return std::chrono::duration<double, std::milli>(z - a).count(); };
  fmt::print(
      "  {:<12} {}x{}x{} fp16  energy {:.4f}  cpu spmm {:7.2f} ms  dense gemm {:7.2f} ms  rel. error {:.2e}  {}\n",
      format_name(pruned.compressed), weight.rows, weight.cols, tokens, pruned.energy, ms(t0, t1), ms(t1, t2), error,
      ok ? "ok" : "FAILED");
  return ok;
}

#if defined(NMKIT_WITH_CUDA)
// The 2:4 product on the GPU (x row-major, y = x W^T), checked against the CPU oracle.
bool run_layer_gpu(const DenseMatrix& weight, int64_t tokens) {
  const DenseMatrix w16 = DenseMatrix::from_float(weight.rows, weight.cols, weight.to_float(), DType::f16);
  const NmMatrix a = compress_nm(w16, prune_nm_magnitude(w16, 2, 4), 2, 4);
  const gpu::DeviceNm24 da = gpu::DeviceNm24::upload(gpu::pack_nm24(a));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  TypedBuffer x(DType::f16, static_cast<std::size_t>(tokens * weight.cols));
  for (std::size_t i = 0; i < x.size(); ++i) x.set(i, uniform(rng));
  gpu::DeviceBuffer dx(x.size_bytes()), dy(static_cast<std::size_t>(weight.rows * tokens) * 2);
  dx.copy_from_host(x.data(), x.size_bytes());
  const gpu::Nm24SpmmPlan plan = gpu::Nm24SpmmPlan::create({weight.rows, weight.cols, tokens});
  plan.run(nullptr, da, dx.data(), nullptr, dy.data());  // warm-up (module load)
  const auto t0 = std::chrono::steady_clock::now();
  plan.run(nullptr, da, dx.data(), nullptr, dy.data());
  TypedBuffer y(DType::f16, static_cast<std::size_t>(weight.rows * tokens));
  dy.copy_to_host(y.data(), y.size_bytes());
  const auto t1 = std::chrono::steady_clock::now();

  const std::vector<float> xf = x.to_float();
  std::vector<float> want(static_cast<std::size_t>(weight.rows * tokens));
  spmm(SparseMatrix{a}, {xf.data(), weight.cols, tokens, Layout::col_major}, {},
       {want.data(), weight.rows, tokens, Layout::col_major});
  const double error = relative_frobenius_error(y.to_float(), want);
  const bool ok = error <= kFp16Tolerance;
  std::ostringstream config;
  config << plan.config();
  fmt::print("  {:<12} {}x{}x{} fp16  GPU {} ({:.2f} ms with the copy back)  rel. error vs CPU {:.2e}  {}\n", "2:4",
             weight.rows, weight.cols, tokens, config.str(), std::chrono::duration<double, std::milli>(t1 - t0).count(),
             error, ok ? "ok" : "FAILED");
  return ok;
}
#endif

}  // namespace

Action add_demo(CLI::App& app) {
  struct Options {
    std::string model = default_model_path();
    int64_t tokens = 512;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--model", o->model,
                 "Model safetensors file (default: $NMKIT_MODEL or the installed all-MiniLM-L6-v2)")
      ->capture_default_str();
  app.add_option("--tokens", o->tokens, "Tokens (the C of the SpMM) in the layer product")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  return [o] {
    fmt::print("model: {}\n", o->model);
    const ModelFile dense_model = load_model(o->model);
    const FormatSpec formats[] = {NmSpec{2, 4}, VnmSpec{64, 2, 8}, VnmSpec{128, 2, 8}};

    fmt::print("\nmagnitude pruning of the encoder's linear weights ({}):\n", kEncoderLinearWeights);
    fmt::print("  {:<14} {:>8} {:>10} {:>12} {:>12} {:>8}\n", "format", "tensors", "energy", "dense", "compressed",
               "ratio");
    for (const FormatSpec& spec : formats) {
      ModelFile model = dense_model;
      ModelPruneOptions options;
      options.spec = spec, options.include = kEncoderLinearWeights, options.exclude = "";
      const ModelPruneReport r = prune_model(model, options);
      std::size_t before = 0, after = 0;
      for (const auto& t : r.tensors)
        if (t.pruned) before += t.bytes_before, after += t.bytes_after;
      fmt::print("  {:<14} {:>8} {:>10.4f} {:>12} {:>12} {:>7.2f}%\n", to_string(spec), r.pruned_count,
                 r.energy.ratio(), human_bytes(before), human_bytes(after), before ? 100.0 * after / before : 100.0);
    }

    const auto it = std::find_if(dense_model.weights.begin(), dense_model.weights.end(),
                                 [](const NamedWeight& w) { return w.name == kDemoLayer; });
    if (it == dense_model.weights.end() || !std::holds_alternative<StTensor>(it->weight))
      throw Error(ErrorCode::invalid_argument, o->model + ": has no dense tensor '" + kDemoLayer + "'");
    const DenseMatrix weight = to_dense_matrix(std::get<StTensor>(it->weight));
    fmt::print("\nSpMM of {} (y = x W^T, x row-major) on the CPU reference backend:\n", kDemoLayer);
    bool ok = true;
    for (const FormatSpec& spec : formats) ok = run_layer(weight, spec, o->tokens) && ok;
#if defined(NMKIT_WITH_CUDA)
    const DeviceQuery cuda = query_cuda_devices();
    if (!cuda.devices.empty()) {
      fmt::print("\nthe same layer's 2:4 product on the GPU:\n");
      ok = run_layer_gpu(weight, o->tokens) && ok;
    } else {
      fmt::print("\nno GPU backend: {}\n", cuda.why_none);
    }
#else
    fmt::print("\nno GPU backend: nmkit was built without CUDA\n");
#endif
    fmt::print("\n{}\n", ok ? "demo: all products verified against dense" : "demo: VERIFICATION FAILED");
    return ok ? 0 : 1;
  };
}

}  // namespace nmkit::cli
