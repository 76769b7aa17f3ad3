// A shared-memory tiled transpose of 16-bit matrices: each CTA reads a kTile x kTile block with coalesced loads along
// the source's rows and writes it with coalesced stores along the destination's rows. And a row copy that repads a
// matrix's rows to a 16-byte multiple.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/check.cuh"
#include "nmkit/error.hpp"
#include "transpose.hpp"

namespace nmkit::gpu {
namespace {

// A CTA moves a 64 x 64 tile of src; its 256 threads load and store 16-byte chunks of eight elements, so that a warp
// access covers whole 128-byte lines of both matrices.
constexpr int kTile = 64;
constexpr int kChunk = 8;  // 16-bit elements per 16-byte access
constexpr int kChunksPerLine = kTile / kChunk;
constexpr int kThreads = 256;
// Row padding of the tile in elements: a chunk's eight column reads then fall on at most two threads a bank.
constexpr int kPad = 2;

// kVector: every chunk is 16-byte aligned in src and dst (cols, src_ld and dst_ld multiples of 8, aligned bases), so
// a chunk is either wholly inside each matrix or wholly outside; otherwise element by element.
template <bool kVector>
__global__ void __launch_bounds__(kThreads)
    transpose_16bit_kernel(const uint16_t* __restrict__ src, int64_t src_ld, uint16_t* __restrict__ dst, int64_t rows,
                           int64_t cols, int64_t dst_ld) {
  __shared__ uint16_t tile[kTile][kTile + kPad];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  // Chunk (r, c) of the tile: src row row0 + r, columns col0 + 8c ... + 7; rows past `rows` are dst's zero padding.
  for (int i = threadIdx.x; i < kTile * kChunksPerLine; i += kThreads) {
    const int r = i / kChunksPerLine, c = i % kChunksPerLine * kChunk;
    const int64_t row = row0 + r, col = col0 + c;
    alignas(16) uint16_t v[kChunk] = {};
    if constexpr (kVector) {
      if (row < rows && col < cols)
        *reinterpret_cast<uint4*>(v) = __ldg(reinterpret_cast<const uint4*>(src + row * src_ld + col));
    } else {
#pragma unroll
      for (int e = 0; e < kChunk; ++e)
        if (row < rows && col + e < cols) v[e] = src[row * src_ld + col + e];
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) tile[r][c + e] = v[e];
  }
  __syncthreads();
  // Chunk (k, c) of dst: dst row col0 + k (src column col0 + k), columns row0 + 8c ... + 7.
  for (int i = threadIdx.x; i < kTile * kChunksPerLine; i += kThreads) {
    const int k = i / kChunksPerLine, c = i % kChunksPerLine * kChunk;
    const int64_t row = col0 + k, col = row0 + c;
    if (row >= cols) continue;
    alignas(16) uint16_t v[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] = tile[c + e][k];
    if constexpr (kVector) {
      if (col < dst_ld) *reinterpret_cast<uint4*>(dst + row * dst_ld + col) = *reinterpret_cast<const uint4*>(v);
    } else {
#pragma unroll
      for (int e = 0; e < kChunk; ++e)
        if (col + e < dst_ld) dst[row * dst_ld + col + e] = v[e];
    }
  }
}

// A thread writes one 16-byte chunk of dst (eight elements; dst_ld % 8 == 0 and dst aligned) from eight 2-byte loads
// of src at any alignment, which a warp still reads as 512 contiguous bytes; columns past `cols` are zero.
constexpr int kCopyThreads = 256;
__global__ void __launch_bounds__(kCopyThreads)
    repad_rows_16bit_kernel(const uint16_t* __restrict__ src, int64_t src_ld, uint16_t* __restrict__ dst,
                            int64_t dst_ld, int64_t rows, int64_t cols) {
  const int64_t chunks_per_row = dst_ld / kChunk, chunks = rows * chunks_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * kCopyThreads) {
    const int64_t row = i / chunks_per_row, col = i % chunks_per_row * kChunk;
    alignas(16) uint16_t v[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] = col + e < cols ? __ldg(src + row * src_ld + col + e) : uint16_t{0};
    *reinterpret_cast<uint4*>(dst + row * dst_ld + col) = *reinterpret_cast<const uint4*>(v);
  }
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

void transpose_16bit(Stream stream, const void* src, int64_t src_ld, void* dst, int64_t rows, int64_t cols,
                     int64_t dst_ld) {
  require(rows >= 0 && cols >= 0 && src_ld >= cols && dst_ld >= rows &&
              (dst_ld == 0 || cols == 0 || (src != nullptr && dst != nullptr)),
          ErrorCode::invalid_argument,
          "transpose_16bit: needs rows, cols >= 0, src_ld >= cols, dst_ld >= rows and non-null buffers");
  if (dst_ld == 0 || cols == 0) return;
  const int64_t grid_x = (cols + kTile - 1) / kTile, grid_y = (dst_ld + kTile - 1) / kTile;
  require(grid_y <= 65535, ErrorCode::unsupported, [&] {
    return "transpose_16bit: at most " + std::to_string(65535 * kTile) + " rows, got " + std::to_string(dst_ld);
  });
  const bool vector =
      cols % kChunk == 0 && src_ld % kChunk == 0 && dst_ld % kChunk == 0 && aligned16(src) && aligned16(dst);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  const auto* from = static_cast<const uint16_t*>(src);
  auto* to = static_cast<uint16_t*>(dst);
  if (vector)
    transpose_16bit_kernel<true><<<grid, kThreads, 0, stream>>>(from, src_ld, to, rows, cols, dst_ld);
  else
    transpose_16bit_kernel<false><<<grid, kThreads, 0, stream>>>(from, src_ld, to, rows, cols, dst_ld);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

void copy_rows_16bit(Stream stream, const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t rows,
                     int64_t cols) {
  require(rows >= 0 && cols >= 0 && src_ld >= cols && dst_ld >= cols && dst_ld % kChunk == 0 &&
              (rows == 0 || dst_ld == 0 || (src != nullptr && dst != nullptr && aligned16(dst))),
          ErrorCode::invalid_argument,
          "copy_rows_16bit: needs rows, cols >= 0, src_ld and dst_ld >= cols, dst_ld a multiple of 8, non-null "
          "buffers and dst 16-byte aligned");
  if (rows == 0 || dst_ld == 0) return;
  // A few waves of the grid-stride loop: enough copies in flight to stream at the memory's rate.
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t blocks = std::min(kMaxBlocks, (rows * (dst_ld / kChunk) + kCopyThreads - 1) / kCopyThreads);
  repad_rows_16bit_kernel<<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
      static_cast<const uint16_t*>(src), src_ld, static_cast<uint16_t*>(dst), dst_ld, rows, cols);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace nmkit::gpu
