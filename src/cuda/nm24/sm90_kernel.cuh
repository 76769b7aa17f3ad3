#pragma once
// The Hopper sparse kernel behind the 2:4 and V:N:M SpMMs: wgmma.mma_async.sp (sm_90a), one producer
// warpgroup and two consumer warpgroups. Per stage (one k-tile, or two for split-K: kStageKTiles) the
// producer stages, on one mbarrier, the packed A tiles (values and metadata, contiguous in the tile-major packed
// layout) by two bulk copies, and B:
//   - 2:4 (BSource::tma): by TMA, K-major with the 128-byte swizzle that both TMA and the wgmma descriptor
//     understand (B col-major, the linear-layer layout x[T, K] row-major);
//   - 2:4 with B row-major (BSource::tma_rows): by TMA in 64-column boxes, MN-major, read with B transposed;
//   - V:N:M (gather_rows / gather_cols): the rows of B named by the weight's gather table, copied by the whole
//     producer warpgroup into the same swizzled layouts (MN-major for B row-major, K-major for B col-major).
// The kernel is three roles over one stage pipeline (common/pipeline.cuh): Producer, Consumer (the main loop) and
// an epilogue (store_from_registers or store_through_stages).
// Consumers hand wgmma.sp their A tile by shared-memory descriptor (the packed values are in its canonical layout;
// loading them into registers, the RS form, was 1-7 % slower: the wgmma waited on those loads),
// load only the metadata registers, and keep one wgmma group in flight while the next stage is waited for.
// Epilogue: the register epilogue (16-bit D final in registers, 64-column parts staged per warpgroup and stored by
// TMA, the stages left to the producer), or the staged one (fp32 through the stages; one tile per CTA). With the
// register epilogue a launch may be persistent: one CTA per SM loops over the tiles, the ring of stages running on
// from one tile to the next, so that the next tile's operands stream in while the last one's outputs are stored.
//
// CTA tile kBlockM x kBlockN x kBlockK = 128 x kBlockN x 64; consumer warpgroup w owns rows 64w..64w+63.
// Included by the .cu files that instantiate it (sm90_nm24_spmm.cu, ../vnm/sm90_vnm_spmm.cu).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "../common/check.cuh"
#include "../common/launch.cuh"
#include "../common/named_barrier.cuh"
#include "../common/pipeline.cuh"
#include "../common/sm90.cuh"
#include "../common/ring.cuh"
#include "../common/smem.cuh"
#include "../common/tensor_map.cuh"
#include "../ptx/cluster.cuh"
#include "../ptx/cp_async.cuh"
#include "../ptx/griddep.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "../ptx/wgmma_sp.cuh"
#include "nm24_common.cuh"
#include "sm90_cluster_epilogue.cuh"
#include "sm90_epilogue.cuh"

// Internal linkage: each including .cu file gets its own instantiations (no cross-file symbols).
namespace nmkit::gpu::nm24::sm90 {
namespace {

constexpr int kBlockM = 128;
constexpr int kBlockK = 64;  // one 128-byte swizzle row of halves
constexpr int kSwizzleRowBytes = 128;
// A k-tile is one 128-byte swizzle row of B's elements: 64 halves or 128 8-bit codes.
template <class Element>
constexpr int kTileK = kSwizzleRowBytes / static_cast<int>(sizeof(Element));
constexpr int kConsumers = 2;  // warpgroups doing math
using cuda::kWarpgroupThreads;
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
constexpr int kRowsPerConsumer = kBlockM / kConsumers;  // 64: one m64 wgmma
constexpr int kKBlocksPerTile = kBlockK / kFragmentK;   // 2 wgmma.sp per k-tile
constexpr int kSwizzleAlign = 1024;                     // 128B-swizzle atoms are 8 rows x 128 bytes
constexpr int kSharedMemoryLimit = cuda::kSm90SharedMemoryPerCta;

static_assert(kRowsPerConsumer == 64, "one consumer warpgroup issues m64 wgmma");
static_assert(kKBlocksPerTile * kFragmentK == kBlockK, "a k-tile is a whole number of sparse k32 steps");
constexpr int kKStepBytes = kSwizzleRowBytes / kKBlocksPerTile;  // 64: a sparse MMA step along a K-major B row
static_assert(kTileK<__half> == kBlockK, "16-bit k-tiles are the packed layout's");

constexpr int kTileFragments = kTileSlabs * kTileKBlocks;  // 16 fragments of 32 lanes
constexpr int kAValueBytes = kTileValueBytes;              // 8 KiB per k-tile
// A k-tile's metadata: 16-bit values store the words of half the lanes (packed_meta_word, 1 KiB), 8-bit values one
// word per lane (nm24_layout_8bit.hpp, 2 KiB). A stage's metadata slot holds either, so that the stage shapes do not
// depend on the element type.
constexpr int kAMetaSlotBytes = kTileFragments * kLanes * 4;
template <class Element>
constexpr int kAMetaBytes = kEightBit<Element> ? kAMetaSlotBytes : kTileMetaBytes;
static_assert(kAMetaBytes<__half> <= kAMetaSlotBytes && kAMetaBytes<uint8_t> <= kAMetaSlotBytes);
// The metadata word of `lane` in fragment `fragment` of a staged k-tile.
template <class Element>
__device__ __forceinline__ int staged_meta_word(int fragment, int lane) {
  if constexpr (kEightBit<Element>)
    return fragment * kLanes + lane;
  else
    return fragment * kMetaWordsPerFragment + meta_word_of_lane(lane);
}
static_assert(kAValueBytes == kTileFragments * kLanes * kRegistersPerFragment * 4, "values: 4 registers per lane");
// A warpgroup's m64 x k32 operand in the packed values: k-block kk of the tile, row groups 8w..8w+7 (the layout of
// packed_value_word): kKBlockValueBytes apart per k-block, 8 row groups of two core matrices per warpgroup.
constexpr uint32_t kAWarpgroupBytes = kRowsPerConsumer / 8 * 2 * kCoreMatrixBytes;  // 2 KiB
constexpr uint32_t kACoreKStride = kCoreMatrixBytes, kACoreRowStride = 2 * kCoreMatrixBytes;
static_assert(kBlockM == kPackRowAlign && kBlockK == kPackKAlign, "a CTA tile is one packed tile");

// Stage layout, for kKTiles k-tiles a stage: [kKTiles x kBTiles B tiles (kBlockN x 64 halves each, swizzled)]
// [kKTiles A value tiles][kKTiles A metadata tiles]; stages 1024-aligned. kBTiles = 2 when the CTA's rows are two
// V:N:M row blocks (V = 64) that gather different rows.
// kDeepPipeline (8-bit operands): a k-tile of codes is twice the math of one of halves for the same bytes, so a stage
// is consumed in half the time and the ring must hide the copies' latency with the same bytes in flight. It trades
// the register epilogue's second output buffer and the alignment slack (the dynamic shared memory is declared
// 1024-aligned; the kernel checks it) for a stage: n256 takes 5 stages instead of 4.
template <int kBlockN, int kBTiles = 1, int kKTilesPerStage = 1, bool kDeepPipeline = false>
struct Sm90Shape {
  static constexpr int kKTiles = kKTilesPerStage;
  static constexpr int kBBytes = kBlockN * kSwizzleRowBytes;  // one B tile of one k-tile
  static constexpr int kKTileBytes = kBTiles * kBBytes + kAValueBytes + kAMetaSlotBytes;
  static constexpr int kAValuesOffset = kKTiles * kBTiles * kBBytes;
  static constexpr int kAMetaOffset = kAValuesOffset + kKTiles * kAValueBytes;
  static constexpr int kStageBytes = kKTiles * kKTileBytes;
  // The register epilogue's buffers, two 64 x 64 16-bit output parts per consumer warpgroup, after the stages
  // (n-tiles of whole 64-column parts only; the others always take the staged epilogue): a warpgroup stages one
  // part while the copy engine still reads the other. They cost n256 its fifth stage, which measured neutral
  // against the register epilogue's gain.
  static constexpr int kPartColumns = sm90_epilogue::kLineElements;  // one 128-byte line of 16-bit outputs
  static constexpr bool kRegisterEpilogue = kBlockN % kPartColumns == 0;
  static constexpr int kOutputPartBytes = kRowsPerConsumer * kPartColumns * 2;
  static constexpr int kPartBuffers = kDeepPipeline ? 1 : 2;
  static constexpr int kAlignSlack = kDeepPipeline ? 0 : kSwizzleAlign;
  static constexpr int kOutputBytes = kRegisterEpilogue ? kConsumers * kPartBuffers * kOutputPartBytes : 0;
  static constexpr int kMaxStages = 12;
  // What the stages may take of a CTA's 227 KiB: all but the alignment slack, the output parts and the barriers.
  static constexpr int kPipelineBytes = kSharedMemoryLimit - kAlignSlack - kOutputBytes - 2 * kMaxStages * 8;
  static constexpr int kStages = kPipelineBytes / kStageBytes < kMaxStages ? kPipelineBytes / kStageBytes : kMaxStages;
  static constexpr int kBarrierBytes = 2 * kStages * 8;
  static constexpr int kSmemBytes = kAlignSlack + kStages * kStageBytes + kOutputBytes + kBarrierBytes;
  static_assert(kStageBytes % kSwizzleAlign == 0, "stages must keep the swizzle alignment");
  static_assert(kSmemBytes <= kSharedMemoryLimit, "the pipeline must fit in shared memory");
  static_assert(kStages >= 2, "the pipeline needs two stages");
  static_assert(sm90_epilogue::EpilogueTile<kBlockM, kBlockN>::kBytes <= kStages * kStageBytes,
                "the epilogue tile reuses the stages");
  static_assert(2 * sm90_epilogue::EpilogueTile<kRowsPerConsumer, kBlockN>::kBytes <= kStages * kStageBytes,
                "so do split-K's two staged halves");
};

// Where a stage's B tiles come from.
enum class BSource {
  tma,          // 2:4, B col-major: one TMA box per k-tile (K-major, 128-byte swizzle)
  tma_rows,     // 2:4, B row-major: one TMA box per 64 columns of the n-tile (MN-major, 128-byte swizzle)
  gather_rows,  // V:N:M, B row-major: the producer warpgroup cp.asyncs each gathered row (MN-major, swizzled)
  gather_cols,  // V:N:M, B col-major: the producer warpgroup gathers elements along K (K-major, swizzled)
};

template <BSource kSource>
struct BSourceTraits {
  static constexpr bool kGather = kSource == BSource::gather_rows || kSource == BSource::gather_cols;
  // B row-major lands MN-major (64-column atoms of 64 k-rows) and is read by wgmma with B transposed.
  static constexpr bool kMnMajor = kSource == BSource::gather_rows || kSource == BSource::tma_rows;
  // The gather loops need more registers than the single TMA-issuing thread; gathering along K (element by element)
  // the most: at 88 its producer spilled.
  static constexpr int kProducerRegisters = kSource == BSource::gather_cols ? 96 : kGather ? 88 : 40;
  static constexpr int kConsumerRegisters = kSource == BSource::gather_cols ? 200 : kGather ? 208 : 232;
  // Arrivals that complete a full barrier: the thread posting the transaction bytes, plus every producer
  // thread once its share of a gathered tile is written.
  static constexpr int kFullArrivals = kGather ? 1 + kWarpgroupThreads : 1;
  // setmaxnreg.inc waits for registers that the producer's .dec released: the budgets must fit what the
  // launch allocated (cuda::launch_registers), or the consumers wait forever.
  static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <=
                    (kConsumers + 1) * cuda::launch_registers(kThreads),
                "setmaxnreg budgets must fit the registers allocated at launch");
};

// K-tiles per stage. A split-K CTA (a grid under one wave, narrow n-tiles, B by TMA) does little math per k-tile, and
// its time is then the producer's rounds: each round's barrier wait, byte count, copy issues and ring step take ~0.2 us
// whatever the bytes (nmkit_copy_probe). Two k-tiles a stage halve the rounds: 1.2-1.4x on such grids. Grids without
// split-K keep one k-tile a stage: two measured 5-8 % slower at 86 CTAs of n16 (11008x4096, T <= 16), and no faster
// on wider tiles.
// A gathered stage is one k-tile whatever the split: the producer warpgroup's copies fill it k-tile by k-tile.
template <BSource kSource, bool kSplitK>
constexpr int kStageKTiles = kSplitK && !BSourceTraits<kSource>::kGather ? 2 : 1;
template <class Element, int kBlockN, BSource kSource, int kBTiles, bool kSplitK>
using StageShape = Sm90Shape<kBlockN, kBTiles, kStageKTiles<kSource, kSplitK>, kEightBit<Element> && !kSplitK>;

constexpr int kMnAtomHalves = 64;            // MN-major swizzle atom: 64 halves (128 B) along N
constexpr int kMnAtomBytes = kBlockK * 128;  // one atom column of a 64-row k-tile
constexpr int kKGroupBytes = 8 * 128;        // 8 k-rows of 128 B
constexpr int kChunkHalves = 8;              // 16-byte chunk

// 128-byte swizzle: the 16-byte chunk c of 128-byte row r sits at chunk c ^ (r % 8).
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) * 16); }

// One k-tile's gather entries (the 64 rows of B it reads), spread over a warp: lane l holds entries l and l + 32.
// Loaded one k-tile ahead so that the table's latency hides behind the wait for a free stage. (B col-major.)
struct TileRows {
  int32_t entry[2];
  __device__ static TileRows load(const int32_t* gather, int lane) {
    return {{__ldg(gather + lane), __ldg(gather + lane + 32)}};
  }
  // Entry k_local (0..63) for every lane; k_local may differ between lanes.
  __device__ int32_t at(int k_local) const {
    const int32_t low = __shfl_sync(0xffffffffu, entry[0], k_local % 32);
    const int32_t high = __shfl_sync(0xffffffffu, entry[1], k_local % 32);
    return k_local < 32 ? low : high;
  }
};

// B row-major (K x C, 16-byte aligned rows, C % 8 == 0): tile row k_local is B row entry(k_local), copied 16
// bytes at a time into the MN-major layout: atom a (columns 64a..64a+63), row k_local, chunk c ^ (k_local % 8).
// Eight lanes copy one 128-byte atom row (coalesced). Thread (warp w, lane l) copies tile rows
// 16w + 4(l / 8) + i (i < 4), chunk l % 8 of every atom: its four gather entries are one 16-byte load, where each
// row lands is fixed for the whole kernel, and the atoms of a row are immediate offsets of one source and one
// destination address. So a copy is one cp.async; the per-row work (entry to address) is done once per k-tile.
// Rows past K (kNoBRow) are zero-filled: A is zero there, and B may hold anything, Inf included. Columns past C
// are not copied at all: they only reach D's columns past C, which are never stored.
template <class Element, int kBlockN>
struct RowGather {
  static constexpr int kAtoms = kBlockN / kMnAtomHalves;
  static constexpr int kAtomRowBytes = kMnAtomHalves * static_cast<int>(sizeof(Element));  // 128
  static constexpr int kLanesPerAtomRow = kAtomRowBytes / (kChunkHalves * static_cast<int>(sizeof(Element)));
  static constexpr int kRowsPerThread = 4;  // one int4 of gather entries
  static constexpr int kRowsPerWarp = 32 / kLanesPerAtomRow * kRowsPerThread;
  static_assert(kWarpgroupThreads / 32 * kRowsPerWarp == kBlockK, "the producer warpgroup covers the k-tile's rows");
  static_assert(kBlockN % kMnAtomHalves == 0, "whole atoms");

  const char* column;  // B's row 0 at this thread's column of atom 0
  uint64_t row_bytes;
  int first_row;                        // tile row of entry 0
  uint32_t row_offset[kRowsPerThread];  // where each row's chunk lands in the tile (swizzled)
  uint32_t atoms_inside;                // bit a: this thread's column of atom a is inside C
  bool columns_full;                    // the CTA's n-tile is inside C (every CTA but the last column's)

  __device__ RowGather(const Params& p, int64_t n0, int thread) {
    const int lane = thread % 32, chunk = lane % kLanesPerAtomRow;
    first_row = (thread / 32) * kRowsPerWarp + (lane / kLanesPerAtomRow) * kRowsPerThread;
    const int64_t n = n0 + chunk * kChunkHalves;
    column = reinterpret_cast<const char*>(static_cast<const Element*>(p.b) + n);
    row_bytes = static_cast<uint64_t>(p.ldb) * sizeof(Element);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) row_offset[i] = static_cast<uint32_t>(swizzled(first_row + i, chunk));
    atoms_inside = 0;
#pragma unroll
    for (int a = 0; a < kAtoms; ++a) atoms_inside |= n + a * kMnAtomHalves < p.n ? 1u << a : 0u;
    columns_full = n0 + kBlockN <= p.n;
  }

  // This thread's gather entries of one k-tile (the table of that k-tile: 64 entries).
  __device__ int4 load(const int32_t* gather) const { return __ldg(reinterpret_cast<const int4*>(gather + first_row)); }

  __device__ void copy(uint32_t tile, int4 entries) const {
    if (columns_full)
      copy_rows<false>(tile, entries, std::make_integer_sequence<int, kAtoms>{});
    else
      copy_rows<true>(tile, entries, std::make_integer_sequence<int, kAtoms>{});
  }

 private:
  template <bool kColumnTail, int... kAtom>
  __device__ __forceinline__ void copy_rows(uint32_t tile, int4 entries, std::integer_sequence<int, kAtom...>) const {
    const int32_t entry[kRowsPerThread] = {entries.x, entries.y, entries.z, entries.w};
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bool inside = entry[i] >= 0;
      const char* src = column + static_cast<uint32_t>(inside ? entry[i] : 0) * row_bytes;
      const uint32_t dst = tile + row_offset[i];
      const int bytes = inside ? 16 : 0;
      ((!kColumnTail || (atoms_inside >> kAtom & 1u)
            ? ptx::cp_async_16_at<kAtom * kMnAtomBytes, kAtom * kAtomRowBytes>(dst, src, bytes)
            : void()),
       ...);
    }
  }
};

// B col-major (x[C, K] row-major): tile row n holds x[n0 + n, rows.at(0..63)] in the K-major layout. Lane l of
// producer warp w takes condensed columns 2l, 2l+1 of rows w, w+4, ...: a warp's loads stay inside one row of
// x. Loads are issued kBatch rows at a time, then stored, to keep many in flight.
template <class Element, int kBlockN>
__device__ __forceinline__ void gather_b_cols(const Params& p, unsigned char* tile, const TileRows& rows, int64_t n0,
                                              int thread) {
  constexpr int kWarps = kWarpgroupThreads / 32;
  constexpr int kBatch = 8;
  static_assert(kBlockN % (kWarps * kBatch) == 0, "whole batches of rows");
  const int warp = thread / 32, k_local = 2 * (thread % 32);
  const int32_t k0 = rows.at(k_local), k1 = rows.at(k_local + 1);
  const auto* b = static_cast<const uint16_t*>(p.b);
  const int valid_rows = static_cast<int>(min(static_cast<int64_t>(kBlockN), p.n - n0));  // past C: zeros
  const int column_offset = (k_local % kChunkHalves) * 2;
  for (int row0 = warp; row0 < kBlockN; row0 += kWarps * kBatch) {
    uint32_t pair[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int row = row0 + i * kWarps;
      const uint16_t* x = b + (n0 + row) * p.ldb;
      const bool inside = row < valid_rows;
      const uint32_t lo = inside && k0 >= 0 ? __ldg(x + k0) : 0u, hi = inside && k1 >= 0 ? __ldg(x + k1) : 0u;
      pair[i] = lo | (hi << 16);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int row = row0 + i * kWarps;
      *reinterpret_cast<uint32_t*>(tile + swizzled(row, k_local / kChunkHalves) + column_offset) = pair[i];
    }
  }
}

// The CTA tiles of D in launch order: groups of p.group_rows row tiles that sweep all column tiles, so that a
// wave reuses a few row tiles of A and column tiles of B from L2 instead of streaming A from HBM per column tile.
// A one-tile launch runs tile blockIdx.x; a persistent one (Params::persistent_ctas) tiles blockIdx.x + i gridDim.x.
template <int kBlockN>
struct TileOrder {
  int64_t row_tiles, col_tiles, tiles;
  __device__ explicit TileOrder(const Params& p)
      : row_tiles((p.rows + kBlockM - 1) / kBlockM),
        col_tiles((p.n + kBlockN - 1) / kBlockN),
        tiles(row_tiles * col_tiles) {}
  struct Origin {
    int64_t m0, n0;
  };
  __device__ Origin origin(const Params& p, int64_t tile) const {
    const int64_t group_size = p.group_rows * col_tiles;
    const int64_t group = tile / group_size, in_group = tile % group_size;
    const int64_t group_rows = min(static_cast<int64_t>(p.group_rows), row_tiles - group * p.group_rows);
    return {(group * p.group_rows + in_group % group_rows) * kBlockM, (in_group / group_rows) * kBlockN};
  }
};

// What one CTA computes. Without split-K: tiles blockIdx.x, + gridDim.x, ... (one, or a persistent CTA's several)
// over all k-tiles. With split-K (kSplitK: a cluster of `split` CTAs per tile, the launch's cluster size): the
// cluster's tile, CTA `rank` taking k-tiles [k_begin, k_end), the partial tiles summed by write_cluster_sum. A
// template flag, not a run-time one: the extra registers spilled the producer's 40.
template <bool kSplitK>
struct CtaWork {
  int64_t first_tile, tile_stride;
  int k_begin, k_end;
  uint32_t split;
  __device__ explicit CtaWork(int k_tiles) {
    if constexpr (kSplitK) {
      const uint32_t rank = ptx::cluster_ctarank();
      split = ptx::cluster_nctarank();
      first_tile = blockIdx.x / split, tile_stride = gridDim.x / split;
      k_begin = static_cast<int>(int64_t{k_tiles} * rank / split);
      k_end = static_cast<int>(int64_t{k_tiles} * (rank + 1) / split);
    } else {
      first_tile = blockIdx.x, tile_stride = gridDim.x, k_begin = 0, k_end = k_tiles, split = 1;
    }
  }
};

// Split-K serves grids under a wave, whose tiles are narrow (decode-sized C), with B by TMA or gathered by rows; it is
// instantiated for those only (wider tiles would spill the accumulators around the cluster sum).
template <int kBlockN, BSource kSource>
constexpr bool kSplitKTakes = kBlockN <= 64 && (kSource == BSource::tma || kSource == BSource::gather_rows);

// A consumer warpgroup's m64 x kBlockN dot products (wgmma_sp.cuh's register order) at rows row0.., columns n0..,
// scaled into fp32 outputs.
template <class Accumulator, int kAccumulators>
__device__ __forceinline__ void scale_dot_products(const Accumulator (&dots)[kAccumulators],
                                                   float (&out)[kAccumulators], const CodeScales& scales,
                                                   const Params& p, int64_t row0, int64_t n0, int thread_in_group) {
  const int warp = thread_in_group / 32, g = thread_in_group % 32 / 4, t = thread_in_group % 4;
  const int64_t r0 = row0 + 16 * warp + g, r1 = r0 + 8;  // within the padded rows
  const float w0 = __ldg(scales.rows + r0), w1 = __ldg(scales.rows + r1);
#pragma unroll
  for (int j = 0; j < kAccumulators / 4; ++j) {
    const int64_t c0 = n0 + 8 * j + 2 * t;
    const float x0 = c0 < p.n ? __ldg(scales.tokens + c0) : 0.0f,
                x1 = c0 + 1 < p.n ? __ldg(scales.tokens + c0 + 1) : 0.0f;
    out[4 * j] = static_cast<float>(dots[4 * j]) * (w0 * x0);
    out[4 * j + 1] = static_cast<float>(dots[4 * j + 1]) * (w0 * x1);
    out[4 * j + 2] = static_cast<float>(dots[4 * j + 2]) * (w1 * x0);
    out[4 * j + 3] = static_cast<float>(dots[4 * j + 3]) * (w1 * x1);
  }
}

// The CTA's shared memory: kStages stages on a 1024-byte boundary (the swizzle atom), then the register epilogue's
// output parts, then the pipeline's barriers.
template <class Shape>
struct SharedStorage {
  unsigned char* stages;
  unsigned char* outputs;
  uint64_t* barriers;
  __device__ explicit SharedStorage(unsigned char* raw)
      : stages(reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + kSwizzleAlign - 1) &
                                                ~uintptr_t{kSwizzleAlign - 1})),
        outputs(stages + Shape::kStages * Shape::kStageBytes),
        barriers(reinterpret_cast<uint64_t*>(outputs + Shape::kOutputBytes)) {}
  __device__ unsigned char* stage(int s) const { return stages + s * Shape::kStageBytes; }
};

// The producer warpgroup: for every stage's k-tiles of the CTA's tiles, waits for a free stage and fills it with the
// packed A tiles (values and metadata, two bulk copies) and the B tile(s) from kSource.
template <class Element, int kBlockN, BSource kSource, int kBTiles, bool kSplitK>
struct Producer {
  using Shape = StageShape<Element, kBlockN, kSource, kBTiles, kSplitK>;
  using Traits = BSourceTraits<kSource>;
  using Pipeline = cuda::StagePipeline<Shape::kStages>;
  static constexpr int kMetaBytes = kAMetaBytes<Element>;
  static constexpr int kABytes = kAValueBytes + kMetaBytes;
  // What the copies of one k-tile bring into a stage (its metadata slot may be larger).
  static constexpr int kKTileCopyBytes = kBTiles * Shape::kBBytes + kABytes;

  const Params& p;
  const CUtensorMap* b_map;
  const Pipeline& pipeline;
  const SharedStorage<Shape>& smem;
  int thread;   // in the producer warpgroup
  int k_tiles;  // of the whole of K (the packed A's row-tile stride)
  CtaWork<kSplitK> work;
  // The ring runs on across tiles: a persistent CTA's next tile streams in while the last one is stored.
  cuda::ProducerRing<Shape::kStages> ring{};

  __device__ void run(const TileOrder<kBlockN>& order, bool register_epilogue) {
    // Without a gather, one thread streams the A and B tiles.
    const bool streams = Traits::kGather || thread == 0;
    // A launch that overlaps the kernel before it (LaunchOn::overlap) starts its CTAs while that kernel finishes;
    // their producers wait for it before their first copy: all they read (B) or let the consumers write (D) may be
    // that kernel's. The consumers need no wait of their own: they touch C and D only after stages posted after it.
    ptx::grid_dependency_wait();
    for (int64_t tile = work.first_tile; streams && tile < order.tiles; tile += work.tile_stride) {
      const auto [m0, n0] = order.origin(p, tile);
      const int64_t row_tile = m0 / kBlockM;
      const auto* a_values = reinterpret_cast<const unsigned char*>(p.a_values) + row_tile * k_tiles * kAValueBytes;
      const auto* a_meta = reinterpret_cast<const unsigned char*>(p.a_meta) + row_tile * k_tiles * kMetaBytes;
      if constexpr (Traits::kGather)
        gather_tile(m0, n0, a_values, a_meta);
      else
        load_tile(n0, a_values, a_meta);
    }
    if constexpr (Traits::kGather) {
      ptx::cp_async_wait<0>();
      if (!register_epilogue) cuda::named_barrier_arrive<cuda::NamedBarrier::stages_drained, kThreads>();
    }
  }

 private:
  // One thread: per stage, B by TMA (a box per k-tile) and A by two bulk copies (its k-tiles are contiguous in the
  // packed layout), all counted by the stage's transaction bytes. A tile's last stage may hold fewer k-tiles.
  __device__ void load_tile(int64_t n0, const unsigned char* a_values, const unsigned char* a_meta) {
    // Stages and barriers as shared-space addresses, so that a round does not rebuild generic pointers.
    const uint32_t stages = ptx::smem_address(smem.stages), full_barriers = ptx::smem_address(pipeline.full(0));
    int64_t kt = work.k_begin;
    for (; kt + Shape::kKTiles <= work.k_end; kt += Shape::kKTiles)
      load_stage<Shape::kKTiles>(n0, a_values, a_meta, kt, stages, full_barriers);
    if constexpr (Shape::kKTiles == 2)
      if (kt < work.k_end) load_stage<1>(n0, a_values, a_meta, kt, stages, full_barriers);
    static_assert(Shape::kKTiles <= 2, "a tile's last stage holds one k-tile or a whole stage");
  }

  // k-tiles kt .. kt + kCount - 1 into the next stage.
  template <int kCount>
  __device__ void load_stage(int64_t n0, const unsigned char* a_values, const unsigned char* a_meta, int64_t kt,
                             uint32_t stages, uint32_t full_barriers) {
    const int s = ring.at.stage;
    const uint32_t stage = stages + s * Shape::kStageBytes,
                   full = full_barriers + s * static_cast<uint32_t>(sizeof(uint64_t));
    ring.acquire(pipeline);
    ptx::mbarrier_arrive_expect_tx(full, kCount * kKTileCopyBytes);
#pragma unroll
    for (int j = 0; j < kCount; ++j) {
      const uint32_t b_tile = stage + j * Shape::kBBytes;
      if constexpr (kSource == BSource::tma) {
        ptx::tma_load_2d(b_tile, b_map, full, static_cast<int32_t>((kt + j) * kTileK<Element>),
                         static_cast<int32_t>(n0));
      } else {  // atom a: columns n0 + 64a .. + 63 of k-rows (kt + j) * 64 .. + 63
#pragma unroll
        for (int a = 0; a < kBlockN / kMnAtomHalves; ++a)
          ptx::tma_load_2d(b_tile + a * kMnAtomBytes, b_map, full, static_cast<int32_t>(n0 + a * kMnAtomHalves),
                           static_cast<int32_t>((kt + j) * kBlockK));
      }
    }
    ptx::bulk_load(stage + Shape::kAValuesOffset, a_values + kt * kAValueBytes, kCount * kAValueBytes, full);
    // The k-tiles' metadata is contiguous in the packed layout: one copy fills their slots from the front.
    ptx::bulk_load(stage + Shape::kAMetaOffset, a_meta + kt * kMetaBytes, kCount * kMetaBytes, full);
    ring.advance();
  }

  // Every producer thread gathers its share of B; thread 0 also posts the A copies.
  __device__ void gather_tile(int64_t m0, int64_t n0, const unsigned char* a_values, const unsigned char* a_meta) {
    const int32_t* gather = p.b_gather + (m0 / p.gather_block_rows) * p.gather_stride;
    const int lane_in_warp = thread % 32;
    // Each k-tile's gather entries are loaded one k-tile ahead, behind the wait for a free stage.
    using Rows = std::conditional_t<kSource == BSource::gather_rows, int4, TileRows>;
    [[maybe_unused]] const RowGather<Element, kBlockN> row_gather(p, n0, thread);
    const auto load_rows = [&](int t, int64_t kt) {
      const int32_t* table = gather + t * p.gather_stride + kt * kBlockK;
      if constexpr (kSource == BSource::gather_rows)
        return row_gather.load(table);
      else
        return TileRows::load(table, lane_in_warp);
    };
    Rows next[kBTiles];
#pragma unroll
    for (int t = 0; t < kBTiles; ++t) next[t] = load_rows(t, work.k_begin);
    for (int64_t kt = work.k_begin; kt < work.k_end; ++kt, ring.advance()) {
      Rows rows[kBTiles];
#pragma unroll
      for (int t = 0; t < kBTiles; ++t) {
        rows[t] = next[t];
        if (kt + 1 < work.k_end) next[t] = load_rows(t, kt + 1);
      }
      const int s = ring.at.stage;
      unsigned char* stage = smem.stage(s);
      uint64_t* full = pipeline.full(s);
      ring.acquire(pipeline);
      if (thread == 0) {
        static_assert(Shape::kKTiles == 1, "a gathered stage is one k-tile");
        pipeline.expect_bytes(s, kABytes);
        ptx::bulk_load(stage + Shape::kAValuesOffset, a_values + kt * kAValueBytes, kAValueBytes, full);
        ptx::bulk_load(stage + Shape::kAMetaOffset, a_meta + kt * kMetaBytes, kMetaBytes, full);
      }
#pragma unroll
      for (int t = 0; t < kBTiles; ++t) {
        if constexpr (kSource == BSource::gather_rows)
          row_gather.copy(ptx::smem_address(stage + t * Shape::kBBytes), rows[t]);
        else
          gather_b_cols<Element, kBlockN>(p, stage + t * Shape::kBBytes, rows[t], n0, thread);
      }
      if constexpr (kSource == BSource::gather_rows) {
        ptx::cp_async_mbarrier_arrive_noinc(full);
      } else {
        ptx::fence_proxy_async_shared();  // the st.shared above, before wgmma reads them
        pipeline.post(s);
      }
    }
  }
};

// A consumer warpgroup's main loop: per stage, wait for it, issue its k-tiles as one wgmma.sp group, and hand the
// stage before it back once that group is done. Warp w of warpgroup c owns slab 4c + w of the tile.
template <class Element, int kBlockN, BSource kSource, int kBTiles, bool kSplitK>
struct Consumer {
  using Shape = StageShape<Element, kBlockN, kSource, kBTiles, kSplitK>;
  using Traits = BSourceTraits<kSource>;
  using Pipeline = cuda::StagePipeline<Shape::kStages>;
  using Wgmma = typename ElementTraits<Element>::template Wgmma<kBlockN>;
  using Accumulator = typename ElementTraits<Element>::Accumulator;
  using MetadataWords = uint32_t[Shape::kKTiles * kKBlocksPerTile];  // one register per k32 step of a stage
  static constexpr int kAccumulators = Wgmma::kAccumulators;

  const Pipeline& pipeline;
  uint32_t stages_base;
  int warpgroup;
  int lane;
  int slab_in_tile;
  Accumulator acc[kAccumulators];
  cuda::RingPosition<Shape::kStages> ring{};
  int in_flight_stage = -1;  // the stage the group still in flight reads, handed back once the next one is issued

  __device__ Consumer(const Pipeline& pipeline, const SharedStorage<Shape>& smem, int tid)
      : pipeline(pipeline),
        stages_base(ptx::smem_address(smem.stages)),
        warpgroup(tid / kWarpgroupThreads),
        lane(tid % 32),
        slab_in_tile(warpgroup * (kRowsPerConsumer / kSlabRows) + (tid % kWarpgroupThreads) / 32) {}

  // The tile's accumulators over all k_tiles; on return every wgmma of the tile is complete and the last stage is
  // still held (release_in_flight_stage hands it back).
  __device__ void mainloop(int k_tiles) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = Accumulator{0};
    // wgmma reads its metadata registers until its group completes, so the next k-tile's must not land in the
    // registers of the group in flight: two buffers, alternated by unrolling the loop by two (a buffer is
    // reloaded only after wait_group<1> retired the group that read it). Renaming them is not left to ptxas: with
    // a branch in this loop (an experiment with two k-tiles per stage) it reused the registers of the group in
    // flight and the products came out wrong.
    // A tile's last stage holds the k-tiles left over (fewer than a stage's): it is consumed after the loop, with
    // the buffer that the group in flight does not read.
    constexpr int kPerStage = Shape::kKTiles;
    MetadataWords metadata_even, metadata_odd;
    const int stages = k_tiles / kPerStage, rest = k_tiles % kPerStage;
    int st = 0;
    for (; st + 2 <= stages; st += 2) {
      consume_stage<kPerStage>(metadata_even);
      consume_stage<kPerStage>(metadata_odd);
    }
    if (st < stages) {
      consume_stage<kPerStage>(metadata_even);
      if constexpr (kPerStage == 2)
        if (rest > 0) consume_stage<1>(metadata_odd);
    } else if constexpr (kPerStage == 2) {
      if (rest > 0) consume_stage<1>(metadata_even);
    }
    static_assert(kPerStage <= 2, "a stage's rest is at most one k-tile");
    ptx::wgmma_wait_group<0>();
    ptx::fence_registers(acc);
  }

  __device__ void release_in_flight_stage() {
    if (in_flight_stage < 0) return;
    pipeline.release(in_flight_stage);
  }

 private:
  // One stage of kCount k-tiles: wait for it, issue its group, and hand the previous stage back once that group is
  // done.
  template <int kCount>
  __device__ void consume_stage(MetadataWords& meta) {
    const int s = ring.stage;
    pipeline.wait_full(ring);
    // cp.async writes through the generic proxy: order them before this thread's wgmma reads.
    if constexpr (kSource == BSource::gather_rows) ptx::fence_proxy_async_shared();
    mma_stage<kCount>(stages_base + s * Shape::kStageBytes, meta);
    // Keep this k-tile's group in flight; the previous one is done, so its stage goes back to the producer.
    ptx::wgmma_wait_group<1>();
    release_in_flight_stage();
    in_flight_stage = s;
    ring.advance();
  }

  // A stage's first kCount k-tiles as one wgmma group: its metadata registers and its A and B descriptors, all
  // written before the group's first wgmma (ptxas serialises wgmma whose input registers are defined between them,
  // C7513), then two k32 steps per k-tile.
  template <int kCount>
  __device__ void mma_stage(uint32_t stage, MetadataWords& meta) {
    constexpr int kSteps = kCount * kKBlocksPerTile;
    uint64_t a_desc[kSteps], b_desc[kSteps];
#pragma unroll
    for (int j = 0; j < kCount; ++j) {
      const uint32_t a_values = stage + Shape::kAValuesOffset + j * kAValueBytes;
      const uint32_t a_meta = stage + Shape::kAMetaOffset + j * kAMetaBytes<Element>;
      const uint32_t b_tile = stage + (j * kBTiles + (kBTiles == 1 ? 0 : warpgroup)) * Shape::kBBytes;
#pragma unroll
      for (int kk = 0; kk < kKBlocksPerTile; ++kk) {
        const int step = j * kKBlocksPerTile + kk, fragment = slab_in_tile * kTileKBlocks + kk;
        meta[step] = ptx::ld_shared_b32(a_meta + staged_meta_word<Element>(fragment, lane) * 4);
        a_desc[step] = ptx::make_smem_desc_k_major_interleave(
            a_values + kk * kKBlockValueBytes + warpgroup * kAWarpgroupBytes, kACoreKStride, kACoreRowStride);
        if constexpr (Traits::kMnMajor)  // k32 step kk starts 32 rows of 128 B further
          b_desc[step] = ptx::make_smem_desc_mn_major_sw128(b_tile + kk * kFragmentK * 128, kMnAtomBytes, kKGroupBytes);
        else  // k32 step kk starts 64 bytes into each swizzled row
          b_desc[step] = ptx::advance_smem_desc(ptx::make_smem_desc_k_major_sw128(b_tile), kk * kKStepBytes);
      }
    }
    ptx::wgmma_fence();
#pragma unroll
    for (int step = 0; step < kSteps; ++step)
      Wgmma::template mma<Traits::kMnMajor ? 1 : 0>(acc, a_desc[step], b_desc[step], meta[step], 1);
    ptx::wgmma_commit_group();
  }
};

// The register epilogue: each warpgroup stages its final 16-bit outputs 64 columns at a time (stmatrix, as
// 128-byte swizzled TMA boxes) into its two part buffers in turn, and one of its threads has the copy engine store
// them: the consumers wait only until the engine has read the part before last, never for D's writes, and go on to
// the next tile.
template <class Out, class Shape, int kBlockN, int kBTiles, int kAccumulators>
__device__ __forceinline__ void store_from_registers(const Params& p, const CUtensorMap* d_map,
                                                     const float (&acc)[kAccumulators], unsigned char* outputs,
                                                     int64_t m0, int64_t n0, int warpgroup, int thread_in_group) {
  uint32_t pairs[kAccumulators / 2];
  sm90_epilogue::pack_outputs<Out>(p, acc, m0, warpgroup * kRowsPerConsumer, thread_in_group, pairs);
  constexpr int kPart = Shape::kPartColumns, kPartPairs = kPart / 4;  // a thread's pairs per part
  constexpr int kParts = kBlockN / kPart, kBuffers = Shape::kPartBuffers;
  static_assert(kBuffers == 1 || kBuffers == 2, "the waits below count one store in flight at most");
  const uint32_t buffers = ptx::smem_address(outputs) + warpgroup * kBuffers * Shape::kOutputPartBytes;
#pragma unroll
  for (int c = 0; c < kParts; ++c) {
    // Part c's buffer was last filled kBuffers parts ago, so all but the latest kBuffers - 1 stores must have been
    // read; except at a tile's first part when the parts per tile are not a multiple of the buffers (the previous
    // tile's last part then used this same buffer).
    if (thread_in_group == 0) {
      if (kBuffers == 1 || (c == 0 && kParts % kBuffers != 0))
        ptx::bulk_wait_group_read<0>();
      else
        ptx::bulk_wait_group_read<1>();
    }
    const sm90_epilogue::OutputTile<kRowsPerConsumer, kPart> part{buffers + (c % kBuffers) * Shape::kOutputPartBytes};
    cuda::warpgroup_barrier_sync(warpgroup);  // the buffer was read: it is free
    const uint32_t(&part_pairs)[kPartPairs] = *reinterpret_cast<const uint32_t(*)[kPartPairs]>(pairs + kPartPairs * c);
    sm90_epilogue::store_outputs(p.d_col_major, part, part_pairs, 0, thread_in_group);
    cuda::warpgroup_barrier_sync(warpgroup);  // staged (and fenced for the copy engine)
    if (thread_in_group == 0)
      sm90_epilogue::issue_staged_store(d_map, part, p.d_col_major, m0 + warpgroup * kRowsPerConsumer, n0 + kPart * c);
  }
}

// The staged epilogue (one tile per CTA): alpha * acc + bias into the reused stages, then coalesced stores
// (write_tile). Every consumer's wgmma is done (and, when gathering, every producer copy): the stages are free.
template <class Out, int kBlockN, bool kGather, int kAccumulators>
__device__ __forceinline__ void store_through_stages(const Params& p, const float (&acc)[kAccumulators],
                                                     unsigned char* stages, int64_t m0, int64_t n0, int tid) {
  if constexpr (kGather)
    cuda::named_barrier_sync<cuda::NamedBarrier::stages_drained, kThreads>();
  else
    sm90_epilogue::consumer_sync();
  const sm90_epilogue::EpilogueTile<kBlockM, kBlockN> staged{p.d_col_major, reinterpret_cast<float*>(stages)};
  sm90_epilogue::stage_accumulators(p, staged, acc, p.bias, m0, tid / kWarpgroupThreads * kRowsPerConsumer, 0,
                                    tid % kWarpgroupThreads);
  sm90_epilogue::consumer_sync();
  sm90_epilogue::write_tile<Out>(p, staged, m0, n0, tid, sm90_epilogue::kEpilogueThreads, sm90_epilogue::LocalStaged{});
}

template <class Element, class Out, int kBlockN, BSource kSource, int kBTiles, bool kSplitK>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_sparse_kernel(const Params p, const __grid_constant__ CUtensorMap b_map,
                       const __grid_constant__ CUtensorMap d_map, const CodeScales scales) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = StageShape<Element, kBlockN, kSource, kBTiles, kSplitK>;
  using Traits = BSourceTraits<kSource>;
  static_assert(kBTiles == 1 || (kBTiles == kConsumers && Traits::kGather), "one B tile per consumer, or one for both");
  static_assert(!Traits::kMnMajor || kBlockN % kMnAtomHalves == 0, "MN-major tiles are whole atoms");
  static_assert(Shape::kBarrierBytes == cuda::StagePipeline<Shape::kStages>::kBarrierBytes, "the barriers fit");
  // Split-K's producer also tracks its k-range, beyond 40 registers; its narrow tiles leave the consumers spare ones.
  constexpr int kProducerRegisters = kSplitK ? 88 : Traits::kProducerRegisters;
  constexpr int kConsumerRegisters = kSplitK ? 208 : Traits::kConsumerRegisters;
  static_assert(
      kProducerRegisters + kConsumers * kConsumerRegisters <= (kConsumers + 1) * cuda::launch_registers(kThreads),
      "setmaxnreg budgets must fit the registers allocated at launch");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  if constexpr (Shape::kAlignSlack == 0)
    if (ptx::smem_address(smem_raw) % kSwizzleAlign != 0) __trap();  // the stages' swizzle needs the alignment
  const SharedStorage<Shape> smem(smem_raw);
  const cuda::StagePipeline<Shape::kStages> pipeline(smem.barriers);

  const int tid = threadIdx.x, warpgroup = tid / kWarpgroupThreads;
  const TileOrder<kBlockN> order(p);
  const int k_tiles = static_cast<int>(p.kblocks / kKBlocksPerTile);  // < 2^31 (launch checks); 32-bit loop counters
  // The register epilogue leaves the stages to the producer; otherwise the CTA's one tile is staged in them.
  const bool register_epilogue = Shape::kRegisterEpilogue && sizeof(Out) == 2 && p.register_epilogue;
  const CtaWork<kSplitK> work(k_tiles);

  if (tid == 0) {
    if constexpr (!Traits::kGather) ptx::prefetch_tensor_map(&b_map);
    pipeline.init(Traits::kFullArrivals, kConsumers * kWarpgroupThreads);
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == kConsumers) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    Producer<Element, kBlockN, kSource, kBTiles, kSplitK>{p,       &b_map, pipeline, smem, tid % kWarpgroupThreads,
                                                          k_tiles, work}
        .run(order, register_epilogue);
    if constexpr (kSplitK) {  // the consumers' two cluster barriers in write_cluster_sum, met by whole warps
      __syncwarp();
      ptx::cluster_sync();
      ptx::cluster_sync_relaxed();
    }
    return;
  }

  ptx::setmaxnreg_inc<kConsumerRegisters>();
  using TileConsumer = Consumer<Element, kBlockN, kSource, kBTiles, kSplitK>;
  TileConsumer consumer(pipeline, smem, tid);
  // A tile's fp32 outputs to D: from registers, through the cluster's sum (split-K) or through the stages.
  const auto store_tile = [&](const float(&acc)[TileConsumer::kAccumulators], int64_t m0, int64_t n0) {
    if (register_epilogue) {
      // The last stage goes back before the stores: the producer fills the ring with the next tile meanwhile.
      consumer.release_in_flight_stage();
      consumer.in_flight_stage = -1;
      if constexpr (Shape::kRegisterEpilogue && sizeof(Out) == 2)
        store_from_registers<Out, Shape, kBlockN, kBTiles>(p, &d_map, acc, smem.outputs, m0, n0, warpgroup,
                                                           tid % kWarpgroupThreads);
      return;
    }
    if constexpr (kSplitK) {  // the cluster's partial tiles summed through distributed shared memory
      static_assert(kSplitKTakes<kBlockN, kSource>, "split-K is instantiated for narrow TMA and row-gather tiles only");
      // The partial tile overwrites the stages: a gathering producer posts when its last copies have landed.
      if constexpr (Traits::kGather) cuda::named_barrier_sync<cuda::NamedBarrier::stages_drained, kThreads>();
      sm90_epilogue::write_cluster_sum<Out, kBlockN>(p, reinterpret_cast<float*>(smem.stages), acc,
                                                     sm90_epilogue::BlockRows{{m0, m0 + kRowsPerConsumer}}, n0, tid);
      return;
    }
    store_through_stages<Out, kBlockN, Traits::kGather>(p, acc, smem.stages, m0, n0, tid);
  };
  for (int64_t tile = work.first_tile; tile < order.tiles; tile += work.tile_stride) {
    const auto [m0, n0] = order.origin(p, tile);
    consumer.mainloop(work.k_end - work.k_begin);
    if constexpr (kEightBit<Element>) {
      float scaled[TileConsumer::kAccumulators];
      scale_dot_products(consumer.acc, scaled, scales, p, m0 + warpgroup * kRowsPerConsumer, n0,
                         tid % kWarpgroupThreads);
      store_tile(scaled, m0, n0);
    } else {
      store_tile(consumer.acc, m0, n0);
    }
  }
  // The consumers' work is done: the next kernel in the stream may be scheduled (where it was launched overlapping
  // this one), its CTAs taking the SMs that this grid's CTAs free. Said here rather than after the producer's loop,
  // where ptxas moved the producer's address arithmetic off the uniform datapath (decode 5 % slower), or at the
  // start, where the next kernels' waiting CTAs took SMs the grid before them still needed (chains 15 % slower).
  ptx::launch_dependents();
  // D's last parts written (and their buffers read) before the CTA's shared memory goes.
  if (register_epilogue && tid % kWarpgroupThreads == 0) ptx::bulk_wait_group<0>();
#endif
}

// B (col-major K x C, column stride ldb) as a 2-D tensor {K, C}, boxes of one k-tile x box_rows, 128-byte swizzle.
// Out-of-range elements (K and C tails) are filled with zeros by the copy engine.
template <class Element>
CUtensorMap make_b_map(const Params& p, int box_rows) {
  return cuda::make_tensor_map_sw128<Element, 2>(p.b, {static_cast<cuuint64_t>(p.cols), static_cast<cuuint64_t>(p.n)},
                                                 {static_cast<cuuint64_t>(p.ldb) * sizeof(Element)},
                                                 {kTileK<Element>, static_cast<cuuint32_t>(box_rows)});
}

// B row-major (K x C, row stride ldb) as a 2-D tensor {C, K}, boxes of 64 columns x kBlockK rows (one MN-major
// atom), 128-byte swizzle; C and K tails are filled with zeros. The row stride must be a multiple of 16 bytes.
template <class Element>
CUtensorMap make_b_rows_map(const Params& p) {
  return cuda::make_tensor_map_sw128<Element, 2>(p.b, {static_cast<cuuint64_t>(p.n), static_cast<cuuint64_t>(p.cols)},
                                                 {static_cast<cuuint64_t>(p.ldb) * sizeof(Element)},
                                                 {kMnAtomHalves, kBlockK});
}

template <class Element, class Out, int kBlockN, BSource kSource, int kBTiles, bool kSplitK = false>
void launch(const Params& p, const LaunchOn& on, const CodeScales& scales = {}) {
  static_assert(!kEightBit<Element> || kSource == BSource::tma, "8-bit B is K-major: staged by TMA");
  require(!kEightBit<Element> || (scales.rows != nullptr && scales.tokens != nullptr), ErrorCode::invalid_argument,
          "sm90 sparse kernel: 8-bit operands need their row and token scales");
  constexpr int kSmem = StageShape<Element, kBlockN, kSource, kBTiles, kSplitK>::kSmemBytes;
  auto kernel = sm90_sparse_kernel<Element, Out, kBlockN, kSource, kBTiles, kSplitK>;
  // Once per instantiation and process (thread-safe static), not on every run().
  static const bool smem_set = [&] {
    NMKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)smem_set;
  // D for the register epilogue's TMA stores (contiguous dimension first, boxes of one warpgroup's part: 64 x 64,
  // R and C tails clipped); unused otherwise.
  require(!p.register_epilogue || (sizeof(Out) == 2 && Sm90Shape<kBlockN, kBTiles>::kRegisterEpilogue),
          ErrorCode::invalid_argument,
          "sm90 sparse kernel: the register epilogue needs a 16-bit D and an n-tile of whole 64-column parts");
  CUtensorMap d_map{};
  if constexpr (sizeof(Out) == 2 && Sm90Shape<kBlockN, kBTiles>::kRegisterEpilogue) {
    if (p.register_epilogue) {
      const auto rows = static_cast<cuuint64_t>(p.rows), n = static_cast<cuuint64_t>(p.n);
      constexpr cuuint32_t kPart = Sm90Shape<kBlockN, kBTiles>::kPartColumns, kRows = kRowsPerConsumer;
      d_map = p.d_col_major ? cuda::make_tensor_map_sw128<Out, 2>(p.d, {rows, n}, {rows * 2}, {kRows, kPart})
                            : cuda::make_tensor_map_sw128<Out, 2>(p.d, {n, rows}, {n * 2}, {kPart, kRows});
    }
  }
  CUtensorMap map{};  // gathered sources read B with plain loads
  if constexpr (kSource == BSource::tma) map = make_b_map<Element>(p, kBlockN);
  if constexpr (kSource == BSource::tma_rows) map = make_b_rows_map<Element>(p);
  const int64_t tiles = ceil_div(p.rows, kBlockM) * ceil_div(p.n, kBlockN);
  require(tiles < (int64_t{1} << 31), ErrorCode::unsupported, "sm90 sparse kernel: more than 2^31 tiles");
  require(p.kblocks / kKBlocksPerTile < (int64_t{1} << 31), ErrorCode::unsupported,
          "sm90 sparse kernel: more than 2^31 k-tiles");
  // A persistent launch keeps one CTA per SM (the pipeline takes the SM's shared memory); its tiles must end in
  // the register epilogue, which leaves the stages to the producer.
  require(p.persistent_ctas == 0 || p.register_epilogue, ErrorCode::invalid_argument,
          "sm90 sparse kernel: a persistent launch needs the register epilogue");
  require(kSplitK == (on.split > 1) &&
              (!kSplitK || (on.split <= kMaxClusterCtas && on.split <= p.kblocks / kKBlocksPerTile &&
                            p.persistent_ctas == 0 && !p.register_epilogue)),
          ErrorCode::invalid_argument,
          "sm90 sparse kernel: split-K takes 2..8 CTAs, at most one per k-tile, one tile each, the staged epilogue and "
          "block_n <= 64");
  const int64_t grid = p.persistent_ctas > 0 ? std::min<int64_t>(tiles, p.persistent_ctas) : tiles * on.split;
  require(grid < (int64_t{1} << 31), ErrorCode::unsupported, "sm90 sparse kernel: more than 2^31 CTAs");
  const cuda::OverlappableLaunch launch_config(dim3(static_cast<unsigned>(grid)), dim3(kThreads), kSmem, on.stream,
                                               on.overlap, on.split);
  NMKIT_CUDA_CHECK(cudaLaunchKernelEx(launch_config.config(), kernel, p, map, d_map, scales));
}

template <int kBlockN, BSource kSource, int kBTiles = 1, bool kSplitK = false, class Element = __half>
TileShape shape_of() {
  using Shape = StageShape<Element, kBlockN, kSource, kBTiles, kSplitK>;
  return {kBlockM,        kBlockN,  kTileK<Element> * Shape::kKTiles,
          Shape::kStages, kThreads, Shape::kSmemBytes};  // K per stage
}

// The tile shape of the kernel with B by TMA (col-major) and n-tile block_n, of 16-bit (Element __half) or 8-bit
// operands; split_k: its split-K instantiation.
template <class Element>
TileShape tma_tile_shape(int block_n, bool split_k, const char* who) {
  constexpr BSource kTma = BSource::tma;
  switch (block_n) {
    case 256:
      return shape_of<256, kTma, 1, false, Element>();
    case 192:
      return shape_of<192, kTma, 1, false, Element>();
    case 128:
      return shape_of<128, kTma, 1, false, Element>();
    case 64:
      return split_k ? shape_of<64, kTma, 1, true, Element>() : shape_of<64, kTma, 1, false, Element>();
    case 32:
      return split_k ? shape_of<32, kTma, 1, true, Element>() : shape_of<32, kTma, 1, false, Element>();
    case 16:
      return split_k ? shape_of<16, kTma, 1, true, Element>() : shape_of<16, kTma, 1, false, Element>();
  }
  throw Error(ErrorCode::invalid_argument, std::string(who) + ": no kernel with block_n " + std::to_string(block_n));
}

}  // namespace
}  // namespace nmkit::gpu::nm24::sm90
