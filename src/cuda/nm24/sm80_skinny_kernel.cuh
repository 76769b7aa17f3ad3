#pragma once
// The skinny 2:4 SpMM (sm_80 .. sm_90) for products with few columns (decode-sized C): mma.sp with A loaded straight
// into registers from the packed weight (each register one 128-byte core matrix over the warp) and B from global
// memory (L1/L2: every CTA reads the same few columns), no shared-memory pipeline. B col-major and 16-byte aligned is
// copied by each warp in 16-byte chunks into its own shared memory and read by ldmatrix (a quarter of the load
// instructions of 32-bit pairs, and no B registers held across the batch); any other B is loaded into registers by
// pairs along K or by elements.
//
// A k-block is 64 bytes of a B column: one m16n8k32 on 16-bit values; on 8-bit codes (fp8 or int8, x quantized per
// token, B in chunks only) one m16n8k64 for int8 or two f16 m16n8k32 on fp8 widened in registers, the dot products
// scaled per row and token before the epilogue as the Hopper kernel scales them.
//
// A CTA owns kSlabs 16-row slabs and 8 * kTilesN columns; its eight warps split K (warp w takes k-blocks w, w + 8,
// ...) and their partial tiles are summed through shared memory in warp order (deterministic). Where the Hopper
// kernel's 128-row CTA tiles leave most SMs idle (a 768-row weight is six of them), this grid has a CTA per one or
// two slabs, and a CTA's time is one round trip of its loads rather than a pipeline's rounds.
//
// V:N:M (SkinnyB::gathered): the CTA's rows lie in one row block of the gather table, and each warp stages its batch's
// B as the chunk path does, but element by element through the table (any B layout or alignment): lane l of a
// k-block loads condensed column l's row of B for each of the CTA's columns, so that a decode product reads x in
// place and only the rows its weight selects.
//
// Split-K (sm_90): a cluster of `split` CTAs shares one tile, warp w of rank r taking k-blocks r * 8 + w, + 8 split,
// ..., so that a long K still fits one batch of loads a warp; each CTA sums its warps, then each sums a share of
// the tile over the cluster's ranks in rank order through distributed shared memory, and applies the epilogue.
// Included by the .cu files that instantiate it (sm80_skinny_spmm.cu, sm80_skinny_8bit_spmm.cu).
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "../common/check.cuh"
#include "../common/launch.cuh"
#include "../common/smem.cuh"
#include "../ptx/cluster.cuh"
#include "../ptx/cp_async.cuh"
#include "../ptx/griddep.cuh"
#include "../ptx/ldmatrix.cuh"
#include "../ptx/mma_sp.cuh"
#include "../ptx/shared.cuh"
#include "nm24_common.cuh"
#include "nmkit/gpu/detail/nm24_layout_8bit.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"

namespace nmkit::gpu::nm24 {
namespace {

constexpr int kWarps = kSkinnyWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = kSkinnyMmaCols;
// A k-block of B's column: one sparse MMA's K of 16-bit values or of 8-bit codes, the same 64 bytes either way.
constexpr int kKBlockBytes = 64;
template <class Element>
constexpr int kKBlockElements = kEightBit<Element> ? x8::kFragmentK : kFragmentK;
static_assert(kKBlockElements<__half> * 2 == kKBlockBytes && kKBlockElements<int8_t> == kKBlockBytes);

template <int kTilesN, int kSlabs>
struct SkinnyShape {
  static constexpr int kRows = kSlabs * kSlabRows;
  static constexpr int kCols = kTilesN * kTileN;
  // k-blocks a warp loads before it multiplies them: what it keeps in flight, as many as the registers allow.
  static constexpr int kBatch = skinny_batch(kSlabs, kTilesN);
  // The warps' partial tiles, [warp][row][column] of 4-byte sums (fp32, or int32 for int8 codes), a row padded by two
  // sums against bank conflicts of the sum's row-order reads (it stays 8-byte aligned for the pair writes).
  static constexpr int kRowStride = kCols + 2;
  static constexpr int kPartialBytes = kWarps * kRows * kRowStride * static_cast<int>(sizeof(float));
  // B staged in chunks: per warp, k-block of its batch and column, the column's 64 bytes of the k-block (four
  // 16-byte chunks); the partial tiles reuse the space once every warp has multiplied.
  static constexpr int kChunkBytes = 16;
  static constexpr int kColumnBytes = kKBlockBytes;
  static constexpr int kChunksPerColumn = kColumnBytes / kChunkBytes;
  static constexpr int kWarpStagingBytes = kBatch * kCols * kColumnBytes;
  static constexpr int kStagingBytes = kWarps * kWarpStagingBytes;
  static constexpr int smem_bytes(bool chunk_b) {
    return chunk_b && kStagingBytes > kPartialBytes ? kStagingBytes : kPartialBytes;
  }
  static_assert(kCols * kChunksPerColumn % 32 == 0, "a k-block's chunks are whole rounds of the warp's lanes");
  static_assert(kChunksPerColumn == 4, "one ldmatrix.x4 reads a column tile's four chunks");
  // Chunk c of column n in k-block i of a warp's batch: the chunks XOR-swizzled by the column pair, so that the eight
  // columns one ldmatrix matrix reads (64 bytes apart) fall in eight different 16-byte bank groups.
  __device__ static constexpr uint32_t chunk_offset(int i, int n, int c) {
    return static_cast<uint32_t>((i * kCols + n) * kColumnBytes + (c ^ ((n >> 1) & 3)) * kChunkBytes);
  }
};

// Two B values along K, (k, col) and (k + 1, col), as mma.sp's B register holds them; zeros past K and C.
// pair_loads: B col-major with an even leading dimension and a 4-byte aligned base, so that a pair is one load.
__device__ __forceinline__ uint32_t b_pair(const Params& p, bool pair_loads, int64_t k, int64_t col) {
  const auto* b = static_cast<const uint16_t*>(p.b);
  if (col >= p.n) return 0u;
  if (pair_loads && k + 1 < p.cols) return __ldg(reinterpret_cast<const uint32_t*>(b + col * p.ldb + k));
  const int64_t at0 = p.b_col_major ? col * p.ldb + k : k * p.ldb + col;
  const int64_t step = p.b_col_major ? 1 : p.ldb;  // from (k, col) to (k + 1, col)
  const uint32_t lo = k < p.cols ? __ldg(b + at0) : 0u, hi = k + 1 < p.cols ? __ldg(b + at0 + step) : 0u;
  return lo | (hi << 16);
}

// Copies k-block kb of the CTA's columns into slot i of the warp's staging (B col-major, 16-byte aligned columns,
// K a multiple of a chunk's elements, so that a chunk is all in or all past K); zeros past K and C.
template <class Element, class Shape>
__device__ __forceinline__ void stage_b_chunks(const Params& p, uint32_t staging, int i, int64_t kb, int64_t col0,
                                               int lane) {
  const auto* b = static_cast<const Element*>(p.b);
  constexpr int kChunks = Shape::kCols * Shape::kChunksPerColumn;
  constexpr int kChunkElements = Shape::kChunkBytes / static_cast<int>(sizeof(Element));
#pragma unroll
  for (int q = lane; q < kChunks; q += 32) {
    const int n = q / Shape::kChunksPerColumn, c = q % Shape::kChunksPerColumn;
    const int64_t col = col0 + n, k = kb * kKBlockElements<Element> + c * kChunkElements;
    const bool inside = col < p.n && k < p.cols;
    ptx::cp_async_16(staging + Shape::chunk_offset(i, n, c), inside ? b + col * p.ldb + k : b,
                     inside ? Shape::kChunkBytes : 0);
  }
}

// fp8 codes on Hopper: mma.sync takes e4m3 and e5m2 only as a software emulation there (sm_89's instruction), so the
// kernel widens both operands to f16 itself (exact: every e4m3 and e5m2 value is an f16) and runs two f16 m16n8k32
// instructions per 8-bit k-block, h = 0 and 1 over its k 32h .. 32h + 31. Their K order is chosen so that the 8-bit
// A registers need no exchange between lanes: A register u + 2h (row 8u + g, stored bytes 16h + 4t .. +3, the kept
// pairs of groups 8h + 2t and 8h + 2t + 1) widens to f16 registers u (group t) and u + 2 (group 4 + t) of
// instruction h, i.e. its f16 group t is 8-bit group 8h + 2t and its group 4 + t is 8h + 2t + 1. B's codes and the
// metadata's nibbles are read in that order (multiply_widened_fp8, fp8_meta_word). int8 has its native m16n8k64.
template <class Element>
constexpr bool kWidenedFp8 = std::is_same_v<Element, __nv_fp8_e4m3> || std::is_same_v<Element, __nv_fp8_e5m2>;

// A lane's A fragment: four value registers and the metadata of its instruction(s); 16-bit values and int8 codes
// have one metadata word, widened fp8 one per f16 instruction.
template <class Element>
struct SkinnyAFragment {
  uint32_t values[kRegistersPerFragment];
  uint32_t meta[kWidenedFp8<Element> ? 2 : 1];
};

// The f16 metadata word of instruction h for lane (g, t), t in {0, 1}, from the 8-bit words of its quad (quad[t']:
// row g + 8 (t' % 2), 8-bit groups 8 (t' / 2) ..): f16 group q of row g is 8-bit group 8h + 2q + t (t = 0: the even
// nibbles, t = 1: the odd ones), row g in bits [0, 16), row g + 8 in [16, 32).
__device__ __forceinline__ uint32_t fp8_meta_word(const uint4& quad, int h, int t) {
  const uint32_t row_g = h == 0 ? quad.x : quad.z, row_g8 = h == 0 ? quad.y : quad.w;
  const int shift = 4 * (t % 2);
  constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;
  const uint32_t a = (row_g >> shift) & kLowNibbles, b = (row_g8 >> shift) & kLowNibbles;
  // Bytes 0 and 2 of x | x >> 4 hold nibble pairs (0, 2) and (4, 6) of the word shifted down.
  return __byte_perm(a | (a >> 4), b | (b >> 4), 0x6420);
}

// Where lane t finds f16 register r's two codes of instruction h inside the staged k-block's column: chunk 2h + r % 2
// (k 32h + 16 (r % 2) ..), bytes 4 (r / 2) + 8 (t / 2) + 2 (t % 2) .. +1 (the group order above). Registers r and r + 2
// lie in one 8-byte half, which one 64-bit load brings.
__device__ __forceinline__ int fp8_b_chunk(int h, int r) { return 2 * h + r % 2; }
__device__ __forceinline__ int fp8_b_half(int t) { return 8 * (t / 2); }

template <class Element>
__device__ __forceinline__ uint32_t widen_fp8x2(uint32_t codes) {
  constexpr __nv_fp8_interpretation_t kKind = std::is_same_v<Element, __nv_fp8_e5m2> ? __NV_E5M2 : __NV_E4M3;
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xFFFFu), kKind);
  return static_cast<uint32_t>(h.x) | static_cast<uint32_t>(h.y) << 16;
}

// A lane's A fragment of (slab, kb): 16-bit values as load_a_fragment; 8-bit codes as the mma.sp m16n8k64 fragment
// (nm24_layout_8bit.hpp: each register one core matrix too, a metadata word per lane; widened fp8 takes its quad's
// four words for its two f16 instructions).
template <class Element>
__device__ __forceinline__ SkinnyAFragment<Element> load_skinny_a(const Params& p, int64_t slab, int64_t kb, int lane) {
  SkinnyAFragment<Element> a;
  if constexpr (kEightBit<Element>) {
    const uint32_t* first = p.a_values + x8::packed_fragment_word(slab, kb, p.kblocks, lane);
#pragma unroll
    for (int r = 0; r < kRegistersPerFragment; ++r) a.values[r] = __ldg(first + x8::packed_register_words(r));
    const uint32_t* words = p.a_meta + packed_fragment_index(slab, kb, p.kblocks) * kLanes;
    if constexpr (kWidenedFp8<Element>) {
      const uint4 quad = __ldg(reinterpret_cast<const uint4*>(words) + lane / 4);
      a.meta[0] = fp8_meta_word(quad, 0, lane % 4);
      a.meta[1] = fp8_meta_word(quad, 1, lane % 4);
    } else {
      a.meta[0] = __ldg(words + lane);
    }
  } else {
    const AFragment f = load_a_fragment(p, slab, kb, lane);
#pragma unroll
    for (int r = 0; r < kRegistersPerFragment; ++r) a.values[r] = f.values[r];
    a.meta[0] = f.meta;
  }
  return a;
}

// One k-block of one slab and column tile: acc += A x B, B's fragment `b` (ldmatrix's, for all but widened fp8).
template <class Element, class Accumulator>
__device__ __forceinline__ void skinny_mma(Accumulator (&acc)[4], const SkinnyAFragment<Element>& a,
                                           const uint32_t (&b)[4]) {
  if constexpr (std::is_same_v<Element, int8_t>)
    ptx::mma_sp_m16n8k64_s8(acc, a.values, b, a.meta[0]);
  else
    ptx::mma_sp_m16n8k32<typename ElementTraits<Element>::Mma>(acc, a.values, b, a.meta[0]);
}

// One k-block of widened fp8 (batch slot i): per instruction h, each slab's A widened once and each column tile's B
// once, from the two 8-byte halves (chunks 2h and 2h + 1) that fp8_b_half names: f16 register r of the lane's two
// codes is in chunk 2h + r % 2, word r / 2, at bit 16 (t % 2).
template <class Element, class Shape, int kTilesN, int kSlabs>
__device__ __forceinline__ void multiply_widened_fp8(float (&acc)[kSlabs][kTilesN][4],
                                                     const SkinnyAFragment<Element> (&a)[kSlabs], uint32_t staging,
                                                     int i, int g, int t) {
  const int pick = 16 * (t % 2);
  const uint32_t half = static_cast<uint32_t>(fp8_b_half(t));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t a16[kSlabs][4];
#pragma unroll
    for (int s = 0; s < kSlabs; ++s) {
      const uint32_t row_g = a[s].values[2 * h], row_g8 = a[s].values[2 * h + 1];
      a16[s][0] = widen_fp8x2<Element>(row_g), a16[s][1] = widen_fp8x2<Element>(row_g8);
      a16[s][2] = widen_fp8x2<Element>(row_g >> 16), a16[s][3] = widen_fp8x2<Element>(row_g8 >> 16);
    }
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      const int n = kTileN * j + g;  // this lane's column of the tile
      const uint2 lo = ptx::ld_shared_v2_b32(staging + Shape::chunk_offset(i, n, fp8_b_chunk(h, 0)) + half);
      const uint2 hi = ptx::ld_shared_v2_b32(staging + Shape::chunk_offset(i, n, fp8_b_chunk(h, 1)) + half);
      const uint32_t b16[4] = {widen_fp8x2<Element>(lo.x >> pick), widen_fp8x2<Element>(hi.x >> pick),
                               widen_fp8x2<Element>(lo.y >> pick), widen_fp8x2<Element>(hi.y >> pick)};
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) ptx::mma_sp_m16n8k32<ptx::MmaF16>(acc[s][j], a16[s], b16, a[s].meta[h]);
    }
  }
}

// Stages the warp's batch (k-blocks kb0, kb0 + workers, ...; slot i for the i-th) of the CTA's columns, as
// stage_b_chunks lays it out, from the rows of B that the CTA's row block of the gather table names (kNoBRow, k-blocks
// past K and columns past C: zeros). A store waits for its value, so every load of the batch is issued before the
// first store: the table's rows, then B's elements, one round trip each for the whole batch.
template <class Shape>
__device__ __forceinline__ void stage_b_gathered(const Params& p, const int32_t* table, uint32_t staging, int64_t kb0,
                                                 int64_t workers, int64_t col0, int lane) {
  int32_t rows[Shape::kBatch];
#pragma unroll
  for (int i = 0; i < Shape::kBatch; ++i) {
    const int64_t kb = kb0 + i * workers;  // the same for the whole warp
    rows[i] = kb < p.kblocks ? __ldg(table + kb * kFragmentK + lane) : kNoBRow;
  }
  // B(row, col0 + n) is at line + n * step: one address a k-block, walked along the CTA's columns.
  const auto* b = static_cast<const uint16_t*>(p.b);
  const int64_t step = p.b_col_major ? p.ldb : 1;
  const int64_t columns = p.n - col0;  // the CTA's columns inside C
  uint16_t values[Shape::kBatch][Shape::kCols];
#pragma unroll
  for (int i = 0; i < Shape::kBatch; ++i) {
    const int64_t row = rows[i] == kNoBRow ? 0 : rows[i];
    const uint16_t* line = b + (p.b_col_major ? col0 * p.ldb + row : row * p.ldb + col0);
#pragma unroll
    for (int n = 0; n < Shape::kCols; ++n)
      values[i][n] = rows[i] != kNoBRow && n < columns ? __ldg(line + n * step) : uint16_t{0};
  }
  const uint32_t half = (lane % 8) * 2;  // the condensed column's place in its 16-byte chunk
#pragma unroll
  for (int i = 0; i < Shape::kBatch; ++i)
#pragma unroll
    for (int n = 0; n < Shape::kCols; ++n)
      ptx::st_shared_b16(staging + Shape::chunk_offset(i, n, lane / 8) + half, values[i][n]);
}

// The cluster's CTAs (split-K) or the CTA alone: its rank and size.
template <bool kClustered>
__device__ __forceinline__ uint32_t split_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kClustered) return ptx::cluster_ctarank();
#endif
  return 0;
}
template <bool kClustered>
__device__ __forceinline__ uint32_t split_size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kClustered) return ptx::cluster_nctarank();
#endif
  return 1;
}

// A partial tile's pair of sums (8-byte aligned).
__device__ __forceinline__ void store_pair(float* at, float a, float b) {
  *reinterpret_cast<float2*>(at) = make_float2(a, b);
}
__device__ __forceinline__ void store_pair(int32_t* at, int32_t a, int32_t b) {
  *reinterpret_cast<int2*>(at) = make_int2(a, b);
}

template <class Accumulator>
__device__ __forceinline__ Accumulator from_bits(uint32_t bits) {
  if constexpr (std::is_same_v<Accumulator, float>)
    return __uint_as_float(bits);
  else
    return static_cast<int32_t>(bits);
}

// D(row, col)'s sum before the epilogue: 8-bit codes' dot product times its row's and token's scales, in the Hopper
// kernel's order (scale_dot_products); 16-bit values' as it is.
template <class Element, class Accumulator>
__device__ __forceinline__ float scaled_sum(Accumulator sum, const CodeScales& scales, int64_t row, int64_t col,
                                            int64_t n) {
  if constexpr (kEightBit<Element>) {
    if (col >= n) return 0.0f;  // not stored; the row scales cover the padded rows
    return static_cast<float>(sum) * (__ldg(scales.rows + row) * __ldg(scales.tokens + col));
  } else {
    return sum;
  }
}

// kB: B staged in shared memory (SkinnyB::chunks, gathered) or loaded into registers (elements, or pairs where
// pair_loads; 16-bit values only). scales: 8-bit codes' row and token scales (null for 16-bit values).
template <class Element, class Out, int kTilesN, int kSlabs, SkinnyB kB, bool kClustered>
__global__ void __launch_bounds__(kThreads)
    sm80_skinny_kernel(const Params p, int64_t slab_groups, bool pair_loads, const CodeScales scales) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Shape = SkinnyShape<kTilesN, kSlabs>;
  using Accumulator = typename ElementTraits<Element>::Accumulator;
  constexpr bool kStagedB = kB == SkinnyB::chunks || kB == SkinnyB::gathered;
  static_assert(!kEightBit<Element> || kB == SkinnyB::chunks, "8-bit codes are staged in chunks");
  extern __shared__ __align__(16) unsigned char smem[];
  Accumulator* partial = reinterpret_cast<Accumulator*>(smem);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t split = split_size<kClustered>(), rank = split_rank<kClustered>();
  // Slab groups fastest: the CTAs running together read the same columns of B. A cluster's CTAs are adjacent.
  const int64_t tile = int64_t{blockIdx.x} / split;
  const int64_t slab0 = tile % slab_groups * kSlabs;
  const int64_t col0 = tile / slab_groups * Shape::kCols;
  const int64_t kblocks = p.kblocks;
  const int64_t workers = int64_t{kWarps} * split;  // warps sharing the tile's K

  // A warp's batch of A fragments: k-blocks kb0, kb0 + workers, ... (those inside K).
  const int64_t first_kb0 = rank * kWarps + warp;
  SkinnyAFragment<Element> a[Shape::kBatch][kSlabs];
  const auto load_a = [&](int64_t kb0) {
#pragma unroll
    for (int i = 0; i < Shape::kBatch; ++i) {
      const int64_t kb = kb0 + i * workers;  // the same for the whole warp
      if (kb >= kblocks) break;
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) a[i][s] = load_skinny_a<Element>(p, slab0 + s, kb, lane);
    }
  };
  // B (and C, D) may be the kernel before's outputs (an overlapping launch); the weight is not (overlap_launch's
  // contract), so the first batch of A goes out before the wait and its round trip overlaps that kernel's end.
  load_a(first_kb0);
  ptx::grid_dependency_wait();

  const uint32_t staging = ptx::smem_address(smem + warp * Shape::kWarpStagingBytes);
  // V:N:M: the gather table's row block of the CTA's rows (whole slabs of one block: block_m <= gather_block_rows).
  const int32_t* table =
      kB == SkinnyB::gathered ? p.b_gather + slab0 * kSlabRows / p.gather_block_rows * p.gather_stride : nullptr;
  Accumulator acc[kSlabs][kTilesN][4] = {};
  const int64_t round = workers * Shape::kBatch;
  for (int64_t kb0 = first_kb0; kb0 < kblocks; kb0 += round) {
    uint32_t b[kStagedB ? 1 : Shape::kBatch][kTilesN][4];  // the register path's B
#pragma unroll
    for (int i = 0; i < Shape::kBatch; ++i) {
      const int64_t kb = kb0 + i * workers;
      if (kb >= kblocks) break;
      if constexpr (kB == SkinnyB::chunks) {
        stage_b_chunks<Element, Shape>(p, staging, i, kb, col0, lane);
      } else if constexpr (!kStagedB) {
#pragma unroll
        for (int j = 0; j < kTilesN; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r)
            b[i][j][r] = b_pair(p, pair_loads, kb * kFragmentK + 8 * r + 2 * t, col0 + kTileN * j + g);
      }
    }
    if constexpr (kB == SkinnyB::gathered) stage_b_gathered<Shape>(p, table, staging, kb0, workers, col0, lane);
    if constexpr (kB == SkinnyB::chunks) {
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
    }
    if constexpr (kStagedB) __syncwarp();  // every lane's chunks have landed
#pragma unroll
    for (int i = 0; i < Shape::kBatch; ++i) {
      if (kb0 + i * workers >= kblocks) break;
      if constexpr (kWidenedFp8<Element>) {
        multiply_widened_fp8<Element, Shape>(acc, a[i], staging, i, g, t);
      } else {
#pragma unroll
        for (int j = 0; j < kTilesN; ++j) {
          uint32_t fragment[4];
          if constexpr (kStagedB) {
            // Matrix m of the x4 is chunk m (k 8m .. 8m + 7) of the tile's eight columns: register m of mma.sp's B.
            ptx::ldmatrix_x4(fragment, staging + Shape::chunk_offset(i, kTileN * j + lane % 8, lane / 8));
          } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) fragment[r] = b[i][j][r];
          }
#pragma unroll
          for (int s = 0; s < kSlabs; ++s) skinny_mma<Element>(acc[s][j], a[i][s], fragment);
        }
      }
    }
    if constexpr (kStagedB) __syncwarp();            // the batch is read before the next one is copied over it
    if (kb0 + round < kblocks) load_a(kb0 + round);  // the next batch's A, its registers now free
  }
  ptx::launch_dependents();
  if constexpr (kStagedB) __syncthreads();  // the partial tiles overwrite the other warps' staging

  // Each warp's partial tile (accumulator e of tile (s, j): row 16 s + g + 8 (e / 2), column 8 j + 2 t + e % 2).
  Accumulator* mine = partial + warp * Shape::kRows * Shape::kRowStride;
#pragma unroll
  for (int s = 0; s < kSlabs; ++s)
#pragma unroll
    for (int j = 0; j < kTilesN; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        store_pair(mine + (kSlabRows * s + g + 8 * h) * Shape::kRowStride + kTileN * j + 2 * t, acc[s][j][2 * h],
                   acc[s][j][2 * h + 1]);
  __syncthreads();

  // The sum in warp order, stored in D's order (rows fastest for D col-major) so that a warp's stores are contiguous.
  const int64_t row0 = slab0 * kSlabRows;
  const bool plain = epilogue_is_plain(p);
  constexpr int kElements = Shape::kRows * Shape::kCols;
  const auto store = [&](int e, Accumulator sum) {
    const int row = p.d_col_major ? e % Shape::kRows : e / Shape::kCols;
    const int col = p.d_col_major ? e / Shape::kRows : e % Shape::kCols;
    const float value = scaled_sum<Element>(sum, scales, row0 + row, col0 + col, p.n);
    if (plain)
      plain_store<Out>(p, row0 + row, col0 + col, value);
    else
      epilogue_store<Out>(p, row0 + row, col0 + col, value);
  };
  // Element e's place in a warp's partial tile.
  const auto slot = [&](int e) {
    const int row = p.d_col_major ? e % Shape::kRows : e / Shape::kCols;
    const int col = p.d_col_major ? e / Shape::kRows : e % Shape::kCols;
    return row * Shape::kRowStride + col;
  };
  const auto sum_of_warps = [&](int e) {
    Accumulator sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w * Shape::kRows * Shape::kRowStride + slot(e)];
    return sum;
  };
  if (split == 1) {
    for (int e = threadIdx.x; e < kElements; e += kThreads) store(e, sum_of_warps(e));
    return;
  }
#if __CUDA_ARCH__ >= 900
  if constexpr (kClustered) {
    // The CTA's sum into warp 0's tile (each element read and written by one thread), then a share of the tile per
    // rank summed over the cluster in rank order.
    for (int e = threadIdx.x; e < kElements; e += kThreads) partial[slot(e)] = sum_of_warps(e);
    ptx::cluster_sync();  // every CTA's sum is in place
    for (int e = static_cast<int>(rank) * kThreads + threadIdx.x; e < kElements;
         e += static_cast<int>(split) * kThreads) {
      Accumulator sum = 0;
      for (uint32_t r = 0; r < split; ++r)
        sum += from_bits<Accumulator>(ptx::ld_shared_cluster_b32(ptx::map_to_rank(partial + slot(e), r)));
      store(e, sum);
    }
    ptx::cluster_sync();  // no CTA leaves while another still reads its sum
  }
#endif
#endif
}

template <class Element, class Out, int kTilesN, int kSlabs, SkinnyB kB, bool kClustered>
void launch(const Params& p, bool pair_loads, const LaunchOn& on, const CodeScales& scales) {
  using Shape = SkinnyShape<kTilesN, kSlabs>;
  constexpr int kSmemBytes = Shape::smem_bytes(kB == SkinnyB::chunks || kB == SkinnyB::gathered);
  auto kernel = sm80_skinny_kernel<Element, Out, kTilesN, kSlabs, kB, kClustered>;
  static cuda::DynamicSmemLimit limit;  // one per kernel
  limit.raise(kernel, kSmemBytes);
  const int64_t slab_groups = ceil_div(ceil_div(p.rows, int64_t{kSlabRows}), int64_t{kSlabs});
  const int64_t ctas = slab_groups * ceil_div(p.n, int64_t{Shape::kCols}) * on.split;
  require(ctas <= std::numeric_limits<int32_t>::max(), ErrorCode::unsupported, [&] {
    return "nm24 skinny kernel: " + std::to_string(p.rows) + " rows by " + std::to_string(p.n) + " columns, split " +
           std::to_string(on.split) + ", need more than 2^31 - 1 CTAs";
  });
  const cuda::OverlappableLaunch launch_config(dim3(static_cast<unsigned>(ctas)), dim3(kThreads), kSmemBytes, on.stream,
                                               on.overlap, on.split);
  NMKIT_CUDA_CHECK(cudaLaunchKernelEx(launch_config.config(), kernel, p, slab_groups, pair_loads, scales));
}

// Calls f.template operator()<kTilesN, kSlabs>() for the tile block_m x block_n; throws for a tile not built.
template <class F>
decltype(auto) with_tile(int block_m, int block_n, F&& f) {
  const auto rows = [&]<int kTilesN>() -> decltype(auto) {
    if (block_m == 2 * kSlabRows) return f.template operator()<kTilesN, 2>();
    require(block_m == kSlabRows, ErrorCode::invalid_argument,
            [&] { return "nm24 skinny kernel: block_m must be 16 or 32, got " + std::to_string(block_m); });
    return f.template operator()<kTilesN, 1>();
  };
  switch (block_n) {
    case 8:
      return rows.template operator()<1>();
    case 16:
      return rows.template operator()<2>();
    case 32:
      return rows.template operator()<4>();
    case 64:
      return rows.template operator()<8>();
  }
  throw Error(ErrorCode::invalid_argument,
              "nm24 skinny kernel: block_n must be 8, 16, 32 or 64, got " + std::to_string(block_n));
}

}  // namespace

template <class Element, class Out>
void launch_skinny(const Params& p, int block_m, int block_n, SkinnyB b_path, const LaunchOn& on,
                   const CodeScales& scales) {
  require(on.split >= 1 && on.split <= kMaxClusterCtas, ErrorCode::invalid_argument, [&] {
    return "nm24 skinny kernel: split must be 1.." + std::to_string(kMaxClusterCtas) + ", got " +
           std::to_string(on.split);
  });
  const bool pairs = b_path == SkinnyB::pairs;
  require(b_path != SkinnyB::gathered || block_n <= kSkinnyMaxGatheredBlockN, ErrorCode::invalid_argument,
          [&] { return "nm24 skinny kernel: gathering B it takes block_n 8 or 16, got " + std::to_string(block_n); });
  if constexpr (kEightBit<Element>) {
    require(b_path == SkinnyB::chunks && block_n <= kSkinnyMax8BitBlockN && scales.rows && scales.tokens,
            ErrorCode::invalid_argument, [&] {
              return "nm24 skinny kernel: 8-bit codes take B in 16-byte chunks, block_n 8 or 16 and their scales, got "
                     "block_n " +
                     std::to_string(block_n);
            });
    with_tile(block_m, block_n, [&]<int kTilesN, int kSlabs>() {
      if constexpr (kTilesN * kTileN <= kSkinnyMax8BitBlockN)
        on.split > 1 ? launch<Element, Out, kTilesN, kSlabs, SkinnyB::chunks, true>(p, false, on, scales)
                     : launch<Element, Out, kTilesN, kSlabs, SkinnyB::chunks, false>(p, false, on, scales);
    });
  } else {
    with_tile(block_m, block_n, [&]<int kTilesN, int kSlabs>() {
      const auto run = [&]<SkinnyB kB>() {
        on.split > 1 ? launch<Element, Out, kTilesN, kSlabs, kB, true>(p, pairs, on, scales)
                     : launch<Element, Out, kTilesN, kSlabs, kB, false>(p, pairs, on, scales);
      };
      if (b_path == SkinnyB::chunks) {
        run.template operator()<SkinnyB::chunks>();
      } else if (b_path == SkinnyB::gathered) {
        // Decode-sized C only (skinny_block_n), which keeps its staging loop's registers and instantiations few.
        if constexpr (kTilesN * kTileN <= kSkinnyMaxGatheredBlockN) run.template operator()<SkinnyB::gathered>();
      } else {
        run.template operator()<SkinnyB::elements>();  // the register path: pairs or elements by pair_loads
      }
    });
  }
}

}  // namespace nmkit::gpu::nm24
