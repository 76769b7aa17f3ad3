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

#include "../ptx/address.cuh"
#include "../ptx/shared.cuh"
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

// ---- Deferred stores ------------------------------------------------------------------------------------------
// When D is 16-bit and its value is final in the consumers' registers (beta == 0, no GELU), a persistent kernel
// need not stop for its epilogue: the consumers stage act(alpha * acc + bias) in D's type and layout, a whole
// kRows x kCols unit at once, and go on to the next unit while spare warps copy the staged unit to D, 16 bytes
// per access. Layout (16-bit elements): row-major D [kRows][kCols + kOutputPad], col-major D
// [kCols][kRows + kOutputPad]. The pad keeps runs 16-byte aligned and puts the 8 rows (or 4 column pairs) of a
// warp's fragment stores in different banks.
inline constexpr int kOutputPad = 8;
inline constexpr int kOutputVector = 8;  // 16-bit elements per 16-byte copy

template <int kRows, int kCols>
struct OutputTile {
  static constexpr int kRowMajorElements = kRows * (kCols + kOutputPad);
  static constexpr int kColMajorElements = kCols * (kRows + kOutputPad);
  static constexpr int kBytes = 2 * (kRowMajorElements > kColMajorElements ? kRowMajorElements : kColMajorElements);
  static_assert(kRows % kOutputVector == 0 && kCols % kOutputVector == 0, "whole 16-byte runs");
  uint32_t base;  // shared address, 16-byte aligned
};

// Whether a product can take the deferred path: what is staged must be D's final value, in D's 16-bit type.
__host__ __device__ constexpr bool deferred_store_applies(bool d_16bit, float beta, Activation activation) {
  return d_16bit && beta == 0.0f && activation != Activation::gelu;
}

template <class Out>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  static_assert(sizeof(Out) == 2, "16-bit outputs");
  const Out pair[2] = {static_cast<Out>(lo), static_cast<Out>(hi)};
  uint32_t bits;
  memcpy(&bits, pair, sizeof bits);
  return bits;
}

// Stages consumer warpgroup rows row_offset..row_offset + 63 of the unit (m64 x kCols accumulators in
// wgmma_ss.cuh / wgmma_sp.cuh register order) as final 16-bit values.
template <class Out, bool kColMajor, int kRows, int kCols, int kAccumulators, class P>
__device__ __forceinline__ void stage_outputs_as(const P& p, const OutputTile<kRows, kCols>& tile,
                                                 const float (&acc)[kAccumulators], int64_t m0, int row_offset,
                                                 int thread_in_group) {
  constexpr int kStride = (kColMajor ? kRows : kCols) + kOutputPad;
  static_assert(kAccumulators == kCols / 2, "an m64 x kCols accumulator tile");
  const int warp = thread_in_group / 32, lane = thread_in_group % 32, g = lane / 4, t = lane % 4;
  const bool relu = p.activation == Activation::relu;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_offset + warp * 16 + g + 8 * half;
    const float b = (p.bias && m0 + r < p.rows) ? __ldg(p.bias + m0 + r) : 0.0f;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      float v[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        v[e] = p.alpha * acc[4 * j + 2 * half + e] + b;
        if (relu) v[e] = fmaxf(v[e], 0.0f);
      }
      const uint32_t bits = pack_pair<Out>(v[0], v[1]);
      const int c = 8 * j + 2 * t;
      if constexpr (kColMajor) {
        ptx::st_shared_b16(tile.base + 2 * (c * kStride + r), static_cast<uint16_t>(bits));
        ptx::st_shared_b16(tile.base + 2 * ((c + 1) * kStride + r), static_cast<uint16_t>(bits >> 16));
      } else {
        ptx::st_shared_b32(tile.base + 2 * (r * kStride + c), bits);
      }
    }
  }
}

template <class Out, int kRows, int kCols, int kAccumulators, class P>
__device__ __forceinline__ void stage_outputs(const P& p, const OutputTile<kRows, kCols>& tile,
                                              const float (&acc)[kAccumulators], int64_t m0, int row_offset,
                                              int thread_in_group) {
  if (p.d_col_major) stage_outputs_as<Out, true>(p, tile, acc, m0, row_offset, thread_in_group);
  else stage_outputs_as<Out, false>(p, tile, acc, m0, row_offset, thread_in_group);
}

// Copies the staged unit to D at (m0, n0): 16-byte piece i for i = first, first + step, ...; R and C tails are
// skipped, and pieces that D's stride or address leave unaligned are stored element by element.
template <bool kColMajor, int kRows, int kCols, class P>
__device__ __forceinline__ void store_outputs_as(const P& p, const OutputTile<kRows, kCols>& tile, int64_t m0,
                                                 int64_t n0, int first, int step) {
  constexpr int kRunLen = kColMajor ? kRows : kCols;  // contiguous extent inside the unit
  constexpr int kRuns = kColMajor ? kCols : kRows;
  constexpr int kPiecesPerRun = kRunLen / kOutputVector;
  constexpr int kStride = kRunLen + kOutputPad;
  const int64_t ld = kColMajor ? p.rows : p.n;
  const int64_t run_room = kColMajor ? p.rows - m0 : p.n - n0;
  const int64_t runs_room = kColMajor ? p.n - n0 : p.rows - m0;
  const int run_limit = static_cast<int>(run_room < kRunLen ? run_room : kRunLen);
  const int runs_limit = static_cast<int>(runs_room < kRuns ? runs_room : kRuns);
  uint16_t* const origin = static_cast<uint16_t*>(p.d) + (kColMajor ? n0 * ld + m0 : m0 * ld + n0);
  const bool vector_stores = ld % kOutputVector == 0 && reinterpret_cast<uintptr_t>(origin) % 16 == 0;
  for (int i = first; i < kRuns * kPiecesPerRun; i += step) {
    const int run = i / kPiecesPerRun, pos = i % kPiecesPerRun * kOutputVector;
    if (run >= runs_limit || pos >= run_limit) continue;
    const uint4 piece = ptx::ld_shared_v4_b32(tile.base + 2 * (run * kStride + pos));
    uint16_t* const dst = origin + run * ld + pos;
    if (vector_stores && pos + kOutputVector <= run_limit) {
      *reinterpret_cast<uint4*>(dst) = piece;
      continue;
    }
    const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
#pragma unroll
    for (int e = 0; e < kOutputVector; ++e)
      if (pos + e < run_limit) dst[e] = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
  }
}

template <int kRows, int kCols, class P>
__device__ void store_outputs(const P& p, const OutputTile<kRows, kCols>& tile, int64_t m0, int64_t n0, int first,
                              int step) {
  if (p.d_col_major) store_outputs_as<true>(p, tile, m0, n0, first, step);
  else store_outputs_as<false>(p, tile, m0, n0, first, step);
}

// Named barrier `id` among the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(128) : "memory");
}

}  // namespace nmkit::gpu::sm90_epilogue
