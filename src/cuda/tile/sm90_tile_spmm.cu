// The Hopper tile-sparse SpMM (sm_90a): wgmma on each stored tile, both operands staged by TMA.
//
// Computed transposed, D^T = B^T A^T: the wgmma's M is 64 tokens per consumer warpgroup (B^T: x[T, K] is K-major
// as it is), its N the tile's rows (A^T's columns: the row-major tile is K-major too), so one CTA covers a whole
// tile row for 128 tokens whatever the tile height. Per stored tile the producer thread posts, on one mbarrier,
// the tile (a 3-D TMA box of the packed tiles) and the tile's k-range of x (a 2-D box), both with the 128-byte
// swizzle, in 64-column atoms. Consumers issue one wgmma per 16 columns and keep one group in flight.
//
// Status: compiled, not yet run on a GPU (opt-in through TileKernel::sm90_wgmma; `automatic` keeps sm80_mma).
#include <cuda.h>
#include <cuda_runtime.h>

#include "../common/check.cuh"
#include "../common/tensor_map.cuh"
#include "../nm24/nm24_common.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "../ptx/wgmma_ss.cuh"
#include "tile_common.cuh"

namespace nmkit::gpu::tile {
namespace {

constexpr int kConsumers = 2;
constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
[[maybe_unused]] constexpr int kTokensPerConsumer = 64;                          // one m64 wgmma
constexpr int kBlockTokens = kConsumers * kTokensPerConsumer;   // tokens per CTA
constexpr int kAtomK = 64;                                      // halves in one 128-byte swizzled row
constexpr int kRowBytes = kAtomK * 2;
[[maybe_unused]] constexpr int kWgmmaK = 16;
constexpr int kSwizzleAlign = 1024;
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kRegisterFile = 64 * 1024;
constexpr int kPipelineBytes = 200 * 1024;
constexpr int kMaxStages = 8;
static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <= (kConsumers + 1) * (kRegisterFile / kThreads / 8 * 8),
              "setmaxnreg budgets must fit the registers allocated at launch");

// Stage: [x atoms: kAtoms x (128 tokens x 128 B)][tile atoms: kAtoms x (kTileRows x 128 B)], 1024-aligned.
template <int kTileRows, int kTileCols>
struct Sm90TileShape {
  static_assert(kTileCols % kAtomK == 0, "tiles are whole 64-column atoms");
  static constexpr int kAtoms = kTileCols / kAtomK;
  static constexpr int kXAtomBytes = kBlockTokens * kRowBytes;
  static constexpr int kTileAtomBytes = kTileRows * kRowBytes;
  static constexpr int kStageBytes = kAtoms * (kXAtomBytes + kTileAtomBytes);
  static constexpr int kStages = kPipelineBytes / kStageBytes < kMaxStages ? kPipelineBytes / kStageBytes : kMaxStages;
  static constexpr int kSmemBytes = kSwizzleAlign + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kTileAtomBytes % kSwizzleAlign == 0 && kXAtomBytes % kSwizzleAlign == 0, "atoms keep the alignment");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "the pipeline must fit in shared memory");
};

template <class Element, class Out, int kTileRows, int kTileCols>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_tile_spmm_kernel(const TileParams p, const __grid_constant__ CUtensorMap x_map,
                          const __grid_constant__ CUtensorMap tile_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = Sm90TileShape<kTileRows, kTileCols>;
  using Wgmma = ptx::WgmmaSS<kTileRows, typename nm24::ElementTraits<Element>::Mma>;
  constexpr int kStages = Shape::kStages;
  constexpr int kStepsPerAtom = kAtomK / kWgmmaK;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kSwizzleAlign - 1) & ~uintptr_t{kSwizzleAlign - 1});
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * Shape::kStageBytes);
  uint64_t* empty = full + kStages;

  const int tid = threadIdx.x, warpgroup = tid / kWarpgroupThreads, lane = tid % 32;
  const auto [tile_row, t0] = tile_work(p, blockIdx.x, kBlockTokens);
  const int64_t m0 = tile_row * kTileRows;
  const int32_t begin = p.row_ptr[tile_row], end = p.row_ptr[tile_row + 1];

  if (tid == 0) {
    ptx::prefetch_tensor_map(&x_map);
    ptx::prefetch_tensor_map(&tile_map);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumers * kWarpgroupThreads);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == kConsumers) {  // producer: one thread posts each stored tile and its k-range of x
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (tid % kWarpgroupThreads == 0) {
      for (int32_t t = begin; t < end; ++t) {
        const int i = t - begin, s = i % kStages;
        unsigned char* stage = smem + s * Shape::kStageBytes;
        if (i >= kStages) ptx::mbarrier_wait(&empty[s], static_cast<uint32_t>((i / kStages - 1) & 1));
        ptx::mbarrier_arrive_expect_tx(&full[s], Shape::kStageBytes);
        const int32_t k0 = p.col_index[t] * kTileCols;
#pragma unroll
        for (int a = 0; a < Shape::kAtoms; ++a) {
          ptx::tma_load_2d(stage + a * Shape::kXAtomBytes, &x_map, &full[s], k0 + a * kAtomK, static_cast<int32_t>(t0));
          ptx::tma_load_3d(stage + Shape::kAtoms * Shape::kXAtomBytes + a * Shape::kTileAtomBytes, &tile_map, &full[s],
                           a * kAtomK, 0, t);
        }
      }
    }
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegisters>();
  float acc[Wgmma::kAccumulators];
#pragma unroll
  for (int i = 0; i < Wgmma::kAccumulators; ++i) acc[i] = 0.0f;
  for (int32_t t = begin; t < end; ++t) {
    const int i = t - begin, s = i % kStages;
    ptx::mbarrier_wait(&full[s], static_cast<uint32_t>((i / kStages) & 1));
    const unsigned char* stage = smem + s * Shape::kStageBytes;
    ptx::wgmma_fence();
#pragma unroll
    for (int a = 0; a < Shape::kAtoms; ++a) {
      const uint64_t x_desc = ptx::make_smem_desc_k_major_sw128(
          ptx::smem_address(stage + a * Shape::kXAtomBytes + warpgroup * kTokensPerConsumer * kRowBytes));
      const uint64_t tile_desc = ptx::make_smem_desc_k_major_sw128(
          ptx::smem_address(stage + Shape::kAtoms * Shape::kXAtomBytes + a * Shape::kTileAtomBytes));
#pragma unroll
      for (int k = 0; k < kStepsPerAtom; ++k)  // 16 columns = 32 bytes further along each swizzled row
        Wgmma::mma(acc, ptx::advance_smem_desc(x_desc, k * kWgmmaK * 2), ptx::advance_smem_desc(tile_desc, k * kWgmmaK * 2), 1);
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<1>();  // the previous tile's group is done: its stage goes back to the producer
    if (i > 0) ptx::mbarrier_arrive(&empty[(i - 1) % kStages]);
  }
  ptx::wgmma_wait_group<0>();
  ptx::fence_registers(acc);

  // acc[4j + 2h + e]: token 16w + g + 8h of this warpgroup, tile row 8j + 2t + e (w = warp in the warpgroup).
  const int warp = (tid % kWarpgroupThreads) / 32, g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int j = 0; j < kTileRows / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        nm24::epilogue_store<Out>(p, m0 + 8 * j + 2 * tq + e, t0 + warpgroup * kTokensPerConsumer + 16 * warp + g + 8 * h,
                                  acc[4 * j + 2 * h + e]);
#endif
}

template <class Element, class Out, int kTileRows, int kTileCols>
void launch(const TileParams& p, cudaStream_t stream) {
  using Shape = Sm90TileShape<kTileRows, kTileCols>;
  auto kernel = sm90_tile_spmm_kernel<Element, Out, kTileRows, kTileCols>;
  static const bool smem_set = [&] {  // once per instantiation and process
    NMKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
    return true;
  }();
  (void)smem_set;
  // x[C, K] (B col-major) in boxes of 64 columns x 128 tokens; the packed tiles as {tile_cols, tile_rows, nnz}.
  const CUtensorMap x_map = cuda::make_tensor_map_sw128<Element, 2>(
      p.b, {static_cast<cuuint64_t>(p.cols), static_cast<cuuint64_t>(p.n)}, {static_cast<cuuint64_t>(p.cols) * 2},
      {kAtomK, kBlockTokens});
  const cuuint64_t tiles = static_cast<cuuint64_t>(p.nnz_tiles > 0 ? p.nnz_tiles : 1);  // a map needs one tile
  const CUtensorMap tile_map = cuda::make_tensor_map_sw128<Element, 3>(
      p.tiles, {kTileCols, kTileRows, tiles}, {kTileCols * 2, static_cast<cuuint64_t>(kTileRows) * kTileCols * 2},
      {kAtomK, kTileRows, 1});
  const int64_t blocks = tile_grid_size(p, kTileRows, kBlockTokens);
  require(blocks < (int64_t{1} << 31), ErrorCode::unsupported, "sm90 tile: more than 2^31 CTAs");
  kernel<<<static_cast<unsigned>(blocks), kThreads, Shape::kSmemBytes, stream>>>(p, x_map, tile_map);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

template <class Element, class Out, int kTileRows>
void launch_rows(const TileParams& p, cudaStream_t stream) {
  if (p.tile_cols == 64) return launch<Element, Out, kTileRows, 64>(p, stream);
  if (p.tile_cols == 128) return launch<Element, Out, kTileRows, 128>(p, stream);
  throw Error(ErrorCode::invalid_argument, "sm90 tile: tile columns must be 64 or 128, got " + std::to_string(p.tile_cols));
}

}  // namespace

template <class Element, class Out>
void launch_sm90(const TileParams& p, int tile_rows, cudaStream_t stream) {
  switch (tile_rows) {
    case 16: return launch_rows<Element, Out, 16>(p, stream);
    case 32: return launch_rows<Element, Out, 32>(p, stream);
    case 64: return launch_rows<Element, Out, 64>(p, stream);
    case 128: return launch_rows<Element, Out, 128>(p, stream);
  }
  throw Error(ErrorCode::invalid_argument, "sm90 tile: no kernel for tile rows " + std::to_string(tile_rows));
}

template void launch_sm90<__half, __half>(const TileParams&, int, cudaStream_t);
template void launch_sm90<__half, float>(const TileParams&, int, cudaStream_t);
template void launch_sm90<__nv_bfloat16, __nv_bfloat16>(const TileParams&, int, cudaStream_t);
template void launch_sm90<__nv_bfloat16, float>(const TileParams&, int, cudaStream_t);

}  // namespace nmkit::gpu::tile
