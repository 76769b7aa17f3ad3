#pragma once
// The `8bit` suite of nmkit_bench: 8-bit 2:4 (fp8 e4m3 or e5m2, int8; per-row weight scales, per-token activation
// scales) against dense cuBLASLt at the same 8 bits and against cuSPARSELt's 8-bit 2:4, in the same rounds.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "nmkit/format/quantized.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::bench {

struct QuantizedSuiteOptions {
  std::vector<Shape> shapes;     // R x K weights, C = T tokens (x[T, K] row-major: B col-major)
  std::vector<QuantType> types;  // of weights and activations alike
  int warmup = 5, iters = 30;
  bool cusparselt = true;  // where the benchmark was built with it
  // --variant: a second 8-bit plan with these options (named by variant_text), timed in the same rounds.
  std::optional<gpu::Nm24Options> variant;
  std::string variant_text;
};

// Default shapes: the llm suite's weights at T = 128, 512, 2048 and 4096 (the serving range the issue names).
std::vector<Shape> quantized_suite_shapes();

// Prints one table row per (type, shape) and appends JSON rows (nmkit_rel_error among them) to `rows`, calling
// `row_done` after each.
void run_quantized_suite(const QuantizedSuiteOptions& o, cublasLtHandle_t lt, void* workspace,
                         std::size_t workspace_bytes, std::size_t l2_bytes, cudaStream_t stream, nlohmann::json& rows,
                         const RowDone& row_done);

}  // namespace nmkit::bench
