// The stream tile-sparse SpMM, for few tokens (sm_80 .. sm_90): mma.sync on each stored tile, the stored tiles split
// evenly over a grid that fills the GPU.
//
// With a few dozen tokens the product is bound by reading the weight's tiles once, and a CTA per tile row leaves
// most SMs idle (64 tile rows for a 4096-row weight of 64-row tiles). So the tiles, in tile-row order (pack_tiles),
// are cut into `ctas` equal ranges, one per CTA and token block (stream-K over tiles): every SM streams its share
// of the weight through a kStages-deep cp.async ring from the start, one CTA barrier per tile. A range covers whole
// tile rows, whose outputs the CTA writes itself, and at its two ends parts of rows that other CTAs share. Those
// parts go to a workspace slot as fp32 partial sums; the CTA that brings a row's last part (an arrival counter per
// tile row) adds the row's parts in CTA order, so the result does not depend on which CTA finishes last, applies the
// epilogue, stores D and zeroes the counter for the next launch. Tile rows without tiles are written (beta C + bias)
// by the CTAs in turn.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "../common/check.cuh"
#include "../common/smem.cuh"
#include "../nm24/nm24_common.cuh"
#include "../ptx/cp_async.cuh"
#include "../ptx/mma.cuh"
#include "mma_stage.cuh"
#include "tile_common.cuh"

namespace nmkit::gpu::tile {
namespace {

// Stages of the ring: up to 4 (3 tiles in flight), as long as the stages of the widest tiles (128 columns) fit in
// ~96 KiB, so that two or more CTAs share an SM.
template <int kTileRows>
constexpr int kStages = std::clamp(96 * 1024 / ((kTileRows + kStreamBlockN) * 128 * 2), 2, 4);
constexpr int kBlockN = kStreamBlockN;
using mma_stage::kMmaK;
constexpr int kMetaWindow = 256;  // tiles whose column and row a CTA holds in shared memory at once

// How a CTA's warps cover a tile row x kBlockN tokens: along the rows first (each A fragment is read by one warp),
// then along the tokens. Eight warps for tile rows of 64 and 128: with few tiles per CTA a warp's own chain of
// copies, mma and epilogue stores is the CTA's time, so shorter chains pay; four for 16 and 32, whose CTAs are
// small enough that more of them share an SM.
template <int kTileRows>
struct WarpTiling {
  static constexpr int kMBlocks = kTileRows / 16;
  static constexpr int kWarps = kTileRows >= 64 ? 8 : 4;
  static constexpr int kThreads = kWarps * 32;
  // CTAs an SM must hold (registers permitting), so that the register budget never costs the occupancy the
  // kernel's timings were taken at.
  static constexpr int kMinCtasPerSm = kWarps == 8 ? 2 : 5;
  static constexpr int kWarpsM = kMBlocks < kWarps ? kMBlocks : kWarps;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kMPerWarp = kMBlocks / kWarpsM;       // m16 blocks per warp
  static constexpr int kN8PerWarp = kBlockN / kWarpsN / 8;   // n8 blocks per warp
  static constexpr int kFragments = kMPerWarp * kN8PerWarp;  // m16n8 accumulator tiles per warp
  static constexpr int kSlotFloats = kTileRows * kBlockN;    // one partial tile row
  static_assert(kWarpsM * kWarpsN == kWarps && kFragments * 4 * kThreads == kSlotFloats,
                "the warps cover the tile row");
};

template <int kTileRows>
using Accumulators = float[WarpTiling<kTileRows>::kMPerWarp][WarpTiling<kTileRows>::kN8PerWarp][4];

template <class Element, int kTileRows>
__device__ void multiply_stage(const uint16_t* a_stage, const uint16_t* b_stage, int k_steps,
                               const mma_stage::FragmentOffsets<kBlockN>& f, Accumulators<kTileRows>& acc) {
  using Mma = typename nm24::ElementTraits<Element>::Mma;
  using T = WarpTiling<kTileRows>;
  for (int ks = 0; ks < k_steps; ++ks) {
    uint32_t b_frag[T::kN8PerWarp][2];
    if constexpr (T::kN8PerWarp == 1) {
      f.load_b_single(b_stage, ks, b_frag[0]);
    } else {
#pragma unroll
      for (int j = 0; j < T::kN8PerWarp; j += 2) {
        uint32_t r[4];
        f.load_b_pair(b_stage, j / 2, ks, r);
        b_frag[j][0] = r[0], b_frag[j][1] = r[1], b_frag[j + 1][0] = r[2], b_frag[j + 1][1] = r[3];
      }
    }
#pragma unroll
    for (int mi = 0; mi < T::kMPerWarp; ++mi) {
      uint32_t a_frag[4];
      f.load_a(a_stage, mi, ks, a_frag);
#pragma unroll
      for (int j = 0; j < T::kN8PerWarp; ++j) ptx::mma_m16n8k16<Mma>(acc[mi][j], a_frag, b_frag[j]);
    }
  }
}

template <class Out, int kTileRows>
__device__ void store_tile_row(const TileParams& p, int64_t m0, int64_t n0, int lane,
                               const Accumulators<kTileRows>& acc) {
  using T = WarpTiling<kTileRows>;
  if (nm24::epilogue_is_plain(p)) {
#pragma unroll
    for (int mi = 0; mi < T::kMPerWarp; ++mi)
#pragma unroll
      for (int j = 0; j < T::kN8PerWarp; ++j)
        nm24::plain_store_m16n8<Out>(p, m0 + 16 * mi, n0 + 8 * j, lane, acc[mi][j]);
    return;
  }
#pragma unroll
  for (int mi = 0; mi < T::kMPerWarp; ++mi)
#pragma unroll
    for (int j = 0; j < T::kN8PerWarp; ++j)
      nm24::epilogue_store_m16n8<Out>(p, m0 + 16 * mi, n0 + 8 * j, lane, acc[mi][j]);
}

template <class Element, class Out, int kTileRows>
__global__ void __launch_bounds__(WarpTiling<kTileRows>::kThreads, WarpTiling<kTileRows>::kMinCtasPerSm)
    stream_tile_spmm_kernel(const TileParams p, const StreamWork w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = WarpTiling<kTileRows>;
  constexpr int kRing = kStages<kTileRows>, kThreads = T::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);
  __shared__ int2 meta[kMetaWindow];  // {column, row} of tiles window .. window + kMetaWindow - 1
  __shared__ int brings_last_part;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int m_base = (warp % T::kWarpsM) * T::kMPerWarp * 16, n_base = (warp / T::kWarpsM) * T::kN8PerWarp * 8;
  const int64_t n0 = int64_t{blockIdx.y} * kBlockN, cta = blockIdx.x;
  const int64_t grid_rows = (p.rows + kTileRows - 1) / kTileRows;
  const EvenSplit ranges{p.nnz_tiles, gridDim.x};
  const int64_t begin = ranges.items ? ranges.begin(cta) : 0, end = ranges.items ? ranges.begin(cta + 1) : 0;

  int64_t window = begin;
  const auto load_window = [&] {
    for (int64_t i = tid; i < kMetaWindow && window + i < end; i += kThreads)
      meta[i] = make_int2(__ldg(p.col_index + window + i), __ldg(p.tile_row + window + i));
    __syncthreads();
  };
  // Everything the range's two ends need, loaded now and used last: whether the rows of its first and last tiles
  // go on past it, and those rows' tile extents (for the parts' owners).
  int32_t first_row = 0, last_row = 0, before_row = -1, after_row = -1;
  int64_t first_row_begin = 0, first_row_end = 0, last_row_begin = 0, last_row_end = 0;
  if (begin < end) {
    first_row = __ldg(p.tile_row + begin), last_row = __ldg(p.tile_row + end - 1);
    if (begin > 0) before_row = __ldg(p.tile_row + begin - 1);
    if (end < ranges.items) after_row = __ldg(p.tile_row + end);
    first_row_begin = __ldg(p.row_ptr + first_row), first_row_end = __ldg(p.row_ptr + first_row + 1);
    last_row_begin = __ldg(p.row_ptr + last_row), last_row_end = __ldg(p.row_ptr + last_row + 1);
  }
  load_window();
  const int halves = mma_stage::stage_halves(kTileRows, kBlockN, p.tile_cols), k_steps = p.tile_cols / kMmaK;
  const mma_stage::StageCopier<kTileRows, kBlockN, kThreads> copier(p, n0, tid);
  const mma_stage::FragmentOffsets<kBlockN> fragments(p, m_base, n_base, lane);
  for (int s = 0; s < kRing - 1; ++s) {
    if (begin + s < end) copier.post(p, smem + s * halves, begin + s, meta[s].x, n0, tid);
    ptx::cp_async_commit();
  }

  Accumulators<kTileRows> acc = {};
  int64_t part_begin = begin;
  int stage = 0;  // the stage of tile t; tile t + kRing - 1 goes to the one before it, which tile t - 1 used
  for (int64_t t = begin; t < end; ++t) {
    if (t + kRing >= window + kMetaWindow) {  // tiles t .. t + kRing into the window
      __syncthreads();
      window = t;
      load_window();
    }
    ptx::cp_async_wait<kRing - 2>();
    __syncthreads();  // tile t is visible to every warp, and every warp is done with tile t - 1's stage
    const int refill = stage == 0 ? kRing - 1 : stage - 1;
    if (t + kRing - 1 < end)
      copier.post(p, smem + refill * halves, t + kRing - 1, meta[t + kRing - 1 - window].x, n0, tid);
    ptx::cp_async_commit();
    const uint16_t* a_stage = smem + stage * halves;
    multiply_stage<Element, kTileRows>(a_stage, a_stage + kTileRows * p.tile_cols, k_steps, fragments, acc);
    stage = stage + 1 == kRing ? 0 : stage + 1;

    const int32_t row = meta[t - window].y;
    if (t + 1 < end && meta[t + 1 - window].y == row) continue;
    // The part of tile row `row` in this range ends here. It is the whole row unless the row goes on before the
    // range (only its first part can) or after it (only its last part can).
    const bool first_part = part_begin == begin, last_part = t + 1 == end;
    const int64_t m0 = int64_t{row} * kTileRows + m_base, n = n0 + n_base;
    if (!(first_part && before_row == row) && !(last_part && after_row == row)) {
      store_tile_row<Out, kTileRows>(p, m0, n, lane, acc);
    } else {  // a shared row: this part to its slot (0: the range's first part, 1: its last), the last one adds them
      const auto slot = [&](int64_t owner, int which) {
        return reinterpret_cast<float4*>(w.partials) +
               ((int64_t{blockIdx.y} * gridDim.x + owner) * 2 + which) * (T::kSlotFloats / 4);
      };
      float4* mine = slot(cta, first_part ? 0 : 1);
#pragma unroll
      for (int mi = 0; mi < T::kMPerWarp; ++mi)
#pragma unroll
        for (int j = 0; j < T::kN8PerWarp; ++j)
          mine[(mi * T::kN8PerWarp + j) * kThreads + tid] =
              make_float4(acc[mi][j][0], acc[mi][j][1], acc[mi][j][2], acc[mi][j][3]);
      __threadfence();  // the part is visible GPU-wide before its arrival is counted
      __syncthreads();
      const int64_t row_begin = first_part ? first_row_begin : last_row_begin;
      const int64_t first = ranges.part_of(row_begin),
                    last = ranges.part_of((first_part ? first_row_end : last_row_end) - 1);
      if (tid == 0) {
        int32_t* arrivals = w.arrivals + int64_t{blockIdx.y} * grid_rows + row;
        brings_last_part = atomicAdd(arrivals, 1) == static_cast<int>(last - first);
        if (brings_last_part) *arrivals = 0;  // every part has arrived: ready for the next launch
      }
      __syncthreads();
      if (brings_last_part) {
        __threadfence();
        Accumulators<kTileRows> sum = {};
        for (int64_t owner = first; owner <= last; ++owner) {
          // The first owner's range may begin in an earlier row, so that this row is its last part.
          const float4* part = slot(owner, owner == first && ranges.begin(owner) < row_begin ? 1 : 0);
#pragma unroll
          for (int mi = 0; mi < T::kMPerWarp; ++mi)
#pragma unroll
            for (int j = 0; j < T::kN8PerWarp; ++j) {
              const float4 v = __ldcg(part + (mi * T::kN8PerWarp + j) * kThreads + tid);
              sum[mi][j][0] += v.x, sum[mi][j][1] += v.y, sum[mi][j][2] += v.z, sum[mi][j][3] += v.w;
            }
        }
        store_tile_row<Out, kTileRows>(p, m0, n, lane, sum);
      }
    }
#pragma unroll
    for (int mi = 0; mi < T::kMPerWarp; ++mi)
#pragma unroll
      for (int j = 0; j < T::kN8PerWarp; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.0f;
    part_begin = t + 1;
  }
  ptx::cp_async_wait<0>();

  // Tile rows without tiles: D = beta C + bias there (last, so that the copies above start at once).
  for (int64_t r = cta; r < grid_rows; r += gridDim.x)
    if (__ldg(p.row_ptr + r) == __ldg(p.row_ptr + r + 1)) {
      const Accumulators<kTileRows> zero = {};
      store_tile_row<Out, kTileRows>(p, r * kTileRows + m_base, n0 + n_base, lane, zero);
    }
#endif
}

template <int kTileRows>
int smem_bytes(int tile_cols) {
  return kStages<kTileRows> * mma_stage::stage_halves(kTileRows, kBlockN, tile_cols) * 2;
}

// The kernel, its dynamic shared-memory limit raised to `bytes` (once per instantiation and size: the kernels'
// function pointers share one type, so each needs its own DynamicSmemLimit).
template <class Element, class Out, int kTileRows>
auto ready_kernel(int bytes) {
  const auto kernel = stream_tile_spmm_kernel<Element, Out, kTileRows>;
  static cuda::DynamicSmemLimit smem_limit;
  smem_limit.raise(kernel, bytes);
  return kernel;
}

template <class Element, class Out, int kTileRows>
void launch(const TileParams& p, const StreamWork& w, cudaStream_t stream) {
  const int bytes = smem_bytes<kTileRows>(p.tile_cols);
  const auto kernel = ready_kernel<Element, Out, kTileRows>(bytes);
  const int64_t token_blocks = ceil_div(p.n, int64_t{kBlockN});
  require(token_blocks <= 65535, ErrorCode::unsupported, "stream tile: more than 65535 token blocks");
  const dim3 grid(static_cast<unsigned>(w.ctas), static_cast<unsigned>(token_blocks));
  kernel<<<grid, WarpTiling<kTileRows>::kThreads, bytes, stream>>>(p, w);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

// CTAs of tile rows kTileRows resident on the current device at once (the f16 kernel stands for all: the types
// change neither shared memory nor threads).
template <int kTileRows>
int resident_ctas(int tile_cols) {
  const int bytes = smem_bytes<kTileRows>(tile_cols);
  int per_sm = 0;
  NMKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, ready_kernel<__half, __half, kTileRows>(bytes), WarpTiling<kTileRows>::kThreads, bytes));
  return std::max(per_sm, 1) * nm24::device_facts().sm_count;
}

}  // namespace

int stream_max_ctas(int tile_rows, int tile_cols) {
  switch (tile_rows) {
    case 16:
      return resident_ctas<16>(tile_cols);
    case 32:
      return resident_ctas<32>(tile_cols);
    case 64:
      return resident_ctas<64>(tile_cols);
    case 128:
      return resident_ctas<128>(tile_cols);
  }
  throw Error(ErrorCode::invalid_argument, "stream tile: no kernel for tile rows " + std::to_string(tile_rows));
}

std::size_t stream_partial_floats(int tile_rows, int64_t max_ctas, int64_t n) {
  return static_cast<std::size_t>(ceil_div(n, int64_t{kStreamBlockN}) * max_ctas * 2 * tile_rows * kStreamBlockN);
}

template <class Element, class Out>
void launch_stream(const TileParams& p, const StreamWork& w, cudaStream_t stream) {
  switch (p.tile_rows) {
    case 16:
      return launch<Element, Out, 16>(p, w, stream);
    case 32:
      return launch<Element, Out, 32>(p, w, stream);
    case 64:
      return launch<Element, Out, 64>(p, w, stream);
    case 128:
      return launch<Element, Out, 128>(p, w, stream);
  }
  throw Error(ErrorCode::invalid_argument, "stream tile: no kernel for tile rows " + std::to_string(p.tile_rows));
}

template void launch_stream<__half, __half>(const TileParams&, const StreamWork&, cudaStream_t);
template void launch_stream<__half, float>(const TileParams&, const StreamWork&, cudaStream_t);
template void launch_stream<__nv_bfloat16, __nv_bfloat16>(const TileParams&, const StreamWork&, cudaStream_t);
template void launch_stream<__nv_bfloat16, float>(const TileParams&, const StreamWork&, cudaStream_t);

}  // namespace nmkit::gpu::tile
