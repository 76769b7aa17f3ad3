#pragma once
// The epilogue of the Hopper kernels (2:4 / V:N:M in sm90_kernel.cuh, tile-sparse in ../tile/sm90_tile_spmm.cu):
// consumer warpgroups hold m64nN wgmma accumulators in fp32. They stage alpha * acc + bias for a kRows x kCols
// tile of D in shared memory (the whole 128 x N CTA tile in the reused pipeline stages, or one warpgroup's
// 64 x kCols slice at a time in a buffer of its own), then write D (and read C) along D's contiguous direction,
// 4 elements per access, so that both layouts of D are written in whole sectors.
//
// Staged layout: col-major D: [kCols columns][kRows + kStagePad rows]; row-major D: [kRows rows][kCols + kStagePad].
// The padding of 4 floats keeps float4 alignment and spreads a warp's fragment stores over the banks.
#include <type_traits>

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
  __device__ float4 operator()(const float* staged) const { return *reinterpret_cast<const float4*>(staged); }
};

// Writes the staged tile at (m0, n0) of D: work item i (4 elements along D's contiguous direction) for
// i = first, first + step, ...; load_staged(address in the local tile) returns the 4 staged values (a split-K
// cluster sums its CTAs' tiles there). Applies beta * C and the activation; R and C tails are skipped.
template <class Out, int kRows, int kCols, class P, class LoadStaged>
__device__ void write_tile(const P& p, const EpilogueTile<kRows, kCols>& tile, int64_t m0, int64_t n0, int first, int step,
                           LoadStaged load_staged) {
  const int run_len = tile.col_major ? kRows : kCols;   // contiguous extent inside the tile
  const int runs = tile.col_major ? kCols : kRows;
  const int64_t ld = tile.col_major ? p.rows : p.n;               // global stride between runs
  const int64_t run_limit = tile.col_major ? p.rows - m0 : p.n - n0;
  const int64_t runs_limit = tile.col_major ? p.n - n0 : p.rows - m0;
  const int64_t origin = tile.col_major ? n0 * ld + m0 : m0 * ld + n0;
  const bool aligned = ld % kVector == 0 && origin % kVector == 0 && (reinterpret_cast<uintptr_t>(p.d) % 16 == 0) &&
                       (p.beta == 0.0f || reinterpret_cast<uintptr_t>(p.c) % 16 == 0);
  for (int i = first; i < runs * (run_len / kVector); i += step) {
    const int run = i / (run_len / kVector), pos = (i % (run_len / kVector)) * kVector;
    if (run >= runs_limit || pos >= run_limit) continue;
    const int64_t index = origin + run * ld + pos;
    const float4 staged = load_staged(&(tile.col_major ? tile.at(pos, run) : tile.at(run, pos)));
    float v[kVector] = {staged.x, staged.y, staged.z, staged.w};
    const int valid = run_limit - pos < kVector ? static_cast<int>(run_limit - pos) : kVector;
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      if (e < valid && p.beta != 0.0f) v[e] += p.beta * nm24::load_out<Out>(p.c, index + e);
      v[e] = nm24::activate(p.activation, v[e]);
    }
    if (aligned && valid == kVector) {
      store_vector<Out>(p, index, v);
    } else {
      for (int e = 0; e < valid; ++e) nm24::store_out<Out>(p.d, index + e, v[e]);
    }
  }
}

}  // namespace nmkit::gpu::sm90_epilogue
