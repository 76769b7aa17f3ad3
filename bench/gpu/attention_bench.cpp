// nmkit_attention_bench: the fused attention kernel alone, dense against 2:4, and the seed's unfused 2:4 pipeline
// built from nmkit's ops, side by side in the same rounds (CUDA events, medians). TFLOP/s are counted as dense
// attention's 4 * B * H * Sq * Sk * d (half of it under causal). PyTorch's SDPA baselines are
// bench/torch_attention.py's.
//   nmkit_attention_bench [--seq 1024,4096,16384] [--head-dim 64,128] [--causal 0,1] [--dtype bf16|f16]
//                         [--tokens-heads N] [--iters N] [--unfused 0|1] [--json FILE]
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <functional>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "nmkit/attention/dfss_gpu.hpp"
#include "nmkit/attention/dfss_ops_gpu.hpp"

namespace nmkit::bench {
namespace {

struct Contender {
  const char* name;
  gpu::AttentionPattern pattern;
};
constexpr Contender kContenders[] = {{"dense", gpu::AttentionPattern::dense}, {"2:4", gpu::AttentionPattern::nm24}};

// The seed's unfused pipeline: S = Q * K^T for every head by one strided-batched cuBLASLt GEMM (S in the inputs'
// dtype, unscaled), then per head prune_scores_nm24 (scale, causal mask, 2:4), softmax_nm24 and the 2:4 SpMM P * V.
// The seed prunes in its SDDMM's epilogue; here S makes one round trip through memory more.
class UnfusedDfss {
 public:
  UnfusedDfss(cublasLtHandle_t lt, int64_t heads, int64_t seq, int d, DType dtype, bool causal, void* workspace,
              std::size_t workspace_bytes)
      : lt_(lt),
        heads_(heads),
        seq_(seq),
        d_(d),
        dtype_(dtype),
        causal_(causal),
        workspace_(workspace),
        workspace_bytes_(workspace_bytes),
        scores_(static_cast<std::size_t>(heads * seq * seq) * dtype_size(dtype)),
        // P is written by the kernel just before the product: no overlapped launch (Nm24Options::overlap_launch).
        plan_(gpu::Nm24SpmmPlan::create({seq, seq, d, dtype, dtype, Layout::row_major, Layout::row_major},
                                        {.overlap_launch = false})) {
    // Column-major view: S^T (seq_k x seq_q per head) = K_h (d x seq_k, op T) x Q_h (d x seq_q).
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
    const auto layout = [&](cublasLtMatrixLayout_t& l, int64_t rows, int64_t cols, int64_t stride) {
      CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l, cuda_type(dtype), rows, cols, rows));
      const int32_t batch = static_cast<int32_t>(heads);
      CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
      CHECK_CUBLAS(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    };
    layout(a_, d, seq, seq * d);
    layout(b_, d, seq, seq * d);
    layout(s_, seq, seq, seq * seq);
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                      sizeof workspace_bytes_));
    int found = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, s_, s_, pref, 1, &heuristic_, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) throw Error(ErrorCode::cuda_error, "cuBLASLt found no batched algorithm for Q * K^T");
    for (int64_t h = 0; h < heads; ++h) p_.push_back(gpu::DeviceNm24::allocate(seq, seq, dtype));
  }
  UnfusedDfss(const UnfusedDfss&) = delete;
  UnfusedDfss& operator=(const UnfusedDfss&) = delete;
  ~UnfusedDfss() {
    cublasLtMatrixLayoutDestroy(a_), cublasLtMatrixLayoutDestroy(b_), cublasLtMatrixLayoutDestroy(s_);
    cublasLtMatmulDescDestroy(desc_);
  }
  void run(const void* q, const void* k, const void* v, void* o, cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasLtMatmul(lt_, desc_, &alpha, k, a_, q, b_, &beta, scores_.ptr, s_, scores_.ptr, s_,
                                &heuristic_.algo, workspace_, workspace_bytes_, stream));
    const std::size_t elem = dtype_size(dtype_);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d_));
    for (int64_t h = 0; h < heads_; ++h) {
      const auto* s = static_cast<const std::byte*>(scores_.ptr) + static_cast<std::size_t>(h * seq_ * seq_) * elem;
      gpu::prune_scores_nm24(
          stream, {.scores = s, .dtype = dtype_, .rows = seq_, .cols = seq_, .scale = scale, .causal = causal_}, p_[h]);
      gpu::softmax_nm24(stream, p_[h]);
      const std::size_t offset = static_cast<std::size_t>(h * seq_ * d_) * elem;
      plan_.run(stream, p_[h], static_cast<const std::byte*>(v) + offset, nullptr, static_cast<std::byte*>(o) + offset);
    }
  }

 private:
  cublasLtHandle_t lt_;
  int64_t heads_, seq_;
  int d_;
  DType dtype_;
  bool causal_;
  void* workspace_;
  std::size_t workspace_bytes_;
  DeviceArray scores_;
  gpu::Nm24SpmmPlan plan_;
  std::vector<gpu::DeviceNm24> p_;
  cublasLtMatmulDesc_t desc_{};
  cublasLtMatrixLayout_t a_{}, b_{}, s_{};
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

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
  int unfused = 1;
  app.add_option("--seq", seqs)->delimiter(',');
  app.add_option("--head-dim", head_dims)->delimiter(',');
  app.add_option("--causal", causals)->delimiter(',');
  app.add_option("--dtype", dtype_name_arg);
  app.add_option("--tokens-heads", tokens_heads, "B * H * S of each row (B * H = this / S)");
  app.add_option("--iters", iters);
  app.add_option("--unfused", unfused, "also the seed's unfused 2:4 pipeline from nmkit's ops (1) or not (0)");
  app.add_option("--json", json_path);
  CLI11_PARSE(app, argc, argv);
  const DType dtype = dtype_name_arg == "f16" ? DType::f16 : DType::bf16;

  cudaStream_t stream;
  NMKIT_CUDA_CHECK(cudaStreamCreate(&stream));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  constexpr std::size_t kWorkspace = 64u << 20;
  DeviceArray workspace(kWorkspace);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-6s %4s %6s %6s |", "S", "d", "causal", "B*H");
  for (const Contender& c : kContenders) std::printf(" %14s", c.name);
  std::printf(" | 2:4/dense%s\n", unfused ? " | unfused 2:4 | fused/unfused  rel.err" : "");
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
        // The unfused pipeline's output is checked against the fused 2:4 kernel's: both prune by the same rule, the
        // unfused one on scores rounded to the inputs' dtype (near-ties may fall the other way).
        std::optional<UnfusedDfss> pipeline;
        double unfused_error = 0;
        if (unfused) {
          pipeline.emplace(lt, batch * heads, s, d, dtype, causal != 0, workspace.ptr, kWorkspace);
          DeviceArray o_unfused(bytes);
          NMKIT_CUDA_CHECK(cudaMemsetAsync(o_unfused.ptr, 0xff, bytes, stream));
          pipeline->run(q.ptr, k.ptr, v.ptr, o_unfused.ptr, stream);
          plans[1].run(stream, {.q = q.ptr, .k = k.ptr, .v = v.ptr, .o = o.ptr});
          unfused_error = relative_error(o_unfused.ptr, o.ptr, static_cast<int64_t>(count), dtype, stream);
          launches.push_back(
              [&pipeline, &q, &k, &v, &o, stream](int) { pipeline->run(q.ptr, k.ptr, v.ptr, o.ptr, stream); });
        }
        const std::vector<double> ms =
            time_interleaved_ms(launches, 1, 3, interleaved_rounds(iters), kLaunchesPerRound, stream);
        const double flops = 4.0 * static_cast<double>(batch * heads) * s * s * d * (causal ? 0.5 : 1.0);
        nlohmann::json row{{"seq", s},       {"head_dim", d},  {"causal", causal != 0},
                           {"batch", batch}, {"heads", heads}, {"dtype", dtype_name(dtype)}};
        std::printf("%-6lld %4d %6d %6lld |", static_cast<long long>(s), d, causal,
                    static_cast<long long>(batch * heads));
        for (std::size_t i = 0; i < std::size(kContenders); ++i) {
          const double tflops = flops / (ms[i] * 1e-3) / 1e12;
          row[std::string(kContenders[i].name) + "_ms"] = ms[i];
          row[std::string(kContenders[i].name) + "_tflops"] = tflops;
          std::printf(" %8.1f TF/s", tflops);
        }
        std::printf(" | %.3fx", ms[0] / ms[1]);
        if (unfused) {
          const double unfused_ms = ms[std::size(kContenders)];
          row["unfused_2:4_ms"] = unfused_ms;
          row["unfused_2:4_tflops"] = flops / (unfused_ms * 1e-3) / 1e12;
          row["unfused_rel_error_vs_fused"] = unfused_error;
          std::printf(" | %6.1f TF/s | %.2fx  %.1e", flops / (unfused_ms * 1e-3) / 1e12, unfused_ms / ms[1],
                      unfused_error);
        }
        std::printf("\n");
        rows.push_back(row);
      }
  if (!json_path.empty()) std::ofstream(json_path) << nlohmann::json{{"suite", "attention"}, {"rows", rows}}.dump(1);
  cublasLtDestroy(lt);
  NMKIT_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
