#pragma once
// Device transposes for host code without CUDA headers (src/cuda/sparse_linear.cpp).
#include <cstdint>

#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {

// dst (cols x rows, row-major) = src (rows x cols, row-major)^T, 16-bit elements; asynchronous on `stream`. Throws
// Error(cuda_error) where the launch fails.
void transpose_16bit(Stream stream, const void* src, void* dst, int64_t rows, int64_t cols);

}  // namespace nmkit::gpu
