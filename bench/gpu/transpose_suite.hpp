#pragma once
// The `transpose` suite of nmkit_bench: the transpose SparseLinear runs before a condensed V:N:M product of
// token-major x (x[T, K] to x^T[K, T8], T8 = T rounded up to 8, zeros past T), against a device-to-device copy of
// the same bytes (the memory's own rate: as many bytes read and written), in the same rounds.
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "bench_common.hpp"

namespace nmkit::bench {

struct TransposeSuiteOptions {
  std::vector<Shape> shapes;  // K = k, T = c (r unused)
  int warmup = 5, iters = 30;
};

// Default shapes: K of 4096 and 11008 at T = 16, 512, 4095 and 4096.
std::vector<Shape> transpose_suite_shapes();

// Prints one row per shape and appends JSON rows to `rows` (nmkit_rel_error: the fraction of wrong elements, checked
// against a host transpose), calling `row_done` after each.
void run_transpose_suite(const TransposeSuiteOptions& o, std::size_t l2_bytes, cudaStream_t stream,
                         nlohmann::json& rows, const RowDone& row_done);

}  // namespace nmkit::bench
