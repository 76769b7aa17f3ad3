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
#include "../ptx/mma.cuh"
#include "mma_stage.cuh"
#include "tile_common.cuh"

namespace nmkit::gpu::tile {
namespace {

constexpr int kBlockN = 128;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpN = kBlockN / kWarps;  // 32 columns: 4 n8 tiles
constexpr int kTilesN = kWarpN / 8;
constexpr int kStages = 2;
using mma_stage::kMmaK;

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
  const int halves = mma_stage::stage_halves(kTileRows, kBlockN, p.tile_cols), k_steps = p.tile_cols / kMmaK;
  const mma_stage::StageCopier<kTileRows, kBlockN, kThreads> copier(p, n0, tid);
  const mma_stage::FragmentOffsets<kBlockN> fragments(p, 0, warp * kWarpN, lane);

  float acc[kTilesM][kTilesN][4] = {};
  if (begin < end) copier.post(p, smem, begin, p.col_index[begin], n0, tid);
  ptx::cp_async_commit();
  for (int32_t t = begin; t < end; ++t) {
    if (t + 1 < end) copier.post(p, smem + ((t + 1 - begin) % kStages) * halves, t + 1, p.col_index[t + 1], n0, tid);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();  // tile t is visible to every warp
    const uint16_t* a_stage = smem + ((t - begin) % kStages) * halves;
    const uint16_t* b_stage = a_stage + kTileRows * p.tile_cols;
    for (int ks = 0; ks < k_steps; ++ks) {
      uint32_t b_frag[kTilesN][2];
#pragma unroll
      for (int j = 0; j < kTilesN; j += 2) {
        uint32_t r[4];
        fragments.load_b_pair(b_stage, j / 2, ks, r);
        b_frag[j][0] = r[0], b_frag[j][1] = r[1], b_frag[j + 1][0] = r[2], b_frag[j + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kTilesM; ++mi) {
        uint32_t a_frag[4];
        fragments.load_a(a_stage, mi, ks, a_frag);
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
  const int smem_bytes = kStages * mma_stage::stage_halves(kTileRows, kBlockN, p.tile_cols) * 2;
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
    case 16:
      return launch<Element, Out, 16>(p, stream);
    case 32:
      return launch<Element, Out, 32>(p, stream);
    case 64:
      return launch<Element, Out, 64>(p, stream);
    case 128:
      return launch<Element, Out, 128>(p, stream);
  }
  throw Error(ErrorCode::invalid_argument, "sm80 tile: no kernel for tile rows " + std::to_string(tile_rows));
}

template void launch_sm80<__half, __half>(const TileParams&, int, cudaStream_t);
template void launch_sm80<__half, float>(const TileParams&, int, cudaStream_t);
template void launch_sm80<__nv_bfloat16, __nv_bfloat16>(const TileParams&, int, cudaStream_t);
template void launch_sm80<__nv_bfloat16, float>(const TileParams&, int, cudaStream_t);

}  // namespace nmkit::gpu::tile
