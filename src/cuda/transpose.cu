// A shared-memory tiled transpose of 16-bit matrices: each CTA reads a kTile x kTile block with coalesced loads along
// the source's rows and writes it with coalesced stores along the destination's rows.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/check.cuh"
#include "nmkit/error.hpp"
#include "transpose.hpp"

namespace nmkit::gpu {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // a 32 x 8 thread block moves its 32 x 32 tile in four passes

__global__ void __launch_bounds__(kTile* kRowsPerPass)
    transpose_16bit_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, int64_t rows, int64_t cols,
                           int64_t dst_ld) {
  __shared__ uint16_t tile[kTile][kTile + 1];  // + 1: the column reads below fall in different banks
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = row0 + i, c = col0 + threadIdx.x;
    if (c < cols) tile[i][threadIdx.x] = r < rows ? src[r * cols + c] : uint16_t{0};  // zeros: dst's padding
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = col0 + i, c = row0 + threadIdx.x;  // dst row r is src column r
    if (r < cols && c < dst_ld) dst[r * dst_ld + c] = tile[threadIdx.x][i];
  }
}

}  // namespace

void transpose_16bit(Stream stream, const void* src, void* dst, int64_t rows, int64_t cols, int64_t dst_ld) {
  require(rows >= 0 && cols >= 0 && dst_ld >= rows && (dst_ld == 0 || cols == 0 || (src != nullptr && dst != nullptr)),
          ErrorCode::invalid_argument, "transpose_16bit: needs rows, cols >= 0, dst_ld >= rows and non-null buffers");
  if (dst_ld == 0 || cols == 0) return;
  const int64_t grid_x = (cols + kTile - 1) / kTile, grid_y = (dst_ld + kTile - 1) / kTile;
  require(grid_y <= 65535, ErrorCode::unsupported, [&] {
    return "transpose_16bit: at most " + std::to_string(65535 * kTile) + " rows, got " + std::to_string(dst_ld);
  });
  transpose_16bit_kernel<<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)),
                           dim3(kTile, kRowsPerPass), 0, stream>>>(static_cast<const uint16_t*>(src),
                                                                   static_cast<uint16_t*>(dst), rows, cols, dst_ld);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

void copy_device(Stream stream, void* dst, const void* src, std::size_t bytes) {
  NMKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace nmkit::gpu
