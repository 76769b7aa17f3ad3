#pragma once
// The `tile` suite of nmkit_bench: tile-sparse SpMM against dense cuBLASLt (seed 003's comparison).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace nmkit::bench {

struct TileSuiteOptions {
  std::vector<Shape> shapes;  // default: 4096 x 4096 weights, C in {32, 4096}
  std::vector<DType> dtypes;
  std::vector<int> tile_sides{32, 64, 128};
  std::vector<double> densities{0.5, 0.25, 0.1, 0.05};
  int warmup = 5, iters = 30;
  int block_n = 0, split = 0;  // the sm90 kernel's configuration; 0: the plan's choice
  bool persistent = true;
  bool timeline = false;  // after each f16 sm90 row, one traced run summarised (run_tile_plan_with_timeline)
  // Also time chains of this many dependent products (R == K: each output is the next product's B), per product:
  // nmkit with overlapping launches (TileLaunch::overlap_launch), without, and cuBLAS; 0: none.
  int chain = 0;
  bool blocked_ell = true;  // also cuSPARSE Blocked-ELL where the pattern allows (BlockedEll::applies)
  int stream_ctas = 0;      // the stream kernel's CTAs per token block (TileLaunch::stream_ctas; 0: the plan's)
  // Also time a plan forced to this kernel (sm80_mma | sm90_wgmma | stream_mma), in the same rounds as the
  // default plan ("variant" in the JSON rows); empty: none.
  std::string compare_kernel;
  // Or time the plan made again with these launch options (--variant: block_n, split, persistent, stream_ctas,
  // overlap_launch) in the same rounds; with compare_kernel, that one wins.
  VariantSettings variant;
  std::string kernel = "automatic";  // the measured plan's kernel (automatic: the plan's choice)
};

// One row per (dtype, shape, tile side, density, distribution of tiles over rows: uniform or skewed), `row_done`
// called after each; returns the host time of one TileSpmmPlan::run() in microseconds.
double run_tile_suite(const TileSuiteOptions& o, cublasLtHandle_t lt, void* workspace, std::size_t workspace_bytes,
                      std::size_t l2_bytes, cudaStream_t stream, nlohmann::json& rows, const RowDone& row_done);

}  // namespace nmkit::bench
