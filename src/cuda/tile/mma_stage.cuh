#pragma once
// The mma.sync tile kernels' shared-memory stage (sm80_tile_spmm.cu, stream_tile_spmm.cu): one stored tile and the
// kBlockN tokens of B it multiplies, copied by all of a CTA's threads with 16-byte cp.async, and the ldmatrix
// addressing that reads them back. Stage layout (halves): [A: tile_rows x tile_cols][B: K-major kBlockN x tile_cols
// (B col-major), or N-major tile_cols x kBlockN (B row-major)], every row swizzled by 16-byte chunks.
#include <cstdint>

#include "../ptx/cp_async.cuh"
#include "../ptx/ldmatrix.cuh"
#include "tile_common.cuh"

namespace nmkit::gpu::tile::mma_stage {

constexpr int kChunk = 8;  // halves per 16-byte chunk
constexpr int kMmaK = 16;  // k of one mma.sync m16n8k16

// Rows of `row_halves` halves in 16-byte chunks, chunk c of row r at c ^ (r % min(8, chunks)): ldmatrix's
// eight row addresses then fall in different bank groups. Chunks per row are powers of two (>= 2), so the
// modulo is a mask (the tile side is a run-time value: a division here would cost ~20 instructions per copy).
struct SwizzledRows {
  int row_halves;
  __device__ int offset(int row, int chunk) const {
    const int chunks = row_halves / kChunk;
    const int span_mask = (chunks < 8 ? chunks : 8) - 1;
    return row * row_halves + ((chunk ^ (row & span_mask)) * kChunk);
  }
};

// log2 of a power of two.
__device__ __forceinline__ int log2_of(int power_of_two) { return __ffs(power_of_two) - 1; }

__host__ __device__ constexpr int stage_halves(int tile_rows, int block_n, int tile_cols) {
  return (tile_rows + block_n) * tile_cols;
}

// Posts the copies of stored tile `tile` and of B's rows k0 .. k0 + tile_cols of its tile column `column` for
// tokens n0 .. n0 + kBlockN into `stage`, from kThreads threads. Elements past K or C are zero (A is zero there too, but
// B may hold anything, Inf included); without 16-byte alignment (b_vector false) B is copied element by element.
template <int kTileRows, int kBlockN, int kThreads>
__device__ void load_stage(const TileParams& p, uint16_t* stage, int64_t tile, int32_t column, int64_t n0, int tid) {
  const int tile_cols = p.tile_cols;
  const SwizzledRows a_rows{tile_cols};
  const uint16_t* a_src = p.tiles + tile * kTileRows * tile_cols;
  const int k_chunks = tile_cols / kChunk;  // 16-byte chunks along a tile row (and a K-major B row)
  const int k_chunk_bits = log2_of(k_chunks);
  for (int i = tid; i < kTileRows * k_chunks; i += kThreads) {
    const int row = i >> k_chunk_bits, chunk = i & (k_chunks - 1);
    ptx::cp_async_16(ptx::smem_address(stage + a_rows.offset(row, chunk)), a_src + row * tile_cols + chunk * kChunk, 16);
  }
  uint16_t* b_stage = stage + kTileRows * tile_cols;
  const auto* b = static_cast<const uint16_t*>(p.b);
  const int64_t k0 = int64_t{column} * tile_cols;
  if (p.b_col_major) {  // [n][k]: row n is x[n0 + n, k0 .. k0 + tile_cols)
    const SwizzledRows rows{tile_cols};
    for (int i = tid; i < kBlockN * k_chunks; i += kThreads) {
      const int row = i >> k_chunk_bits, chunk = i & (k_chunks - 1);
      const int64_t n = n0 + row, k = k0 + chunk * kChunk;
      uint16_t* dst = b_stage + rows.offset(row, chunk);
      if (p.b_vector) {
        const bool inside = n < p.n && k < p.cols;
        ptx::cp_async_16(ptx::smem_address(dst), inside ? b + n * p.cols + k : b, inside ? 16 : 0);
      } else {
        for (int e = 0; e < kChunk; ++e) dst[e] = (n < p.n && k + e < p.cols) ? b[n * p.cols + k + e] : uint16_t{0};
      }
    }
  } else {  // [k][n]: row k is B[k0 + k, n0 .. n0 + kBlockN)
    const SwizzledRows rows{kBlockN};
    constexpr int kChunksPerRow = kBlockN / kChunk;
    for (int i = tid; i < tile_cols * kChunksPerRow; i += kThreads) {
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int64_t k = k0 + row, n = n0 + chunk * kChunk;
      uint16_t* dst = b_stage + rows.offset(row, chunk);
      if (p.b_vector) {
        const bool inside = k < p.cols && n < p.n;
        ptx::cp_async_16(ptx::smem_address(dst), inside ? b + k * p.n + n : b, inside ? 16 : 0);
      } else {
        for (int e = 0; e < kChunk; ++e) dst[e] = (k < p.cols && n + e < p.n) ? b[k * p.n + n + e] : uint16_t{0};
      }
    }
  }
}

// B fragments of the n8 tiles n_base and n_base + 8 at k-step ks: {r0, r1} and {r2, r3}.
template <int kBlockN>
__device__ void load_b_pair(const TileParams& p, const uint16_t* b_stage, int ks, int n_base, int lane, uint32_t (&r)[4]) {
  if (p.b_col_major) {
    const SwizzledRows rows{p.tile_cols};
    const int row = n_base + lane % 8 + 8 * (lane / 16), chunk = 2 * ks + (lane / 8) % 2;
    ptx::ldmatrix_x4(r, ptx::smem_address(b_stage + rows.offset(row, chunk)));
  } else {
    const SwizzledRows rows{kBlockN};
    const int row = kMmaK * ks + lane % 8 + 8 * ((lane / 8) % 2), chunk = n_base / kChunk + lane / 16;
    ptx::ldmatrix_x4_trans(r, ptx::smem_address(b_stage + rows.offset(row, chunk)));
  }
}

// B fragment of the n8 tile n_base at k-step ks.
template <int kBlockN>
__device__ void load_b_single(const TileParams& p, const uint16_t* b_stage, int ks, int n_base, int lane, uint32_t (&r)[2]) {
  if (p.b_col_major) {
    const SwizzledRows rows{p.tile_cols};
    const int row = n_base + lane % 8, chunk = 2 * ks + (lane / 8) % 2;
    ptx::ldmatrix_x2(r, ptx::smem_address(b_stage + rows.offset(row, chunk)));
  } else {
    const SwizzledRows rows{kBlockN};
    const int row = kMmaK * ks + lane % 8 + 8 * ((lane / 8) % 2), chunk = n_base / kChunk;
    ptx::ldmatrix_x2_trans(r, ptx::smem_address(b_stage + rows.offset(row, chunk)));
  }
}

// A fragment of the m16 block at row m_base, k-step ks.
__device__ __forceinline__ void load_a(const TileParams& p, const uint16_t* a_stage, int ks, int m_base, int lane,
                                       uint32_t (&r)[4]) {
  const SwizzledRows rows{p.tile_cols};
  const int row = m_base + lane % 8 + 8 * ((lane / 8) % 2), chunk = 2 * ks + lane / 16;
  ptx::ldmatrix_x4(r, ptx::smem_address(a_stage + rows.offset(row, chunk)));
}

}  // namespace nmkit::gpu::tile::mma_stage
