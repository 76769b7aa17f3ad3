#include "transpose_suite.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../src/cuda/common/check.cuh"
#include "../../src/cuda/transpose.hpp"
#include "bench_kernels.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit::bench {

std::vector<Shape> transpose_suite_shapes() {
  std::vector<Shape> shapes;
  for (int64_t k : {4096, 11008})
    for (int64_t t : {16, 512, 4095, 4096}) shapes.push_back({0, k, t, "transpose"});
  return shapes;
}

namespace {

// SparseLinear pads x^T's rows to a multiple of 8 tokens (whole 16-byte pieces for the row gather): the same here.
constexpr int64_t kPaddedTokens = 8;

// Elements of the device transpose that differ from the host's (zeros past T included), over all of it.
int64_t wrong_elements(const void* x, const void* xt, int64_t tokens, int64_t k, int64_t ldt, cudaStream_t stream) {
  std::vector<uint16_t> host_x(static_cast<std::size_t>(tokens * k)), host_xt(static_cast<std::size_t>(k * ldt));
  NMKIT_CUDA_CHECK(cudaMemcpyAsync(host_x.data(), x, host_x.size() * 2, cudaMemcpyDeviceToHost, stream));
  NMKIT_CUDA_CHECK(cudaMemcpyAsync(host_xt.data(), xt, host_xt.size() * 2, cudaMemcpyDeviceToHost, stream));
  NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  int64_t wrong = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < ldt; ++t)
      wrong += host_xt[static_cast<std::size_t>(j * ldt + t)] !=
               (t < tokens ? host_x[static_cast<std::size_t>(t * k + j)] : uint16_t{0});
  return wrong;
}

}  // namespace

void run_transpose_suite(const TransposeSuiteOptions& o, std::size_t l2_bytes, cudaStream_t stream,
                         nlohmann::json& rows, const RowDone& row_done) {
  std::printf("%-16s %12s %10s %12s %10s %9s\n", "T x K", "transpose us", "GB/s", "copy us", "GB/s", "vs copy");
  for (const Shape& shape : o.shapes) {
    const int64_t tokens = shape.c, k = shape.k, ldt = round_up(tokens, kPaddedTokens);
    const std::size_t x_bytes = static_cast<std::size_t>(tokens * k) * 2,
                      xt_bytes = static_cast<std::size_t>(k * ldt) * 2;
    // Operand sets rotating past 3x L2, as the product suites do (small T stays L2-resident for both).
    const int sets = static_cast<int>(std::clamp<std::size_t>(3 * l2_bytes / (x_bytes + xt_bytes) + 1, 1, 8));
    std::vector<DeviceArray> x, xt, copied;
    for (int s = 0; s < sets; ++s) {
      x.emplace_back(x_bytes), xt.emplace_back(xt_bytes), copied.emplace_back(x_bytes);
      fill_dense(x.back().ptr, tokens * k, DType::f16, 31 + s, stream);
      NMKIT_CUDA_CHECK(cudaMemsetAsync(xt.back().ptr, 0xff, xt_bytes, stream));  // poisoned
    }
    const auto transpose = [&](int s) { gpu::transpose_16bit(stream, x[s].ptr, k, xt[s].ptr, tokens, k, ldt); };
    const auto copy = [&](int s) {
      NMKIT_CUDA_CHECK(cudaMemcpyAsync(copied[s].ptr, x[s].ptr, x_bytes, cudaMemcpyDeviceToDevice, stream));
    };
    transpose(0);
    const int64_t wrong = wrong_elements(x[0].ptr, xt[0].ptr, tokens, k, ldt, stream);
    const std::vector<double> ms =
        time_interleaved_ms({transpose, copy}, sets, o.warmup, interleaved_rounds(o.iters), kLaunchesPerRound, stream);
    const double transpose_gbps = static_cast<double>(x_bytes + xt_bytes) / (ms[0] * 1e6);
    const double copy_gbps = static_cast<double>(2 * x_bytes) / (ms[1] * 1e6);
    char shape_text[32];
    std::snprintf(shape_text, sizeof shape_text, "%lldx%lld", static_cast<long long>(tokens),
                  static_cast<long long>(k));
    std::printf("%-16s %12.1f %10.0f %12.1f %10.0f %8.2fx%s\n", shape_text, ms[0] * 1e3, transpose_gbps, ms[1] * 1e3,
                copy_gbps, transpose_gbps / copy_gbps, wrong > 0 ? "  WRONG" : "");
    rows.push_back({{"suite", "transpose"},
                    {"tokens", tokens},
                    {"k", k},
                    {"transpose_ms", ms[0]},
                    {"copy_ms", ms[1]},
                    {"transpose_gbps", transpose_gbps},
                    {"copy_gbps", copy_gbps},
                    {"nmkit_rel_error", static_cast<double>(wrong) / static_cast<double>(k * ldt)}});
    row_done();
  }
}

}  // namespace nmkit::bench
