// The transpose of 16-bit matrices, and a row copy that repads a matrix's rows to a 16-byte multiple.
//
// Where every 16-byte chunk is aligned in both matrices, a thread moves an 8 x 8 block with no shared memory: eight
// 16-byte loads (one per source row, all in flight at once), the block transposed in registers by 32 byte permutes,
// eight 16-byte stores (one per destination row). A warp's loads cover 4 source rows x 128 bytes per instruction
// and its stores 8 destination rows x 64 bytes, whole 32-byte sectors on both sides. Otherwise a shared-memory
// tile moves the matrix element by element.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/check.cuh"
#include "nmkit/error.hpp"
#include "transpose.hpp"

namespace nmkit::gpu {
namespace {

constexpr int kChunk = 8;  // 16-bit elements per 16-byte access, and the side of a thread's block

// The 8 x 8 blocks: lane l of a warp takes column block l % 8 and row block l / 8 of the warp's 4 x 8 blocks; a
// CTA's warps stack along the rows, so that a CTA writes 512 contiguous bytes of each destination row it touches.
constexpr int kBlockThreads = 256;
constexpr int kWarpRowBlocks = 4, kWarpColBlocks = 8;
constexpr int kCtaRowBlocks = kWarpRowBlocks * (kBlockThreads / 32), kCtaColBlocks = kWarpColBlocks;

// dst (cols x dst_ld) = src (rows x cols)^T with zeros past `rows`: cols, src_ld and dst_ld multiples of 8, both
// bases 16-byte aligned. Grid-stride over CTA tiles of kCtaRowBlocks x kCtaColBlocks blocks.
__global__ void __launch_bounds__(kBlockThreads)
    transpose_16bit_blocks_kernel(const uint16_t* __restrict__ src, int64_t src_ld, uint16_t* __restrict__ dst,
                                  int64_t rows, int64_t dst_ld, int64_t row_blocks, int64_t col_blocks,
                                  int64_t col_tiles, int64_t tiles) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t rb = tile / col_tiles * kCtaRowBlocks + warp * kWarpRowBlocks + lane / kWarpColBlocks;
    const int64_t cb = tile % col_tiles * kCtaColBlocks + lane % kWarpColBlocks;
    if (rb >= row_blocks || cb >= col_blocks) continue;
    // Word q of row j holds the block's elements (j, 2q) and (j, 2q + 1); rows past `rows` are dst's zero padding.
    uint4 in[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int64_t row = rb * kChunk + j;
      in[j] =
          row < rows ? __ldg(reinterpret_cast<const uint4*>(src + row * src_ld + cb * kChunk)) : make_uint4(0, 0, 0, 0);
    }
    const auto word = [&](int j, int q) {
      const uint4& v = in[j];
      return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
    };
    // Row i of the transposed block: word p holds elements (2p, i) and (2p + 1, i), the low (i even) or high halves
    // of word i / 2 of rows 2p and 2p + 1.
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const uint32_t halves = i % 2 == 0 ? 0x5410u : 0x7632u;
      uint32_t out[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) out[p] = __byte_perm(word(2 * p, i / 2), word(2 * p + 1, i / 2), halves);
      __stwb(reinterpret_cast<uint4*>(dst + (cb * kChunk + i) * dst_ld + rb * kChunk),
             make_uint4(out[0], out[1], out[2], out[3]));
    }
  }
}

// The element path: a CTA moves a 64 x 64 tile of src through shared memory, eight elements a thread and step,
// loaded along src's rows (all eight before the tile is written) and stored along dst's rows.
constexpr int kTile = 64;
constexpr int kChunksPerLine = kTile / kChunk;
constexpr int kTileThreads = 256;
// Row padding of the tile in elements: a chunk's eight column reads then fall on at most two threads a bank.
constexpr int kPad = 2;

__global__ void __launch_bounds__(kTileThreads)
    transpose_16bit_elements_kernel(const uint16_t* __restrict__ src, int64_t src_ld, uint16_t* __restrict__ dst,
                                    int64_t rows, int64_t cols, int64_t dst_ld) {
  __shared__ uint16_t tile[kTile][kTile + kPad];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  // Chunk (r, c) of the tile: src row row0 + r, columns col0 + 8c ... + 7; rows past `rows` are dst's zero padding.
  for (int i = threadIdx.x; i < kTile * kChunksPerLine; i += kTileThreads) {
    const int r = i / kChunksPerLine, c = i % kChunksPerLine * kChunk;
    const int64_t row = row0 + r, col = col0 + c;
    uint16_t v[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] = row < rows && col + e < cols ? src[row * src_ld + col + e] : uint16_t{0};
#pragma unroll
    for (int e = 0; e < kChunk; ++e) tile[r][c + e] = v[e];
  }
  __syncthreads();
  // Chunk (k, c) of dst: dst row col0 + k (src column col0 + k), columns row0 + 8c ... + 7.
  for (int i = threadIdx.x; i < kTile * kChunksPerLine; i += kTileThreads) {
    const int k = i / kChunksPerLine, c = i % kChunksPerLine * kChunk;
    const int64_t row = col0 + k, col = row0 + c;
    if (row >= cols) continue;
#pragma unroll
    for (int e = 0; e < kChunk; ++e)
      if (col + e < dst_ld) dst[row * dst_ld + col + e] = tile[c + e][k];
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
  const bool blocks =
      cols % kChunk == 0 && src_ld % kChunk == 0 && dst_ld % kChunk == 0 && aligned16(src) && aligned16(dst);
  const auto* from = static_cast<const uint16_t*>(src);
  auto* to = static_cast<uint16_t*>(dst);
  if (blocks) {
    const int64_t row_blocks = dst_ld / kChunk, col_blocks = cols / kChunk;
    const int64_t col_tiles = (col_blocks + kCtaColBlocks - 1) / kCtaColBlocks;
    const int64_t tiles = (row_blocks + kCtaRowBlocks - 1) / kCtaRowBlocks * col_tiles;
    // A few waves of the grid-stride loop: eight 16-byte loads in flight a thread stream at the memory's rate.
    constexpr int64_t kMaxCtas = 4096;
    transpose_16bit_blocks_kernel<<<static_cast<unsigned>(std::min(tiles, kMaxCtas)), kBlockThreads, 0, stream>>>(
        from, src_ld, to, rows, dst_ld, row_blocks, col_blocks, col_tiles, tiles);
  } else {
    const int64_t grid_x = (cols + kTile - 1) / kTile, grid_y = (dst_ld + kTile - 1) / kTile;
    require(grid_y <= 65535, ErrorCode::unsupported, [&] {
      return "transpose_16bit: at most " + std::to_string(65535 * kTile) + " rows, got " + std::to_string(dst_ld);
    });
    transpose_16bit_elements_kernel<<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), kTileThreads,
                                      0, stream>>>(from, src_ld, to, rows, cols, dst_ld);
  }
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
