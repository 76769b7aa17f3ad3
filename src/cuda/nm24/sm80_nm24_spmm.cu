// The portable 2:4 SpMM (sm_80 .. sm_90): mma.sp m16n8k32, A fragments straight from the packed weight
// into registers (double-buffered), B through a cp.async multi-stage shared-memory pipeline.
//
// CTA tile kBlockM x kBlockN x kBlockK = 128 x 128 x 64, 8 warps as 4 (M) x 2 (N), warp tile 32 x 64.
// The same kernel runs V:N:M weights (their condensed 2:4 matrix) with B rows read through a gather table.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "../common/check.cuh"
#include "../common/smem.cuh"
#include "../ptx/cp_async.cuh"
#include "../ptx/ldmatrix.cuh"
#include "../ptx/mma_sp.cuh"
#include "nm24_common.cuh"

namespace nmkit::gpu::nm24 {
namespace {

constexpr int kBlockM = 128;
constexpr int kBlockN = 128;
constexpr int kBlockK = 64;
constexpr int kStages = 3;
constexpr int kWarpsM = 4;
constexpr int kWarpsN = 2;
constexpr int kThreads = kWarpsM * kWarpsN * 32;
constexpr int kWarpM = kBlockM / kWarpsM;              // 32 rows: 2 slabs
constexpr int kWarpN = kBlockN / kWarpsN;              // 64 cols: 8 n8 tiles
constexpr int kSlabsPerWarp = kWarpM / kSlabRows;      // 2
constexpr int kTilesN = kWarpN / 8;                    // 8
constexpr int kKBlocksPerTile = kBlockK / kFragmentK;  // 2
constexpr int kChunk = 8;                              // halves per 16-byte chunk
constexpr int kStageElems = kBlockN * kBlockK;         // halves of B per stage
constexpr int kSmemBytes = kStages * kStageElems * 2;

static_assert(kBlockM % kPackRowAlign == 0 || kPackRowAlign % kBlockM == 0, "packed rows must cover whole CTA tiles");
static_assert(kPackKAlign % kBlockK == 0, "packed K must cover whole k-tiles");

// Shared-memory B tile layouts, both with 16-byte chunks XOR-swizzled by the row so that ldmatrix's
// eight row addresses hit eight different bank groups.
//   K-major (B col-major): [kBlockN rows n][kBlockK halves], chunk c of row n at c ^ (n % 8).
//   N-major (B row-major): [kBlockK rows k][kBlockN halves], chunk c of row k at c ^ (k % 8).
template <bool kKMajor>
struct BTile {
  static constexpr int kRowHalves = kKMajor ? kBlockK : kBlockN;
  static constexpr int kRows = kKMajor ? kBlockN : kBlockK;
  static constexpr int kChunksPerRow = kRowHalves / kChunk;
  __device__ static int offset(int row, int chunk) { return row * kRowHalves + ((chunk ^ (row % 8)) * kChunk); }
};

// The row of B that k-tile row `k_local` (0 .. kBlockK-1) reads, or -1 for zeros: row k0 + k_local for 2:4,
// the gather table's entry for V:N:M (`gather` points at the tile's first entry).
template <bool kGather>
__device__ __forceinline__ int64_t b_row(const Params& p, const int32_t* gather, int64_t k0, int k_local) {
  if constexpr (kGather)
    return __ldg(gather + k_local);
  else
    return k0 + k_local < p.cols ? k0 + k_local : -1;
}

// Loads one k-tile of B into a stage. Vector path: 16-byte cp.async with zero-fill past K and C (for a
// gathered K-major tile the 8 halves of a chunk come from 8 rows of B, so it always takes the scalar path).
// Scalar path (unaligned B): element loads, for leading dimensions that are not multiples of 8.
template <class Element, bool kKMajor, bool kVector, bool kGather>
__device__ void load_b_tile(const Params& p, Element* stage, int64_t k0, int64_t n0, const int32_t* gather, int tid) {
  static_assert(!(kGather && kKMajor && kVector), "a gathered K-major chunk is not contiguous in B");
  using Tile = BTile<kKMajor>;
  const Element* b = static_cast<const Element*>(p.b);
  const int64_t ldb = p.ldb;
  constexpr int kChunks = Tile::kRows * Tile::kChunksPerRow;
  for (int i = tid; i < kChunks; i += kThreads) {
    const int row = i / Tile::kChunksPerRow, chunk = i % Tile::kChunksPerRow;
    const int k_local = kKMajor ? chunk * kChunk : row;  // the chunk's first k inside the tile
    const int64_t n = kKMajor ? n0 + row : n0 + chunk * kChunk;
    Element* dst = stage + Tile::offset(row, chunk);
    if constexpr (kVector) {
      const int64_t k = b_row<kGather>(p, gather, k0, k_local);
      const bool inside = k >= 0 && n < p.n;
      const Element* src = inside ? b + (kKMajor ? n * ldb + k : k * ldb + n) : b;
      ptx::cp_async_16(ptx::smem_address(dst), src, inside ? 16 : 0);
    } else {
      for (int e = 0; e < kChunk; ++e) {
        const int64_t ke = b_row<kGather>(p, gather, k0, kKMajor ? k_local + e : k_local);
        const int64_t ne = kKMajor ? n : n + e;
        dst[e] = (ke >= 0 && ne < p.n) ? b[kKMajor ? ne * ldb + ke : ke * ldb + ne] : Element(0.0f);
      }
    }
  }
}

// The B fragment of n8 tile (n_base .. n_base+7) for k-block kk of the stage: b_i holds k = 32 kk + 8 i + 2t.
template <bool kKMajor>
__device__ __forceinline__ void load_b_fragment(uint32_t (&frag)[4], const void* stage, int kk, int n_base, int lane) {
  using Tile = BTile<kKMajor>;
  const auto* base = static_cast<const __half*>(stage);
  if constexpr (kKMajor) {
    const int row = n_base + lane % 8, chunk = kk * 4 + lane / 8;
    ptx::ldmatrix_x4(frag, ptx::smem_address(base + Tile::offset(row, chunk)));
  } else {
    const int row = kk * kFragmentK + 8 * (lane / 8) + lane % 8, chunk = n_base / kChunk;
    ptx::ldmatrix_x4_trans(frag, ptx::smem_address(base + Tile::offset(row, chunk)));
  }
}

// kGather (V:N:M): the CTA's 128 rows span kBlockM / gather_block_rows row blocks, each with its own gathered
// B tile in every stage; warp row w multiplies the tile of its block.
template <class Element, class Out, bool kKMajor, bool kVector, bool kGather>
__global__ void __launch_bounds__(kThreads) sm80_nm24_spmm_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Mma = typename ElementTraits<Element>::Mma;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* smem_b = reinterpret_cast<Element*>(smem_raw);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  // One grid dimension (2^31 - 1 CTAs, where y would stop at 65535 column tiles), row tiles fastest so that
  // neighbouring CTAs share a B tile in L2.
  const int64_t row_tiles = ceil_div(p.rows, int64_t{kBlockM});
  const int64_t m0 = int64_t{blockIdx.x} % row_tiles * kBlockM, n0 = int64_t{blockIdx.x} / row_tiles * kBlockN;
  const int64_t slab0 = (m0 + warp_m * kWarpM) / kSlabRows;
  const int64_t k_tiles = p.kblocks / kKBlocksPerTile;
  const int b_tiles = kGather ? kBlockM / p.gather_block_rows : 1;
  const int my_b_tile = kGather ? warp_m * kWarpM / p.gather_block_rows : 0;
  const int stage_elems = b_tiles * kStageElems;
  // Gather-table row of the CTA's first row block (unused for 2:4).
  const int32_t* gather = kGather ? p.b_gather + (m0 / p.gather_block_rows) * p.gather_stride : nullptr;
  auto load_stage = [&](int64_t kt, Element* stage) {
    for (int t = 0; t < b_tiles; ++t)
      load_b_tile<Element, kKMajor, kVector, kGather>(p, stage + t * kStageElems, kt * kBlockK, n0,
                                                      kGather ? gather + t * p.gather_stride + kt * kBlockK : nullptr,
                                                      tid);
  };

  float acc[kSlabsPerWarp][kTilesN][4] = {};
  AFragment a_cur[kSlabsPerWarp][kKBlocksPerTile], a_next[kSlabsPerWarp][kKBlocksPerTile];
  auto load_a = [&](AFragment(&a)[kSlabsPerWarp][kKBlocksPerTile], int64_t kt) {
#pragma unroll
    for (int s = 0; s < kSlabsPerWarp; ++s)
#pragma unroll
      for (int kk = 0; kk < kKBlocksPerTile; ++kk)
        a[s][kk] = load_a_fragment(p, slab0 + s, kt * kKBlocksPerTile + kk, lane);
  };

  // Prologue: the first kStages - 1 k-tiles of B in flight.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, smem_b + s * stage_elems);
    ptx::cp_async_commit();
  }
  load_a(a_cur, 0);

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    if (kt + 1 < k_tiles) load_a(a_next, kt + 1);
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is visible; stage kt - 1 is free for the next load
    const int64_t next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next, smem_b + (next % kStages) * stage_elems);
    ptx::cp_async_commit();

    const Element* stage = smem_b + (kt % kStages) * stage_elems + my_b_tile * kStageElems;
#pragma unroll
    for (int kk = 0; kk < kKBlocksPerTile; ++kk)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        uint32_t b_frag[4];
        load_b_fragment<kKMajor>(b_frag, stage, kk, warp_n * kWarpN + 8 * j, lane);
#pragma unroll
        for (int s = 0; s < kSlabsPerWarp; ++s)
          ptx::mma_sp_m16n8k32<Mma>(acc[s][j], a_cur[s][kk].values, b_frag, a_cur[s][kk].meta);
      }
    if (kt + 1 < k_tiles) {
#pragma unroll
      for (int s = 0; s < kSlabsPerWarp; ++s)
#pragma unroll
        for (int kk = 0; kk < kKBlocksPerTile; ++kk) a_cur[s][kk] = a_next[s][kk];
    }
  }
  ptx::cp_async_wait<0>();

#pragma unroll
  for (int s = 0; s < kSlabsPerWarp; ++s)
#pragma unroll
    for (int j = 0; j < kTilesN; ++j)
      epilogue_store_m16n8<Out>(p, m0 + warp_m * kWarpM + s * kSlabRows, n0 + warp_n * kWarpN + 8 * j, lane, acc[s][j]);
#endif
}

template <class Element, class Out, bool kKMajor, bool kVector, bool kGather>
void launch(const Params& p, cudaStream_t stream) {
  auto kernel = sm80_nm24_spmm_kernel<Element, Out, kKMajor, kVector, kGather>;
  const int smem_bytes = kSmemBytes * (kGather ? kBlockM / p.gather_block_rows : 1);
  static cuda::DynamicSmemLimit smem_limit;  // per instantiation
  smem_limit.raise(kernel, smem_bytes);
  const int64_t ctas = ceil_div(p.rows, int64_t{kBlockM}) * ceil_div(p.n, int64_t{kBlockN});
  require(ctas <= std::numeric_limits<int32_t>::max(), ErrorCode::unsupported, [&] {
    return "nm24 portable kernel: " + std::to_string(p.rows) + " rows by " + std::to_string(p.n) +
           " columns need more than 2^31 - 1 CTAs of " + std::to_string(kBlockM) + "x" + std::to_string(kBlockN);
  });
  kernel<<<static_cast<unsigned>(ctas), kThreads, smem_bytes, stream>>>(p);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <class Element, class Out>
void launch_sm80(const Params& p, Layout b_layout, bool b_vector_loads, cudaStream_t stream) {
  const bool k_major = b_layout == Layout::col_major;
  if (p.b_gather != nullptr) {  // V:N:M: rows of B through the gather table
    if (k_major)
      launch<Element, Out, true, false, true>(p, stream);
    else if (b_vector_loads)
      launch<Element, Out, false, true, true>(p, stream);
    else
      launch<Element, Out, false, false, true>(p, stream);
  } else if (k_major && b_vector_loads) {
    launch<Element, Out, true, true, false>(p, stream);
  } else if (k_major) {
    launch<Element, Out, true, false, false>(p, stream);
  } else if (b_vector_loads) {
    launch<Element, Out, false, true, false>(p, stream);
  } else {
    launch<Element, Out, false, false, false>(p, stream);
  }
}

TileShape sm80_tile_shape() { return {kBlockM, kBlockN, kBlockK, kStages, kThreads, kSmemBytes}; }

// The instantiations nmkit ships: {f16, bf16} x {f16, bf16, f32} outputs.
template void launch_sm80<__half, __half>(const Params&, Layout, bool, cudaStream_t);
template void launch_sm80<__half, float>(const Params&, Layout, bool, cudaStream_t);
template void launch_sm80<__nv_bfloat16, __nv_bfloat16>(const Params&, Layout, bool, cudaStream_t);
template void launch_sm80<__nv_bfloat16, float>(const Params&, Layout, bool, cudaStream_t);

}  // namespace nmkit::gpu::nm24
