#pragma once
// Device helpers of the GPU benchmark (bench_kernels.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "nmkit/dtype.hpp"

namespace nmkit::bench {

// Random non-zero values in +-[0.125, 1).
void fill_dense(void* out, int64_t count, DType dtype, uint64_t seed, cudaStream_t s);
// A random 2:4 weight written straight into the nm24 packed layout (zero past R and K).
void fill_packed(void* values, void* meta, int64_t rows, int64_t cols, int64_t rows_padded, int64_t cols_padded,
                 DType dtype, uint64_t seed, cudaStream_t s);
// The packed weight as a dense row-major R x K matrix; `dense` must be zeroed first.
void expand_packed(const void* values, const void* meta, void* dense, int64_t rows, int64_t cols, int64_t rows_padded,
                   int64_t cols_padded, DType dtype, cudaStream_t s);
// The V:N:M weight (dense row-major R x K, zeroed first) from its condensed R x K' matrix (dense row-major) and
// gather table (row block = gather_block_rows rows).
void scatter_columns(const void* condensed, const int32_t* gather, void* dense, int64_t rows, int64_t cols,
                     int64_t condensed_cols, int64_t gather_stride, int gather_block_rows, cudaStream_t s);
// The K' rows of a col-major K x C matrix B named by `gather` (one row block's table), as a col-major K' x C
// matrix: the contiguous operand of the fixed-index ablation.
void gather_b_rows(const void* b, const int32_t* gather, void* out, int64_t k_rows, int64_t n, int64_t condensed_rows,
                   cudaStream_t s);
// The dense row-major R x K weight (zeroed first) of packed tiles in CSR order (DeviceTiles' arrays).
void expand_tiles(const int32_t* row_ptr, const int32_t* col_index, const void* tiles, void* dense, int64_t rows,
                  int64_t cols, int tile_rows, int tile_cols, int64_t nnz_tiles, int64_t grid_rows, cudaStream_t s);
// A col-major rows x cols matrix of 16-bit elements written row-major.
void transpose(const void* col_major, void* row_major, int64_t rows, int64_t cols, cudaStream_t s);
// Spins on `s` until flags[0] >= ticket (host-mapped memory that the host writes) or timeout_ns have passed since
// it started, then sets flags[1] if it gave up. QueueHold (bench_common.hpp) is its one user.
void hold_stream(volatile int32_t* flags, int32_t ticket, uint64_t timeout_ns, cudaStream_t s);
// Accumulates sum((got - want)^2) and sum(want^2) into sums_device[0..1].
void compare(const void* got, const void* want, int64_t count, DType dtype, double* sums_device, cudaStream_t s);

}  // namespace nmkit::bench
