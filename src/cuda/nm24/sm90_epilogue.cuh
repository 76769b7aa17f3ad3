#pragma once
// The epilogue of the Hopper kernels (2:4 / V:N:M in sm90_kernel.cuh, tile-sparse in ../tile/sm90_tile_spmm.cu):
// consumer warpgroups hold m64nN wgmma accumulators in fp32. They stage alpha * acc + bias for a kRows x kCols
// tile of D in shared memory (the whole 128 x N CTA tile in the reused pipeline stages, or one warpgroup's
// 64 x kCols slice at a time in a buffer of its own), then write D (and read C) along D's contiguous direction,
// 4 elements per access, so that both layouts of D are written in whole sectors.
//
// The fast path (store_chunk_by_tma, below) skips the fp32 staging when D can take TMA stores: a warpgroup
// converts its values to 16 bits straight into a box of D's tensor map and one thread stores the box.
//
// Staged layout: col-major D: [kCols columns][kRows + kStagePad rows]; row-major D: [kRows rows][kCols + kStagePad].
// The padding of 4 floats keeps float4 alignment and spreads a warp's fragment stores over the banks.
#include <cuda.h>

#include <type_traits>

#include "../ptx/address.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "nm24_common.cuh"

namespace nmkit::gpu::sm90_epilogue {

inline constexpr int kWarpgroupRows = 64;        // one m64 wgmma
inline constexpr int kEpilogueRows = 128;        // two consumer warpgroups
inline constexpr int kEpilogueThreads = 256;     // their threads
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

// Named barrier 1 among the two consumer warpgroups only.
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kEpilogueThreads) : "memory");
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
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(ptx::smem_address(staged)));
    return v;
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
  constexpr int kStride = kRunLen + kStagePad;        // EpilogueTile::stride() for this layout
  static_assert(kRunLen % kVector == 0, "whole vectors per run");
  const int64_t ld = kColMajor ? p.rows : p.n;
  const int64_t run_room = kColMajor ? p.rows - m0 : p.n - n0;   // elements left along a run
  const int64_t runs_room = kColMajor ? p.n - n0 : p.rows - m0;  // runs left
  const int run_limit = static_cast<int>(run_room < kRunLen ? run_room : kRunLen);
  const int runs_limit = static_cast<int>(runs_room < kRuns ? runs_room : kRuns);
  const int64_t origin = kColMajor ? n0 * ld + m0 : m0 * ld + n0;
  // Whole vectors stored as one 4-element access when D allows it and C is not read.
  const bool vector_stores = p.beta == 0.0f && ld % kVector == 0 &&
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
__device__ void write_tile(const P& p, const EpilogueTile<kRows, kCols>& tile, int64_t m0, int64_t n0, int first, int step,
                           LoadStaged load_staged) {
  if (tile.col_major) write_runs<Out, true>(p, tile, m0, n0, first, step, load_staged);
  else write_runs<Out, false>(p, tile, m0, n0, first, step, load_staged);
}

// ---- TMA stores: beta == 0, 16-bit D, D's base and leading dimension 16-byte aligned (tma_store_possible) ----
// A consumer warpgroup writes act(alpha * acc + bias) of a 64-row x 32-column chunk of D, converted to 16 bits,
// into a shared buffer laid out as one box of D's tensor map, and its first thread stores the box with
// cp.async.bulk.tensor (which writes only what lies inside D: no tail code). Boxes: col-major D {64 rows, 32
// columns} with the 128-byte swizzle (a column of the chunk is one 128-byte row of the box); row-major D {32
// columns, 64 rows} with the 64-byte swizzle. The swizzles spread a warp's fragment stores over all banks. A
// warpgroup alternates kStoreBuffers buffers, so a chunk's store overlaps the staging of the next one.
inline constexpr int kStoreChunkCols = 32;
inline constexpr int kStoreBufferBytes = kWarpgroupRows * kStoreChunkCols * 2;  // 4 KiB
inline constexpr int kStoreBuffers = 2;
inline constexpr int kStoreBufferAlign = 1024;  // the 128-byte swizzle repeats every 8 rows of 128 bytes

template <class Out>
inline bool tma_store_possible(const void* d, int64_t leading_dimension, float beta) {
  return (std::is_same_v<Out, __half> || std::is_same_v<Out, __nv_bfloat16>) && beta == 0.0f &&
         reinterpret_cast<uintptr_t>(d) % 16 == 0 && leading_dimension * 2 % 16 == 0;
}

// D's tensor map for the chunk boxes (host side).
template <class Out>
CUtensorMap make_store_map(void* d, int64_t rows, int64_t n, bool col_major) {
  if constexpr (std::is_same_v<Out, float>) {
    throw Error(ErrorCode::unsupported, "TMA stores of D are for 16-bit outputs");
  } else {
    const auto r = static_cast<cuuint64_t>(rows), c = static_cast<cuuint64_t>(n);
    if (col_major)
      return cuda::make_tensor_map<Out, 2>(d, {r, c}, {r * 2}, {kWarpgroupRows, kStoreChunkCols}, CU_TENSOR_MAP_SWIZZLE_128B);
    return cuda::make_tensor_map<Out, 2>(d, {c, r}, {c * 2}, {kStoreChunkCols, kWarpgroupRows}, CU_TENSOR_MAP_SWIZZLE_64B);
  }
}

// Byte offset of chunk element (r, c), r < 64, c < 32, in its swizzled box: the 16-byte unit (address bits 4..6
// for 128 B, 4..5 for 64 B) is XORed with the box row (address bits 7..).
__device__ __forceinline__ uint32_t store_box_offset(bool col_major, int r, int c) {
  if (col_major) {
    const uint32_t o = c * 128 + r * 2;
    return o ^ (((o >> 7) & 7) << 4);
  }
  const uint32_t o = r * 64 + c * 2;
  return o ^ (((o >> 7) & 3) << 4);
}

template <class Out>
__device__ __forceinline__ uint16_t to_bits(float v) {
  const Out h = static_cast<Out>(v);
  return *reinterpret_cast<const uint16_t*>(&h);
}

// Named barrier `id` among the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(128) : "memory");
}

// Stores accumulator columns [first_column, first_column + 32) of a consumer warpgroup's m64nN accumulators as
// D(m0 + r, n0 + c) through buffer `chunk_index % kStoreBuffers` of `buffers` (kStoreBuffers x 4 KiB, 1024-aligned).
// first_column must fold to a constant (an unrolled loop); chunk_index counts the warpgroup's chunks, so that
// consecutive chunks alternate buffers. Every thread of the warpgroup calls it; `barrier_id` is the
// warpgroup's named barrier. The warpgroup's thread 0 issues the stores: it calls store_chunks_drain before
// the shared memory is reused for anything else or the CTA exits.
template <class Out, int kAccumulators, class P>
__device__ __forceinline__ void store_chunk_by_tma(const P& p, const CUtensorMap* d_map, unsigned char* buffers,
                                                   const float (&acc)[kAccumulators], const float* bias, int64_t m0,
                                                   int64_t n0, int first_column, int chunk_index, int thread_in_group,
                                                   int barrier_id) {
  const bool col_major = p.d_col_major;
  const uint32_t buffer = ptx::smem_address(buffers + (chunk_index % kStoreBuffers) * kStoreBufferBytes);
  if (thread_in_group == 0) ptx::bulk_wait_group_read<kStoreBuffers - 1>();  // this buffer's last store has read it
  warpgroup_barrier(barrier_id);
  const int warp = thread_in_group / 32, lane = thread_in_group % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + g + 8 * half;
    const float b = (bias && m0 + r < p.rows) ? __ldg(bias + m0 + r) : 0.0f;
#pragma unroll
    for (int j = 0; j < kStoreChunkCols / 8; ++j) {
      const int c = 8 * j + 2 * t;
      const int a = 4 * (first_column / 8 + j) + 2 * half;
      const uint16_t v0 = to_bits<Out>(nm24::activate(p.activation, p.alpha * acc[a] + b));
      const uint16_t v1 = to_bits<Out>(nm24::activate(p.activation, p.alpha * acc[a + 1] + b));
      if (col_major) {  // columns c and c + 1 are two rows of the box
        asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(buffer + store_box_offset(true, r, c)), "h"(v0) : "memory");
        asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(buffer + store_box_offset(true, r, c + 1)), "h"(v1) : "memory");
      } else {  // adjacent in the box row
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(buffer + store_box_offset(false, r, c)),
                     "r"(static_cast<uint32_t>(v0) | static_cast<uint32_t>(v1) << 16)
                     : "memory");
      }
    }
  }
  ptx::fence_proxy_async_shared();  // the generic-proxy writes, before the async proxy reads them
  warpgroup_barrier(barrier_id);
  if (thread_in_group == 0) {
    const int64_t column = n0 + first_column;
    ptx::tma_store_2d(d_map, buffers + (chunk_index % kStoreBuffers) * kStoreBufferBytes,
                      static_cast<int32_t>(col_major ? m0 : column), static_cast<int32_t>(col_major ? column : m0));
    ptx::bulk_commit_group();
  }
}

// The issuing thread's stores have read their buffers (before the buffers are reused or the CTA exits).
__device__ __forceinline__ void store_chunks_drain(int thread_in_group) {
  if (thread_in_group == 0) ptx::bulk_wait_group_read<0>();
}

}  // namespace nmkit::gpu::sm90_epilogue
