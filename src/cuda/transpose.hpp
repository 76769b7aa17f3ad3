#pragma once
// The device transpose and row copy for host code without CUDA headers (src/cuda/sparse_linear.cpp).
#include <cstddef>
#include <cstdint>

#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {

// dst (cols x dst_ld, row-major) = src (rows x cols, row-major, leading dimension src_ld >= cols)^T, 16-bit elements,
// its columns rows .. dst_ld - 1 zero (dst_ld >= rows); asynchronous on `stream`. Throws Error(cuda_error) where the
// launch fails.
void transpose_16bit(Stream stream, const void* src, int64_t src_ld, void* dst, int64_t rows, int64_t cols,
                     int64_t dst_ld);

// dst (rows x dst_ld, row-major; dst_ld a multiple of 8, dst 16-byte aligned) = src (rows x cols, row-major, leading
// dimension src_ld >= cols, any alignment), 16-bit elements, its columns cols .. dst_ld - 1 zero (dst_ld >= cols);
// asynchronous on `stream`. Throws Error(cuda_error) where the launch fails.
void copy_rows_16bit(Stream stream, const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t rows,
                     int64_t cols);

}  // namespace nmkit::gpu
