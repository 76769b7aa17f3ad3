#pragma once
// The `vnm` suite of nmkit_bench: V:N:M SpMM against dense cuBLASLt and against its own fixed-index ablation.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "bench_common.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit::bench {

struct VnmSuiteOptions {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  std::vector<int> vs;            // V values
  std::vector<int> ms;            // M values (N = 2)
  std::vector<Layout> b_layouts;  // col_major: x[T, K] row-major (the linear layer); row_major: K x C
  int warmup = 5, iters = 30;
  int block_n = 0;  // the condensed kernel's n-tile (sm90; 0: the plan's heuristic)
  // Every V-block selects the same columns (a diagnostic: the gather's instructions with the ablation's L2
  // footprint, since all row blocks then read the same rows of B).
  bool shared_columns = false;
  // Also time the condensed form on this kernel beside the plan's own choice, in the same rounds (automatic: not).
  gpu::Nm24Kernel variant_kernel = gpu::Nm24Kernel::automatic;
};

// Prints one table row per (dtype, shape, V, M, B layout) and appends JSON rows to `rows`, calling `row_done`
// after each; returns the host time of one VnmSpmmPlan::run() in microseconds.
double run_vnm_suite(const VnmSuiteOptions& o, cublasLtHandle_t lt, void* workspace, std::size_t workspace_bytes,
                     std::size_t l2_bytes, cudaStream_t stream, nlohmann::json& rows, const RowDone& row_done);

}  // namespace nmkit::bench
