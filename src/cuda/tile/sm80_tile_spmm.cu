// The portable tile-sparse SpMM (sm_80 .. sm_90): mma.sync m16n8k16 on each stored tile.
//
// A CTA computes one tile row (kTileRows rows) x kBlockN columns of D and walks the tiles of that row (CSR of
// tiles, pack_tiles): per stored tile, the A tile (contiguous, row-major) and the matching kTileCols rows of B
// are staged by cp.async into a two-stage shared-memory pipeline, then 4 warps (kBlockN / 4 columns each)
// multiply them with ldmatrix-fed mma.sync. Empty tile rows skip the loop: D = beta * C + bias there.
#include <cuda_runtime.h>

#include "../common/check.cuh"
#include "../common/smem.cuh"
#include "../nm24/nm24_common.cuh"
#include "../ptx/cp_async.cuh"
#include "../ptx/ldmatrix.cuh"
#include "../ptx/mma.cuh"
#include "tile_common.cuh"

namespace nmkit::gpu::tile {
namespace {

constexpr int kBlockN = 128;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpN = kBlockN / kWarps;   // 32 columns: 4 n8 tiles
constexpr int kTilesN = kWarpN / 8;
constexpr int kMmaK = 16;
constexpr int kChunk = 8;                  // halves per 16-byte chunk
constexpr int kStages = 2;

// Rows of `row_halves` halves in 16-byte chunks, chunk c of row r at c ^ (r % min(8, chunks)): ldmatrix's
// eight row addresses then fall in different bank groups. Chunks per row are powers of two (>= 2).
struct SwizzledRows {
  int row_halves;
  __device__ int offset(int row, int chunk) const {
    const int chunks = row_halves / kChunk;
    const int span = chunks < 8 ? chunks : 8;
    return row * row_halves + ((chunk ^ (row % span)) * kChunk);
  }
};

// Stage layout (halves): [A: kTileRows x tile_cols][B: K-major kBlockN x tile_cols, or N-major tile_cols x kBlockN].
template <int kTileRows>
__device__ int stage_halves(int tile_cols) { return (kTileRows + kBlockN) * tile_cols; }

template <int kTileRows>
__device__ void load_stage(const TileParams& p, uint16_t* stage, int64_t tile, int64_t n0, int tid) {
  const int tile_cols = p.tile_cols;
  const SwizzledRows a_rows{tile_cols};
  const uint16_t* a_src = p.tiles + tile * kTileRows * tile_cols;
  const int k_chunks = tile_cols / kChunk;  // 16-byte chunks along a tile row (and a K-major B row)
  for (int i = tid; i < kTileRows * k_chunks; i += kThreads) {
    const int row = i / k_chunks, chunk = i % k_chunks;
    ptx::cp_async_16(ptx::smem_address(stage + a_rows.offset(row, chunk)), a_src + row * tile_cols + chunk * kChunk, 16);
  }
  uint16_t* b_stage = stage + kTileRows * tile_cols;
  const auto* b = static_cast<const uint16_t*>(p.b);
  const int64_t k0 = int64_t{p.col_index[tile]} * tile_cols;
  if (p.b_col_major) {  // [n][k]: row n is x[n0 + n, k0 .. k0 + tile_cols)
    const SwizzledRows rows{tile_cols};
    for (int i = tid; i < kBlockN * k_chunks; i += kThreads) {
      const int row = i / k_chunks, chunk = i % k_chunks;
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

// B fragments of n8 tiles n_base and n_base + 8 at k-step ks: {r0, r1} and {r2, r3}.
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

template <class Element, class Out, int kTileRows>
__global__ void __launch_bounds__(kThreads) sm80_tile_spmm_kernel(const TileParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Mma = typename nm24::ElementTraits<Element>::Mma;
  constexpr int kTilesM = kTileRows / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const auto [tile_row, n0] = tile_work(p, blockIdx.x, kBlockN);
  const int64_t m0 = tile_row * kTileRows;
  const int32_t begin = p.row_ptr[tile_row], end = p.row_ptr[tile_row + 1];
  const int halves = stage_halves<kTileRows>(p.tile_cols);
  const SwizzledRows a_rows{p.tile_cols};

  float acc[kTilesM][kTilesN][4] = {};
  if (begin < end) load_stage<kTileRows>(p, smem, begin, n0, tid);
  ptx::cp_async_commit();
  for (int32_t t = begin; t < end; ++t) {
    if (t + 1 < end) load_stage<kTileRows>(p, smem + ((t + 1 - begin) % kStages) * halves, t + 1, n0, tid);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();  // tile t is visible to every warp
    const uint16_t* a_stage = smem + ((t - begin) % kStages) * halves;
    const uint16_t* b_stage = a_stage + kTileRows * p.tile_cols;
    for (int ks = 0; ks < p.tile_cols / kMmaK; ++ks) {
      uint32_t b_frag[kTilesN][2];
#pragma unroll
      for (int j = 0; j < kTilesN; j += 2) {
        uint32_t r[4];
        load_b_pair(p, b_stage, ks, warp * kWarpN + 8 * j, lane, r);
        b_frag[j][0] = r[0], b_frag[j][1] = r[1], b_frag[j + 1][0] = r[2], b_frag[j + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kTilesM; ++mi) {
        uint32_t a_frag[4];
        const int row = 16 * mi + lane % 8 + 8 * ((lane / 8) % 2), chunk = 2 * ks + lane / 16;
        ptx::ldmatrix_x4(a_frag, ptx::smem_address(a_stage + a_rows.offset(row, chunk)));
#pragma unroll
        for (int j = 0; j < kTilesN; ++j) ptx::mma_m16n8k16<Mma>(acc[mi][j], a_frag, b_frag[j]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  ptx::cp_async_wait<0>();

#pragma unroll
  for (int mi = 0; mi < kTilesM; ++mi)
#pragma unroll
    for (int j = 0; j < kTilesN; ++j)
      nm24::epilogue_store_m16n8<Out>(p, m0 + 16 * mi, n0 + warp * kWarpN + 8 * j, lane, acc[mi][j]);
#endif
}

template <class Element, class Out, int kTileRows>
void launch(const TileParams& p, cudaStream_t stream) {
  auto kernel = sm80_tile_spmm_kernel<Element, Out, kTileRows>;
  const int smem_bytes = kStages * (kTileRows + kBlockN) * p.tile_cols * 2;
  static cuda::DynamicSmemLimit smem_limit;  // per instantiation
  smem_limit.raise(kernel, smem_bytes);
  const int64_t blocks = tile_grid_size(p, kTileRows, kBlockN);
  require(blocks < (int64_t{1} << 31), ErrorCode::unsupported, "sm80 tile: more than 2^31 CTAs");
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem_bytes, stream>>>(p);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <class Element, class Out>
void launch_sm80(const TileParams& p, int tile_rows, cudaStream_t stream) {
  switch (tile_rows) {
    case 16: return launch<Element, Out, 16>(p, stream);
    case 32: return launch<Element, Out, 32>(p, stream);
    case 64: return launch<Element, Out, 64>(p, stream);
    case 128: return launch<Element, Out, 128>(p, stream);
  }
  throw Error(ErrorCode::invalid_argument, "sm80 tile: no kernel for tile rows " + std::to_string(tile_rows));
}

template void launch_sm80<__half, __half>(const TileParams&, int, cudaStream_t);
template void launch_sm80<__half, float>(const TileParams&, int, cudaStream_t);
template void launch_sm80<__nv_bfloat16, __nv_bfloat16>(const TileParams&, int, cudaStream_t);
template void launch_sm80<__nv_bfloat16, float>(const TileParams&, int, cudaStream_t);

}  // namespace nmkit::gpu::tile
