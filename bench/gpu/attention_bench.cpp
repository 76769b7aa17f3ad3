// nmkit_attention_bench: the fused attention kernel alone, dense against 2:4, side by side in the same rounds (CUDA
// events, medians). TFLOP/s are counted as dense attention's 4 * B * H * Sq * Sk * d (half of it under causal).
// PyTorch's SDPA baselines are bench/torch_attention.py's.
//   nmkit_attention_bench [--seq 1024,4096,16384] [--head-dim 64,128] [--causal 0,1] [--dtype bf16|f16]
//                         [--tokens-heads N] [--iters N] [--json FILE]
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "nmkit/attention/dfss_gpu.hpp"

namespace nmkit::bench {
namespace {

struct Contender {
  const char* name;
  gpu::AttentionPattern pattern;
};
constexpr Contender kContenders[] = {{"dense", gpu::AttentionPattern::dense}, {"2:4", gpu::AttentionPattern::nm24}};

}  // namespace
}  // namespace nmkit::bench

int main(int argc, char** argv) {
  using namespace nmkit;
  using namespace nmkit::bench;
  CLI::App app{"fused attention: dense and 2:4"};
  std::vector<int64_t> seqs{1024, 2048, 4096, 8192, 16384};
  std::vector<int> head_dims{64, 128}, causals{0, 1};
  std::string dtype_name_arg = "bf16", json_path;
  int64_t tokens_heads = 32 * 16384;  // B * H * S, the same work per row as S grows
  int iters = 20;
  app.add_option("--seq", seqs)->delimiter(',');
  app.add_option("--head-dim", head_dims)->delimiter(',');
  app.add_option("--causal", causals)->delimiter(',');
  app.add_option("--dtype", dtype_name_arg);
  app.add_option("--tokens-heads", tokens_heads, "B * H * S of each row (B * H = this / S)");
  app.add_option("--iters", iters);
  app.add_option("--json", json_path);
  CLI11_PARSE(app, argc, argv);
  const DType dtype = dtype_name_arg == "f16" ? DType::f16 : DType::bf16;

  cudaStream_t stream;
  NMKIT_CUDA_CHECK(cudaStreamCreate(&stream));
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-6s %4s %6s %6s |", "S", "d", "causal", "B*H");
  for (const Contender& c : kContenders) std::printf(" %14s", c.name);
  std::printf(" | 2:4/dense\n");
  for (int d : head_dims)
    for (int causal : causals)
      for (int64_t s : seqs) {
        const int64_t heads = 16, batch = std::max<int64_t>(1, tokens_heads / s / heads);
        const std::size_t count = static_cast<std::size_t>(batch * heads * s * d);
        const std::size_t bytes = count * dtype_size(dtype);
        DeviceArray q(bytes), k(bytes), v(bytes), o(bytes);
        fill_dense(q.ptr, static_cast<int64_t>(count), dtype, 1, stream);
        fill_dense(k.ptr, static_cast<int64_t>(count), dtype, 2, stream);
        fill_dense(v.ptr, static_cast<int64_t>(count), dtype, 3, stream);
        std::vector<gpu::AttentionPlan> plans;
        std::vector<std::function<void(int)>> launches;
        for (const Contender& c : kContenders) {
          const gpu::AttentionDesc desc{.batch = batch,
                                        .heads = heads,
                                        .seq_q = s,
                                        .seq_k = s,
                                        .head_dim = d,
                                        .dtype = dtype,
                                        .pattern = c.pattern,
                                        .causal = causal != 0};
          plans.push_back(gpu::AttentionPlan::create(desc));
        }
        for (const gpu::AttentionPlan& plan : plans)
          launches.push_back([&plan, &q, &k, &v, &o, stream](int) {
            plan.run(stream, {.q = q.ptr, .k = k.ptr, .v = v.ptr, .o = o.ptr});
          });
        const std::vector<double> ms =
            time_interleaved_ms(launches, 1, 3, interleaved_rounds(iters), kLaunchesPerRound, stream);
        const double flops = 4.0 * static_cast<double>(batch * heads) * s * s * d * (causal ? 0.5 : 1.0);
        nlohmann::json row{{"seq", s},       {"head_dim", d},  {"causal", causal != 0},
                           {"batch", batch}, {"heads", heads}, {"dtype", dtype_name(dtype)}};
        std::printf("%-6lld %4d %6d %6lld |", static_cast<long long>(s), d, causal,
                    static_cast<long long>(batch * heads));
        for (std::size_t i = 0; i < ms.size(); ++i) {
          const double tflops = flops / (ms[i] * 1e-3) / 1e12;
          row[std::string(kContenders[i].name) + "_ms"] = ms[i];
          row[std::string(kContenders[i].name) + "_tflops"] = tflops;
          std::printf(" %8.1f TF/s", tflops);
        }
        std::printf(" | %.3fx\n", ms[0] / ms[1]);
        rows.push_back(row);
      }
  if (!json_path.empty()) std::ofstream(json_path) << nlohmann::json{{"suite", "attention"}, {"rows", rows}}.dump(1);
  NMKIT_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
