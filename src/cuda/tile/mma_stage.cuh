#pragma once
// The mma.sync tile kernels' shared-memory stage (sm80_tile_spmm.cu, stream_tile_spmm.cu): one stored tile and the
// kBlockN tokens of B it multiplies, copied by all of a CTA's threads with 16-byte cp.async, and the ldmatrix
// addressing that reads them back. Stage layout (halves): [A: tile_rows x tile_cols][B: K-major kBlockN x tile_cols
// (B col-major), or N-major tile_cols x kBlockN (B row-major)], every row swizzled by 16-byte chunks.
//
// Both sides are worked out once per thread (StageCopier, FragmentOffsets), so that a tile's copies and fragment
// loads need no index arithmetic of their own: worked out per copy and per load they took ~300 warp instructions
// per tile, on the chain of every warp.
#include <cstdint>

#include "../ptx/cp_async.cuh"
#include "../ptx/ldmatrix.cuh"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "tile_common.cuh"

namespace nmkit::gpu::tile::mma_stage {

constexpr int kChunk = 8;  // halves per 16-byte chunk
constexpr int kMmaK = 16;  // k of one mma.sync m16n8k16
constexpr int kMaxTileCols = kMaxKernelTileSide;

// Rows of `row_halves` halves in 16-byte chunks, chunk c of row r at c ^ (r % min(8, chunks)): ldmatrix's
// eight row addresses then fall in different bank groups. Chunks per row are powers of two (>= 2), so the
// modulo is a mask.
struct SwizzledRows {
  int row_halves;
  __device__ int span_mask() const { return (row_halves / kChunk < 8 ? row_halves / kChunk : 8) - 1; }
  __device__ int offset(int row, int chunk) const {
    return row * row_halves + ((chunk ^ (row & span_mask())) * kChunk);
  }
};

__host__ __device__ constexpr int stage_halves(int tile_rows, int block_n, int tile_cols) {
  return (tile_rows + block_n) * tile_cols;
}

// log2 of a power of two.
__device__ __forceinline__ int log2_of(int power_of_two) { return __ffs(power_of_two) - 1; }

// One thread's copies of a stage. The thread copies chunks tid, tid + kThreads, ... of A (tile_rows x tile_cols,
// contiguous) and of B's part; kThreads is a multiple of the chunks per row and kThreads / chunks per row a multiple
// of the swizzle span (8 rows), so the j-th copy sits j * kThreads chunks past the first in the stage, the same
// column chunk of its row, and a fixed stride past it in A and in B.
template <int kTileRows, int kBlockN, int kThreads>
class StageCopier {
 public:
  __device__ StageCopier(const TileParams& p, int64_t n0, int tid) {
    static_assert(kThreads >= 128 && kThreads % 128 == 0, "whole rows and swizzle spans per pass");
    const int tile_cols = p.tile_cols, k_chunks = tile_cols / kChunk, k_chunk_bits = log2_of(k_chunks);
    const int a_chunks = kTileRows * k_chunks;
    a_count_ = tid < a_chunks ? (a_chunks - 1 - tid) / kThreads + 1 : 0;
    a_first_ = tid * kChunk;
    a_stage_first_ = SwizzledRows{tile_cols}.offset(tid >> k_chunk_bits, tid & (k_chunks - 1));
    b_stage_first_ = kTileRows * tile_cols;
    int b_chunks, rows_per_pass;
    if (p.b_col_major) {  // [n][k]: row n is x[n0 + n, k0 .. k0 + tile_cols)
      b_chunks = kBlockN * k_chunks, rows_per_pass = kThreads / k_chunks;
      const int row = tid >> k_chunk_bits, chunk = tid & (k_chunks - 1);
      b_stage_first_ += SwizzledRows{tile_cols}.offset(row, chunk);
      b_first_ = (n0 + row) * p.cols + chunk * kChunk;
      b_stride_ = int64_t{rows_per_pass} * p.cols;
      k_first_ = chunk * kChunk, k_stride_ = 0;
      for (int j = 0; j * kThreads + tid < b_chunks && j < kMaxB; ++j)
        tokens_inside_ |= (n0 + row + j * rows_per_pass < p.n) << j;
    } else {  // [k][n]: row k is B[k0 + k, n0 .. n0 + kBlockN)
      constexpr int kChunksPerRow = kBlockN / kChunk;
      b_chunks = tile_cols * kChunksPerRow, rows_per_pass = kThreads / kChunksPerRow;
      const int row = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
      b_stage_first_ += SwizzledRows{kBlockN}.offset(row, chunk);
      b_first_ = int64_t{row} * p.n + n0 + chunk * kChunk;
      b_stride_ = int64_t{rows_per_pass} * p.n;
      k_first_ = row, k_stride_ = rows_per_pass;
      for (int j = 0; j * kThreads + tid < b_chunks && j < kMaxB; ++j)
        tokens_inside_ |= (n0 + chunk * kChunk < p.n) << j;
    }
    b_count_ = tid < b_chunks ? (b_chunks - 1 - tid) / kThreads + 1 : 0;
    b_column_stride_ = p.b_col_major ? int64_t{tile_cols} : int64_t{tile_cols} * p.n;
  }

  // Posts the copies of stored tile `tile` and of B's rows k0 .. k0 + tile_cols of its tile column `column` for the
  // CTA's kBlockN tokens into `stage`. Elements past K or C are zero (A is zero there too, but B may hold anything,
  // Inf included); without 16-byte alignment (b_vector false) B is copied element by element.
  __device__ void post(const TileParams& p, uint16_t* stage, int64_t tile, int32_t column, int64_t n0, int tid) const {
    const uint16_t* a = p.tiles + tile * (kTileRows * p.tile_cols) + a_first_;
#pragma unroll
    for (int j = 0; j < kMaxA; ++j)
      if (j < a_count_) ptx::cp_async_16(ptx::smem_address(stage + a_stage_first_ + j * kPass), a + j * kPass, 16);
    if (!p.b_vector) return post_b_elementwise(p, stage + kTileRows * p.tile_cols, column, n0, tid);
    const auto* b = static_cast<const uint16_t*>(p.b);
    const uint16_t* b_column = b + column * b_column_stride_ + b_first_;
    const int64_t k0 = int64_t{column} * p.tile_cols;
#pragma unroll
    for (int j = 0; j < kMaxB; ++j)
      if (j < b_count_) {
        const bool inside = (tokens_inside_ >> j & 1) && k0 + k_first_ + j * k_stride_ < p.cols;
        ptx::cp_async_16(ptx::smem_address(stage + b_stage_first_ + j * kPass), inside ? b_column + j * b_stride_ : b,
                         inside ? 16 : 0);
      }
  }

 private:
  static constexpr int kPass = kThreads * kChunk;  // halves between a thread's copies, in the stage and in A
  static constexpr int kMaxA = (kTileRows * kMaxTileCols / kChunk + kThreads - 1) / kThreads;
  static constexpr int kMaxB = (kBlockN * kMaxTileCols / kChunk + kThreads - 1) / kThreads;
  static_assert(kMaxB <= 32, "one bit per B copy");

  // B without 16-byte copies (a leading dimension or address that is not a multiple of 8 elements).
  __device__ static void post_b_elementwise(const TileParams& p, uint16_t* b_stage, int32_t column, int64_t n0,
                                            int tid) {
    const auto* b = static_cast<const uint16_t*>(p.b);
    const int tile_cols = p.tile_cols, k_chunks = tile_cols / kChunk, k_chunk_bits = log2_of(k_chunks);
    const int64_t k0 = int64_t{column} * tile_cols;
    if (p.b_col_major) {
      const SwizzledRows rows{tile_cols};
      for (int i = tid; i < kBlockN * k_chunks; i += kThreads) {
        const int row = i >> k_chunk_bits, chunk = i & (k_chunks - 1);
        const int64_t n = n0 + row, k = k0 + chunk * kChunk;
        uint16_t* dst = b_stage + rows.offset(row, chunk);
        for (int e = 0; e < kChunk; ++e) dst[e] = (n < p.n && k + e < p.cols) ? b[n * p.cols + k + e] : uint16_t{0};
      }
    } else {
      const SwizzledRows rows{kBlockN};
      constexpr int kChunksPerRow = kBlockN / kChunk;
      for (int i = tid; i < tile_cols * kChunksPerRow; i += kThreads) {
        const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
        const int64_t k = k0 + row, n = n0 + chunk * kChunk;
        uint16_t* dst = b_stage + rows.offset(row, chunk);
        for (int e = 0; e < kChunk; ++e) dst[e] = (k < p.cols && n + e < p.n) ? b[k * p.n + n + e] : uint16_t{0};
      }
    }
  }

  int a_count_, b_count_;
  int a_first_;                        // halves into the tile
  int a_stage_first_, b_stage_first_;  // halves into the stage
  int64_t b_first_, b_stride_;         // halves into B (less the tile column's offset), and between passes
  int64_t b_column_stride_;            // halves of B per tile column
  int k_first_, k_stride_;             // the first copy's k in its tile column, and per pass
  uint32_t tokens_inside_ = 0;         // bit j: copy j's tokens are inside C
};

// A lane's ldmatrix addresses in a stage, for a warp whose m16 blocks start at row m_base of the tile and whose n8
// blocks start at token n_base. The swizzle term of a row is a lane constant (blocks start at multiples of 8 rows),
// and k-step ks moves the chunk by 2 ks (B row-major: 16 rows), so a fragment's address is a base plus an XOR.
template <int kBlockN>
class FragmentOffsets {
 public:
  __device__ FragmentOffsets(const TileParams& p, int m_base, int n_base, int lane) : tile_cols_(p.tile_cols) {
    const int span_mask = SwizzledRows{tile_cols_}.span_mask();
    const int a_row = m_base + lane % 8 + 8 * ((lane / 8) % 2);
    a_row_ = a_row * tile_cols_;
    a_xor_ = (lane / 16) ^ (a_row & span_mask);
    b_col_major_ = p.b_col_major;
    if (p.b_col_major) {  // pairs: rows n_base + lane % 8 (+ 8 for lanes 16..31), chunk 2 ks + (lane / 8) % 2
      const int b_row = n_base + lane % 8 + 8 * (lane / 16);
      b_pair_ = b_row * tile_cols_;
      b_single_ = (n_base + lane % 8) * tile_cols_;
      b_xor_ = ((lane / 8) % 2) ^ (lane % 8 & span_mask);
    } else {  // rows 16 ks + lane % 8 (+ 8 for lanes 8..15, 24..31), chunk n_base / 8 (+ 1 for lanes 16..31)
      const SwizzledRows rows{kBlockN};
      const int b_row = lane % 8 + 8 * ((lane / 8) % 2);
      b_pair_ = rows.offset(b_row, n_base / kChunk + lane / 16);
      b_single_ = rows.offset(b_row, n_base / kChunk);
    }
  }

  // A fragment of m16 block mi at k-step ks.
  __device__ void load_a(const uint16_t* a_stage, int mi, int ks, uint32_t (&r)[4]) const {
    ptx::ldmatrix_x4(r, ptx::smem_address(a_stage + a_row_ + mi * 16 * tile_cols_ + ((2 * ks ^ a_xor_) * kChunk)));
  }
  // B fragments of the n8 blocks 2 jp and 2 jp + 1 at k-step ks: {r0, r1} and {r2, r3}.
  __device__ void load_b_pair(const uint16_t* b_stage, int jp, int ks, uint32_t (&r)[4]) const {
    if (b_col_major_) {
      ptx::ldmatrix_x4(r, ptx::smem_address(b_stage + b_pair_ + jp * 16 * tile_cols_ + ((2 * ks ^ b_xor_) * kChunk)));
    } else {
      // Pair jp's chunk is 2 jp past pair 0's. A warp with two pairs starts at a multiple of 4 chunks, so pair 0's
      // chunk has bit 1 clear and adding 2 is setting that bit: the same as XOR-ing it after the row swizzle.
      ptx::ldmatrix_x4_trans(r, ptx::smem_address(b_stage + (b_pair_ ^ (jp * 2 * kChunk)) + ks * kRowMajorKStep));
    }
  }
  // B fragment of the single n8 block at k-step ks.
  __device__ void load_b_single(const uint16_t* b_stage, int ks, uint32_t (&r)[2]) const {
    if (b_col_major_)
      ptx::ldmatrix_x2(r, ptx::smem_address(b_stage + b_single_ + ((2 * ks ^ b_xor_) * kChunk)));
    else
      ptx::ldmatrix_x2_trans(r, ptx::smem_address(b_stage + b_single_ + ks * kRowMajorKStep));
  }

 private:
  static constexpr int kRowMajorKStep = kMmaK * kBlockN;  // halves per k-step of a B row-major stage
  int tile_cols_, a_row_, a_xor_, b_pair_, b_single_, b_xor_ = 0;
  bool b_col_major_;
};

}  // namespace nmkit::gpu::tile::mma_stage
