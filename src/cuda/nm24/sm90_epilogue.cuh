#pragma once
// The epilogue of the Hopper kernels (2:4 / V:N:M in sm90_kernel.cuh, tile-sparse in ../tile/sm90_tile_spmm.cu):
// consumer warpgroups hold m64nN wgmma accumulators in fp32. They stage alpha * acc + bias for a kRows x kCols
// tile of D in shared memory (the whole 128 x N CTA tile in the reused pipeline stages, or one warpgroup's
// 64 x kCols slice at a time in a buffer of its own), then write D (and read C) along D's contiguous direction,
// 4 elements per access, so that both layouts of D are written in whole sectors.
//
// Staged layout: col-major D: [kCols columns][kRows + kStagePad rows]; row-major D: [kRows rows][kCols + kStagePad].
// The padding of 4 floats keeps float4 alignment and spreads a warp's fragment stores over the banks.
#include <cstring>
#include <type_traits>

#include "../common/named_barrier.cuh"
#include "../ptx/address.cuh"
#include "../ptx/shared.cuh"
#include "../ptx/stmatrix.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "nm24_common.cuh"

namespace nmkit::gpu::sm90_epilogue {

inline constexpr int kWarpgroupRows = 64;     // one m64 wgmma
inline constexpr int kEpilogueRows = 128;     // two consumer warpgroups
inline constexpr int kEpilogueThreads = 256;  // their threads
inline constexpr int kStagePad = 4;
inline constexpr int kVector = 4;

template <int kRows, int kCols>
struct EpilogueTile {
  static constexpr int kBytes = (kRows + kStagePad) * (kCols + kStagePad) * 4;  // enough for either layout
  bool col_major;
  float* data;
  __device__ int stride() const { return col_major ? kRows + kStagePad : kCols + kStagePad; }
  __device__ float& at(int r, int j) const { return col_major ? data[j * stride() + r] : data[r * stride() + j]; }
};

// The consumer warpgroups, without the producer.
__device__ __forceinline__ void consumer_sync() {
  cuda::named_barrier_sync<cuda::NamedBarrier::consumers, kEpilogueThreads>();
}

// Stages accumulator columns [first_column, first_column + kCols) of consumer warpgroup `warpgroup`'s m64nN
// accumulators (wgmma_ss.cuh / wgmma_sp.cuh register order) at tile rows row_offset..row_offset + 63:
// tile(row_offset + r, c) = alpha * acc(r, first_column + c) + bias[m0 + row_offset + r] (bias may be null; rows
// past R get none). first_column must fold to a constant (an unrolled loop) so that acc stays in registers.
template <int kRows, int kCols, int kAccumulators, class P>
__device__ __forceinline__ void stage_accumulators(const P& p, const EpilogueTile<kRows, kCols>& tile,
                                                   const float (&acc)[kAccumulators], const float* bias, int64_t m0,
                                                   int row_offset, int first_column, int thread_in_group) {
  const int warp = thread_in_group / 32, lane = thread_in_group % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_offset + warp * 16 + g + 8 * half;
    const float b = (bias && m0 + r < p.rows) ? __ldg(bias + m0 + r) : 0.0f;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        tile.at(r, 8 * j + 2 * t + e) = p.alpha * acc[4 * (first_column / 8 + j) + 2 * half + e] + b;
  }
}

template <class Out, class P>
__device__ __forceinline__ void store_vector(const P& p, int64_t index, const float (&v)[kVector]) {
  if constexpr (std::is_same_v<Out, float>) {
    *reinterpret_cast<float4*>(static_cast<float*>(p.d) + index) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    Out h[kVector];
#pragma unroll
    for (int i = 0; i < kVector; ++i) h[i] = static_cast<Out>(v[i]);
    *reinterpret_cast<uint2*>(static_cast<Out*>(p.d) + index) = *reinterpret_cast<const uint2*>(h);
  }
}

// The staged value at a shared address, as is.
struct LocalStaged {
  __device__ float4 operator()(const float* staged) const {
    const uint4 v = ptx::ld_shared_v4_b32(ptx::smem_address(staged));
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
  }
};

// Writes the staged tile's runs along D's contiguous direction (kColMajor: D col-major, a run is a column).
// Index arithmetic is by compile-time powers of two and one 64-bit multiply per 4-element vector: this loop is
// the whole epilogue of a short-K product, and its first version (runtime layout, a division per vector, the
// vector in local memory) took ~9 us per 128 x 256 tile (Nsight source counters, tile kernel).
template <class Out, bool kColMajor, int kRows, int kCols, class P, class LoadStaged>
__device__ __forceinline__ void write_runs(const P& p, const EpilogueTile<kRows, kCols>& tile, int64_t m0, int64_t n0,
                                           int first, int step, LoadStaged load_staged) {
  constexpr int kRunLen = kColMajor ? kRows : kCols;  // contiguous extent inside the tile
  constexpr int kRuns = kColMajor ? kCols : kRows;
  constexpr int kVectorsPerRun = kRunLen / kVector;
  constexpr int kStride = kRunLen + kStagePad;  // EpilogueTile::stride() for this layout
  static_assert(kRunLen % kVector == 0, "whole vectors per run");
  const int64_t ld = kColMajor ? p.rows : p.n;
  const int64_t run_room = kColMajor ? p.rows - m0 : p.n - n0;   // elements left along a run
  const int64_t runs_room = kColMajor ? p.n - n0 : p.rows - m0;  // runs left
  const int run_limit = static_cast<int>(run_room < kRunLen ? run_room : kRunLen);
  const int runs_limit = static_cast<int>(runs_room < kRuns ? runs_room : kRuns);
  const int64_t origin = kColMajor ? n0 * ld + m0 : m0 * ld + n0;
  // Whole vectors stored as one 4-element access when D allows it and C is not read.
  const bool vector_stores =
      p.beta == 0.0f && ld % kVector == 0 &&
      reinterpret_cast<uintptr_t>(static_cast<Out*>(p.d) + origin) % (kVector * sizeof(Out)) == 0;
  for (int i = first; i < kRuns * kVectorsPerRun; i += step) {
    const int run = i / kVectorsPerRun, pos = i % kVectorsPerRun * kVector;
    if (run >= runs_limit || pos >= run_limit) continue;
    const float4 staged = load_staged(tile.data + run * kStride + pos);
    float v[kVector] = {staged.x, staged.y, staged.z, staged.w};
    const int64_t index = origin + run * ld + pos;
    if (vector_stores && pos + kVector <= run_limit) {
#pragma unroll
      for (int e = 0; e < kVector; ++e) v[e] = nm24::activate(p.activation, v[e]);
      store_vector<Out>(p, index, v);
      continue;
    }
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      if (pos + e >= run_limit) break;
      float x = v[e];
      if (p.beta != 0.0f) x += p.beta * nm24::load_out<Out>(p.c, index + e);
      nm24::store_out<Out>(p.d, index + e, nm24::activate(p.activation, x));
    }
  }
}

// Writes the staged tile at (m0, n0) of D: work item i (4 elements along D's contiguous direction) for
// i = first, first + step, ...; load_staged(address in the local tile) returns the 4 staged values (a split-K
// cluster sums its CTAs' tiles there). Applies beta * C and the activation; R and C tails are skipped.
template <class Out, int kRows, int kCols, class P, class LoadStaged>
__device__ void write_tile(const P& p, const EpilogueTile<kRows, kCols>& tile, int64_t m0, int64_t n0, int first,
                           int step, LoadStaged load_staged) {
  if (tile.col_major)
    write_runs<Out, true>(p, tile, m0, n0, first, step, load_staged);
  else
    write_runs<Out, false>(p, tile, m0, n0, first, step, load_staged);
}

// ---- Deferred stores ------------------------------------------------------------------------------------------
// When D is 16-bit and its value is final in the consumers' registers (beta == 0, no GELU), a persistent kernel
// need not stop for its epilogue: the consumers stage act(alpha * acc + bias) in D's type (a whole kRows x kCols
// unit in the tile kernel; 64 x 64 parts per warpgroup in the 2:4 / V:N:M kernel's register epilogue) and go on
// while one thread has the copy engine store the staged outputs to D by TMA (R and C tails clipped by the tensor
// map). The unit is staged as the copy engine's boxes, 128-byte lines with the 128-byte swizzle (16-byte chunk c
// of line l at chunk c ^ (l % 8)), each line 64 contiguous elements of D: row-major D as kCols / 64 boxes of
// [kRows rows][64 tokens], col-major D as kRows / 64 boxes of [kCols tokens][64 rows]. The swizzle also spreads a
// warp's fragment stores over all banks.
inline constexpr int kLineElements = 64;  // 16-bit elements per 128-byte swizzled line
inline constexpr int kLineBytes = 128;

template <int kRows, int kCols>
struct OutputTile {
  static constexpr int kBytes = kRows * kCols * 2;
  static constexpr bool kWholeBoxes = kRows % kLineElements == 0 && kCols % kLineElements == 0;
  uint32_t base;  // shared address, 1024-byte aligned (the swizzle atom)

  // Bytes of one store box: kCols lines (col-major D) or kRows lines (row-major D) of 128 bytes.
  static constexpr int box_bytes(bool col_major) { return (col_major ? kCols : kRows) * kLineBytes; }
};

// Whether D's final values are in the consumers' registers, ready to store as they are (the tile kernel's
// deferred store, the 2:4 / V:N:M kernel's register epilogue): D 16-bit, no C to add, no GELU (its polynomial,
// unrolled over every accumulator, bloats the kernel; it takes the staged epilogue), and D's stride (elements
// between consecutive rows of row-major D, columns of col-major D) a multiple of 16 bytes, for the tensor map.
__host__ __device__ constexpr bool outputs_final_in_registers(bool d_16bit, float beta, Activation activation,
                                                              int64_t d_stride) {
  return d_16bit && beta == 0.0f && activation != Activation::gelu && d_stride % 8 == 0;
}

// A consumer warpgroup's outputs as final 16-bit pairs (alpha, bias, ReLU applied): pair 2 j + half holds this
// thread's two tokens 8 j + 2 (t % 4), +1 of row row_offset + 16 warp + g + 8 half (t = lane, g = lane / 4), the
// m64 x kCols accumulators of wgmma_ss.cuh / wgmma_sp.cuh in register order.
template <class Out, int kAccumulators, class P>
__device__ __forceinline__ void pack_outputs(const P& p, const float (&acc)[kAccumulators], int64_t m0, int row_offset,
                                             int thread_in_group, uint32_t (&pairs)[kAccumulators / 2]) {
  const int warp = thread_in_group / 32, g = thread_in_group % 32 / 4;
  const bool relu = p.activation == Activation::relu;
  float bias[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = m0 + row_offset + 16 * warp + g + 8 * half;
    bias[half] = (p.bias && row < p.rows) ? __ldg(p.bias + row) : 0.0f;
  }
#pragma unroll
  for (int q = 0; q < kAccumulators / 2; ++q) {
    float v[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      v[e] = p.alpha * acc[2 * q + e] + bias[q % 2];
      if (relu) v[e] = fmaxf(v[e], 0.0f);
    }
    pairs[q] = nm24::pack_pair<Out>(v[0], v[1]);
  }
}

// Stores pack_outputs' pairs (rows row_offset..row_offset + 63 of the tile) and makes them visible to the copy
// engine (the caller's barrier arrival hands them over).
// Each 8 x 8 block of a warp's outputs (rows r0..r0 + 7, r0 = row_offset + 16 warp + 8 half; tokens 8 j..8 j + 7)
// is one stmatrix matrix, its fragment exactly the pairs' (lane t: row t / 4, tokens 2 (t % 4), +1): row-major D
// takes it as 8 lines of 16 bytes (rows), col-major D transposed (8 token lines). An instruction stores four,
// pairs 2 j..2 j + 3 = (half 0, j), (half 1, j), (half 0, j + 1), (half 1, j + 1), 16 bytes per lane and row, where
// 2- and 4-byte stores took 8 or 4 times the instructions and half-empty shared-memory wavefronts.
// The shared addresses are one per-lane base and compile-time offsets: a persistent kernel hoists whatever it can
// out of its unit loop, and a general (row, col) -> address map there spilled.
template <bool kColMajor, int kRows, int kCols>
__device__ __forceinline__ void store_outputs_as(const OutputTile<kRows, kCols>& tile,
                                                 const uint32_t (&pairs)[kCols / 4], int row_offset,
                                                 int thread_in_group) {
  static_assert(OutputTile<kRows, kCols>::kWholeBoxes, "whole boxes of 64-element lines");
  constexpr int kBoxBytes = OutputTile<kRows, kCols>::box_bytes(kColMajor);
  const int warp = thread_in_group / 32, lane = thread_in_group % 32;
  // The matrix this lane addresses (m = lane / 8: half m % 2, token group j + m / 2) and its row i = lane % 8.
  const int m = lane / 8, i = lane % 8, r0 = row_offset + 16 * warp + 8 * (m % 2), dj = m / 2;
  // Row-major D: line r0 + i, element 8 (j + dj) + c of box (j + dj) / 8, at chunk ((j + dj) % 8) ^ i; j even, so
  // (j + dj) / 8 = j / 8 and the chunk is (j % 8) ^ dj ^ i: the base holds dj ^ i, XOR adds j % 8.
  // Col-major D: line 8 (j + dj) + i (a token) of box r0 / 64, element r0 % 64 + c at chunk ((r0 % 64) / 8) ^ i.
  const uint32_t lane_base = kColMajor ? tile.base + (r0 / kLineElements) * kBoxBytes + (8 * dj + i) * kLineBytes +
                                             ((((r0 % kLineElements) / 8) ^ i) << 4)
                                       : tile.base + (r0 + i) * kLineBytes + ((dj ^ i) << 4);
#pragma unroll
  for (int j = 0; j < kCols / 8; j += 2) {
    const uint32_t(&four)[4] = *reinterpret_cast<const uint32_t(*)[4]>(pairs + 2 * j);
    if constexpr (kColMajor)
      ptx::stmatrix_x4_trans(lane_base + j * 8 * kLineBytes, four);
    else
      ptx::stmatrix_x4((lane_base ^ ((j % 8) << 4)) + (j / 8) * kBoxBytes, four);
  }
  ptx::fence_proxy_async_shared();  // the stores above, before the copy engine reads them
}

template <int kRows, int kCols>
__device__ __forceinline__ void store_outputs(bool col_major, const OutputTile<kRows, kCols>& tile,
                                              const uint32_t (&pairs)[kCols / 4], int row_offset, int thread_in_group) {
  if (col_major)
    store_outputs_as<true>(tile, pairs, row_offset, thread_in_group);
  else
    store_outputs_as<false>(tile, pairs, row_offset, thread_in_group);
}

// Stages consumer warpgroup rows row_offset..row_offset + 63 of the tile (pack_outputs, then store_outputs).
template <class Out, int kRows, int kCols, int kAccumulators, class P>
__device__ __forceinline__ void stage_outputs(const P& p, const OutputTile<kRows, kCols>& tile,
                                              const float (&acc)[kAccumulators], int64_t m0, int row_offset,
                                              int thread_in_group) {
  static_assert(kAccumulators == kCols / 2, "an m64 x kCols accumulator tile");
  uint32_t pairs[kAccumulators / 2];
  pack_outputs<Out>(p, acc, m0, row_offset, thread_in_group, pairs);
  store_outputs(p.d_col_major, tile, pairs, row_offset, thread_in_group);
}

// One thread: has the copy engine store the staged unit to D at (m0, n0) through `d_map` (D as a 2-D tensor,
// contiguous dimension first, boxes of 64 x kCols for col-major D, 64 x kRows for row-major D), as one bulk group.
template <int kRows, int kCols>
__device__ __forceinline__ void issue_staged_store(const void* d_map, const OutputTile<kRows, kCols>& tile,
                                                   bool col_major, int64_t m0, int64_t n0) {
  static_assert(OutputTile<kRows, kCols>::kWholeBoxes, "whole boxes of 64-element lines");
  if (col_major) {
#pragma unroll
    for (int box = 0; box < kRows / kLineElements; ++box)
      ptx::tma_store_2d(d_map, tile.base + box * OutputTile<kRows, kCols>::box_bytes(true),
                        static_cast<int32_t>(m0 + box * kLineElements), static_cast<int32_t>(n0));
  } else {
#pragma unroll
    for (int box = 0; box < kCols / kLineElements; ++box)
      ptx::tma_store_2d(d_map, tile.base + box * OutputTile<kRows, kCols>::box_bytes(false),
                        static_cast<int32_t>(n0 + box * kLineElements), static_cast<int32_t>(m0));
  }
  ptx::bulk_commit_group();
}

}  // namespace nmkit::gpu::sm90_epilogue
