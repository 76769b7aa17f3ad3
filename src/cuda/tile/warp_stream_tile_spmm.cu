// The warp-stream tile-sparse SpMM, for few tokens and tiles 32 rows high: every warp streams its own share of the
// stored tiles through a small ring of its own in shared memory and runs mma.sync on them. It needs 166 KiB of
// shared memory per CTA: H100 and H200 (sm_90) give it, A100 (163 KiB) does not (warp_stream_fits_device).
//
// Why not the stream kernel's CTA-wide ring (stream_tile_spmm.cu): a 32x32 tile is 2 KiB, and per tile that ring
// pays a wait, a CTA barrier and its threads' copy addresses; with these tiles it streamed ~1.7 TB/s at C = 32.
// Here each warp has a ring of its own in shared memory, and each lane copies
// (cp.async) and later reads exactly its own 16-byte pieces: no barrier, no ldmatrix, no copy arithmetic shared
// across lanes. The CTA's warps share nothing but their SM until the rows they share are summed.
//
// The k order. A sum over k may take k in any order as long as A and B take the same one. In mma.m16n8k16, lane
// (g, t) (g = lane / 4, t = lane % 4) holds in register pair r, half h of a k16 step the step's k index 8r + 2t + h;
// here that slot of k16 step s reads column 8t + 4s + 2r + h of a 32-column chunk. So a lane's A fragments for
// both k16 steps are columns 8t .. 8t + 7 of two rows (g and g + 8 of a 16-row block): one 16-byte copy each from
// the row-major packed tile. Its B fragments for 8 tokens are the same columns of token g's row of x[T][K] (B
// col-major): one 16-byte copy.
//
// The work: the stored tiles' 32-column chunks in tile-row order (pack_tiles), cut into ranges, one per CTA and
// token block (the weight's WarpStreamSchedule: whole tile rows where that stays balanced; else equal ranges),
// each cut evenly again over the CTA's warps; a warp keeps kStages chunks in flight. A tile row whose chunks several
// warps hold is summed in two levels, both in a fixed order so that the result does not depend on which warp or CTA
// ends last: the warps' parts through shared memory by the CTA's last warp holding one, then, for a row that goes on in
// other CTAs' ranges, the CTAs' parts through the workspace (fp32) by the CTA that brings the last of them (an arrival
// counter per tile row, zeroed again for the next launch).
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <string>

#include "../common/check.cuh"
#include "../common/launch.cuh"
#include "../common/smem.cuh"
#include "../nm24/nm24_common.cuh"
#include "../ptx/cp_async.cuh"
#include "../ptx/fence.cuh"
#include "../ptx/global_load.cuh"
#include "../ptx/griddep.cuh"
#include "../ptx/mma.cuh"
#include "../ptx/shared.cuh"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "tile_common.cuh"

namespace nmkit::gpu::tile {
namespace {

constexpr int kRows = kWarpStreamTileRows;        // a warp's output rows: two m16 blocks
constexpr int kChunkCols = kWarpStreamChunkCols;  // a chunk's columns: two k16 steps
constexpr int kBlockN = kStreamBlockN;            // a warp's tokens: four n8 groups
constexpr int kMBlocks = kRows / 16, kN8 = kBlockN / 8;
constexpr int kFragments = kMBlocks * kN8;  // m16n8 accumulator tiles per warp
constexpr int kWarps = kWarpStreamWarps, kThreads = kWarps * 32;
constexpr int kSlotFloat4s = kRows * kBlockN / 4;  // one partial tile row: kFragments float4 per lane
// Chunks in flight per warp, each in a stage of the warp's ring in shared memory (A and B: 4 KiB). A wait per chunk
// leaves the later stages' copies in flight (cp.async groups complete in order), where loads into registers all
// shared one scoreboard, so that each ring of them was waited for whole. Three
// stages ran as fast as four at density 0.5 and faster below it (more L1 beside 166 KiB of shared memory).
constexpr int kStages = 3;
constexpr int kMinCtasPerSm = 1;
static_assert(WarpStreamLead::kWarpsPerCta == kWarps && WarpStreamLead::kChunks == kStages,
              "the schedule's warp records are made for this kernel's warps and ring");
// A warp's tile-row slots in shared memory: its range's first and last parts (summed with other warps' parts); a
// row that ends inside the range passes through the last part's slot to D (the range's last part comes after it).
constexpr int kFirstPartSlot = 0, kLastPartSlot = 1, kWarpSlots = 2;
// A stage: per lane 4 x 16 bytes of A (rows g, g + 8, g + 16, g + 24) then 4 x 16 bytes of B (tokens 8 j + g),
// item-major (item i of lane l at i x 32 + l: conflict-free 16-byte accesses), and the chunk's {tile row, column}.
constexpr int kStageItems = 2 * kMBlocks + kN8, kStageBytes = kStageItems * 32 * 16;
// Shared memory, in float4: the warps' part slots, then their rings, then each stage's {tile row, column} per lane,
// then each warp's WarpRows.
constexpr int kPartSlotFloat4s = kWarps * kWarpSlots * kSlotFloat4s;
constexpr int kRingFloat4s = kStages * kStageBytes / 16;  // one warp's
constexpr int kStageMetaFloat4s = kWarps * kStages * 32 * static_cast<int>(sizeof(int2)) / 16;
constexpr int kWarpRowsFloat4s = kWarps;
constexpr int kSmemBytes = (kPartSlotFloat4s + kWarps * kRingFloat4s + kStageMetaFloat4s + kWarpRowsFloat4s) * 16;

// The tile rows at a warp's range ends, published in shared memory for the CTA's summing warps, so that they learn
// which warps hold parts of a row without asking global memory for the row's extent at the end of the kernel.
struct WarpRows {
  int32_t first, last;    // the rows of the range's first and last chunks (-1: no range)
  int32_t before, after;  // the rows of the chunks just before and after the range (-1: none)
};
static_assert(sizeof(WarpRows) == 16);
using Accumulators = float[kMBlocks][kN8][4];

// One lane's operands of a 32-row, 32-column chunk and kBlockN tokens (the k order above).
struct ChunkOperands {
  uint4 a[kMBlocks][2];  // rows 16 mi + g and 16 mi + g + 8
  uint4 b[kN8];          // token 8 j + g
};

// Columns k .. k + 7 of token `token`'s row of B, element by element (zero past K): B row-major, or col-major
// without 16-byte rows. Out of line, so that the fast path's registers do not pay for it; its arguments are values,
// since a reference to the kernel's parameters would make the compiler copy them to local memory.
__device__ __noinline__ uint4 load_b_elements(const uint16_t* b, int64_t token, int64_t k, int64_t cols, int64_t n,
                                              bool col_major) {
  const auto element = [&](int64_t kk) -> uint32_t {
    if (kk >= cols) return 0;
    return __ldg(b + (col_major ? token * cols + kk : kk * n + token));
  };
  return make_uint4(element(k) | element(k + 1) << 16, element(k + 2) | element(k + 3) << 16,
                    element(k + 4) | element(k + 5) << 16, element(k + 6) | element(k + 7) << 16);
}

// Where a lane's operands of a chunk come from, worked out once per warp: its columns 8t .. 8t + 7 of rows g,
// g + 8, g + 16 and g + 24 of a tile, and of tokens n0 + 8 j + g of B. Chunk indices and columns are 32-bit (the
// launch checks that they fit), addresses 64-bit; a chunk's addresses are a base plus fixed strides, so that the
// compiler keeps a handful of registers for them rather than recomputing per-token addresses in the loop.
struct LaneSources {
  const uint16_t* a;                // the tiles, at row g and column 8t
  int64_t a_rows8, tile_elems;      // 8 rows and a whole tile, in elements
  int chunk_shift;                  // chunks per tile: 1 << chunk_shift
  int32_t tile_cols, k_lane, cols;  // 8t; K
  const uint16_t* b;                // B
  int64_t token0, n, b_tokens8;     // token n0 + g; C; 8 tokens of B col-major, in elements
  uint32_t tokens_inside;           // bit j: token n0 + 8 j + g < C
  bool b_col_major;

  __device__ LaneSources(const TileParams& p, int64_t n0, int lane, int chunk_shift)
      : a(p.tiles + (lane / 4) * p.tile_cols + 8 * (lane % 4)),
        a_rows8(int64_t{8} * p.tile_cols),
        tile_elems(int64_t{kRows} * p.tile_cols),
        chunk_shift(chunk_shift),
        tile_cols(p.tile_cols),
        k_lane(8 * (lane % 4)),
        cols(static_cast<int32_t>(p.cols)),
        b(static_cast<const uint16_t*>(p.b)),
        token0(n0 + lane / 4),
        n(p.n),
        b_tokens8(8 * p.cols),
        tokens_inside(0),
        b_col_major(p.b_col_major) {
#pragma unroll
    for (int j = 0; j < kN8; ++j) tokens_inside |= (token0 + 8 * j < n ? 1u : 0u) << j;
  }
  __device__ int32_t chunk_in_tile(int32_t chunk) const { return chunk & ((1 << chunk_shift) - 1); }

  // Posts chunk `chunk`'s A into the lane's items 0..3 of a ring stage (`stage`: 32-bit shared address of the
  // stage's first item of lane 0).
  __device__ void post_a(uint32_t stage, int lane, int32_t chunk) const {
    const uint16_t* from = a + int64_t{chunk >> chunk_shift} * tile_elems + chunk_in_tile(chunk) * kChunkCols;
#pragma unroll
    for (int i = 0; i < 2 * kMBlocks; ++i) ptx::cp_async_16(stage + (i * 32 + lane) * 16, from + i * a_rows8, 16);
  }
  // B col-major with 16-byte rows: posts the chunk's B into items 4..7 (zero past K and C).
  __device__ void post_b(uint32_t stage, int lane, int32_t chunk, int32_t column) const {
    const int32_t k = column * tile_cols + chunk_in_tile(chunk) * kChunkCols + k_lane;
    const uint16_t* from = b + token0 * cols + k;
#pragma unroll
    for (int j = 0; j < kN8; ++j) {
      const bool inside = k < cols && (tokens_inside >> j & 1);
      ptx::cp_async_16(stage + ((2 * kMBlocks + j) * 32 + lane) * 16, inside ? from + j * b_tokens8 : b,
                       inside ? 16 : 0);
    }
  }
  // Any other B: the chunk's B element by element, straight into registers (zero past K and C).
  __device__ void load_b_elementwise(ChunkOperands& c, int32_t chunk, int32_t column) const {
    const int32_t k = column * tile_cols + chunk_in_tile(chunk) * kChunkCols + k_lane;
#pragma unroll
    for (int j = 0; j < kN8; ++j)
      c.b[j] =
          tokens_inside >> j & 1 ? load_b_elements(b, token0 + 8 * j, k, cols, n, b_col_major) : make_uint4(0, 0, 0, 0);
  }
};

// The lane's A (and, with vector_b, B) of the chunk in a ring stage.
__device__ __forceinline__ void read_stage(uint32_t stage, int lane, bool vector_b, ChunkOperands& c) {
#pragma unroll
  for (int mi = 0; mi < kMBlocks; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) c.a[mi][h] = ptx::ld_shared_v4_b32(stage + ((2 * mi + h) * 32 + lane) * 16);
  if (vector_b)
#pragma unroll
    for (int j = 0; j < kN8; ++j) c.b[j] = ptx::ld_shared_v4_b32(stage + ((2 * kMBlocks + j) * 32 + lane) * 16);
}

template <class Element>
__device__ __forceinline__ void multiply_chunk(const ChunkOperands& c, Accumulators& acc) {
  using Mma = typename nm24::ElementTraits<Element>::Mma;
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int mi = 0; mi < kMBlocks; ++mi) {
      const uint4 &top = c.a[mi][0], &bottom = c.a[mi][1];
      const uint32_t a[4] = {s ? top.z : top.x, s ? bottom.z : bottom.x, s ? top.w : top.y, s ? bottom.w : bottom.y};
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
        const uint32_t b[2] = {s ? c.b[j].z : c.b[j].x, s ? c.b[j].w : c.b[j].y};
        ptx::mma_m16n8k16<Mma>(acc[mi][j], a, b);
      }
    }
}

__device__ __forceinline__ void clear(Accumulators& acc) {
#pragma unroll
  for (int mi = 0; mi < kMBlocks; ++mi)
#pragma unroll
    for (int j = 0; j < kN8; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.0f;
}

// A partial tile row of kRows x kBlockN fp32 sums: kFragments float4 per lane, lane-minor (conflict-free in
// shared memory, coalesced in global).
__device__ __forceinline__ void put_part(float4* slot, int lane, const Accumulators& acc) {
#pragma unroll
  for (int f = 0; f < kFragments; ++f) {
    const float* v = acc[f / kN8][f % kN8];
    slot[f * 32 + lane] = make_float4(v[0], v[1], v[2], v[3]);
  }
}

template <bool kFromGlobal>
__device__ __forceinline__ void add_part(const float4* slot, int lane, Accumulators& sum) {
#pragma unroll
  for (int f = 0; f < kFragments; ++f) {
    const float4 v = kFromGlobal ? __ldcg(slot + f * 32 + lane) : slot[f * 32 + lane];
    float* s = sum[f / kN8][f % kN8];
    s[0] += v.x, s[1] += v.y, s[2] += v.z, s[3] += v.w;
  }
}

// Whether D's tile row at (m0, n0) takes store_slot_vectors: 16-bit D, the whole tile inside D, D's rows (row-major)
// or columns (col-major) starting on 16 bytes.
template <class Out>
__device__ __forceinline__ bool stores_vectors(const TileParams& p, int64_t m0, int64_t n0) {
  if constexpr (sizeof(Out) != 2) return false;
  constexpr int kPerVector = 16 / sizeof(Out);
  return (p.d_col_major ? p.rows : p.n) % kPerVector == 0 && reinterpret_cast<uintptr_t>(p.d) % 16 == 0 &&
         m0 + kRows <= p.rows && n0 + kBlockN <= p.n;
}

// The plain epilogue of D's tile row at (m0, n0) from a part slot, 8 outputs along D's contiguous direction per
// 16-byte store (stores_vectors). put_part left output (row, token) at float (f * 32 + l) * 4 + c of the slot, with
// f = (row / 16) * kN8 + token / 8, l = (row % 8) * 4 + (token % 8) / 2 and c = (row % 16) / 8 * 2 + token % 2.
// A lane gathers its vectors from the slot (a few conflicts) rather than storing its accumulators' scattered 2-byte
// outputs: a quarter of the store instructions, and every one writes whole 32-byte sectors.
template <class Out>
__device__ __forceinline__ void store_slot_vectors(const TileParams& p, int64_t m0, int64_t n0, int lane,
                                                   const float* slot) {
  constexpr int kRowVectors = kRows / 8, kTokenVectors = kBlockN / 8, kVectorsPerLane = kRows * kBlockN / 8 / 32;
  Out* const d = static_cast<Out*>(p.d);
  __syncwarp();  // every lane's put_part has landed: the vectors gather other lanes' outputs
#pragma unroll
  for (int i = 0; i < kVectorsPerLane; ++i) {
    const int v = i * 32 + lane;
    uint32_t pairs[4];
    int64_t index;
    if (p.d_col_major) {  // rows 8 r .. 8 r + 7 of one token: floats 16 apart (l steps by 4 rows' worth)
      const int token = v / kRowVectors, r = v % kRowVectors;
      const float* from = slot + (((r / 2) * kN8 + token / 8) * 32 + (token % 8) / 2) * 4 + (r % 2) * 2 + token % 2;
#pragma unroll
      for (int q = 0; q < 4; ++q) pairs[q] = nm24::pack_pair<Out>(p.alpha * from[32 * q], p.alpha * from[32 * q + 16]);
      index = (n0 + token) * p.rows + m0 + 8 * r;
    } else {  // tokens 8 j .. 8 j + 7 of one row: float pairs 4 apart
      const int row = v / kTokenVectors, j = v % kTokenVectors;
      const float* from = slot + (((row / 16) * kN8 + j) * 32 + (row % 8) * 4) * 4 + (row % 16) / 8 * 2;
#pragma unroll
      for (int q = 0; q < 4; ++q) pairs[q] = nm24::pack_pair<Out>(p.alpha * from[4 * q], p.alpha * from[4 * q + 1]);
      index = (m0 + row) * p.n + n0 + 8 * j;
    }
    *reinterpret_cast<uint4*>(d + index) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  }
  __syncwarp();  // every lane has read the slot before any lane writes it again
}

// D's tile row at (m0, n0) from a slot in shared memory. The general epilogue (bias, beta C, activations) runs one
// fragment at a time, so that its code is there once per call site.
template <class Out>
__device__ __forceinline__ void store_slot(const TileParams& p, int64_t m0, int64_t n0, int lane, const float4* slot) {
  if (nm24::epilogue_is_plain(p)) {
    if (stores_vectors<Out>(p, m0, n0)) {
      if constexpr (sizeof(Out) == 2) store_slot_vectors<Out>(p, m0, n0, lane, reinterpret_cast<const float*>(slot));
      return;
    }
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
      const float4 v = slot[f * 32 + lane];
      const float acc[4] = {v.x, v.y, v.z, v.w};
      nm24::plain_store_m16n8<Out>(p, m0 + 16 * (f / kN8), n0 + 8 * (f % kN8), lane, acc);
    }
    return;
  }
#pragma unroll 1
  for (int f = 0; f < kFragments; ++f) {
    const float4 v = slot[f * 32 + lane];
    const float acc[4] = {v.x, v.y, v.z, v.w};
    nm24::epilogue_store_m16n8<Out>(p, m0 + 16 * (f / kN8), n0 + 8 * (f % kN8), lane, acc);
  }
}

template <class Element, class Out>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    warp_stream_tile_spmm_kernel(const __grid_constant__ TileParams p, const StreamWork w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) float4 warp_slots[];  // kSmemBytes: the part slots first
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = int64_t{blockIdx.y} * kBlockN, grid_rows = (p.rows + kRows - 1) / kRows;
  const int chunk_shift = __ffs(p.tile_cols / kChunkCols) - 1;  // chunks per tile: 1, 2 or 4
  const int64_t chunks = p.nnz_tiles << chunk_shift;
  // This warp's chunks (32-bit: the launch checks that every chunk index fits), the rows at its range's ends, and
  // the CTAs holding them. With the weight's schedule, all of it and its first chunks' columns are one record
  // (WarpStreamLead), a single load. Otherwise the CTA's range is an even cut (launch: gridDim.x <= chunks, so none
  // is empty), cut evenly over its warps (the last ones idle when the range has fewer than kWarps chunks), and the
  // rows are loaded below.
  const bool led = w.leads != nullptr;
  WarpStreamLead lead;
  const EvenSplit cta_ranges{chunks, gridDim.x};
  int32_t begin, end;
  bool ends_cta;
  WarpRows rows{-1, -1, -1, -1};
  int2 first_row_ctas{-1, -1}, last_row_ctas{-1, -1};
  if (led) {
    const int4* from = reinterpret_cast<const int4*>(w.leads + int64_t{blockIdx.x} * kWarps + warp);
    int4 words[sizeof(WarpStreamLead) / sizeof(int4)];
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(WarpStreamLead) / sizeof(int4)); ++i) words[i] = __ldg(from + i);
    memcpy(&lead, words, sizeof lead);
    begin = lead.begin, end = lead.end, ends_cta = lead.ends_cta;
    rows = {lead.row[0], lead.last_row, lead.before_row, lead.after_row};
    first_row_ctas = make_int2(lead.first_row_ctas[0], lead.first_row_ctas[1]);
    last_row_ctas = make_int2(lead.last_row_ctas[0], lead.last_row_ctas[1]);
  } else {
    const int64_t cta_begin = chunks ? cta_ranges.begin(blockIdx.x) : 0,
                  cta_end = chunks ? cta_ranges.begin(blockIdx.x + 1) : 0;
    const EvenSplit warp_ranges{cta_end - cta_begin,
                                std::min<int64_t>(kWarps, std::max<int64_t>(cta_end - cta_begin, 1))};
    const bool working = warp < warp_ranges.parts && cta_begin < cta_end;
    begin = static_cast<int32_t>(working ? cta_begin + warp_ranges.begin(warp) : cta_end);
    end = static_cast<int32_t>(working ? cta_begin + warp_ranges.begin(warp + 1) : cta_end);
    ends_cta = end == cta_end;
  }
  const auto slot = [&](int owner, int which) { return warp_slots + (owner * kWarpSlots + which) * kSlotFloat4s; };
  const LaneSources sources(p, n0, lane, chunk_shift);

  const uint32_t ring = ptx::smem_address(warp_slots + kPartSlotFloat4s) + warp * kRingFloat4s * 16;  // this warp's
  const auto stage_at = [&](int s) { return ring + s * kStageBytes; };
  // The lane's {tile row, column} of the chunk in stage s: stage_meta[32 s].
  int2* const stage_meta =
      reinterpret_cast<int2*>(warp_slots + kPartSlotFloat4s + kWarps * kRingFloat4s) + warp * kStages * 32 + lane;

  // Every load of the prologue is asked for before the first chunks' A is posted: the loads' answers would
  // otherwise queue behind the whole GPU's burst of A copies, ~2 us later.
  // {column, row} of tiles window .. window + 31 (one per lane) and of the 32 after them; posting runs kStages chunks
  // ahead of the math, so the window follows the posts and each stage keeps its chunk's {row, column}.
  const auto load_meta = [&](int32_t tile) {
    return tile < p.nnz_tiles ? make_int2(__ldg(p.col_index + tile), __ldg(p.tile_row + tile)) : make_int2(0, -1);
  };
  int32_t window = begin >> chunk_shift;
  int2 meta = load_meta(window + lane), meta_next = load_meta(window + 32 + lane);
  // Without a schedule: the rows just outside the range (whether its first and last rows go on in other ranges)
  // and its last row.
  if (!led && begin < end) {
    if (begin > 0) rows.before = __ldg(p.tile_row + ((begin - 1) >> chunk_shift));
    if (end < chunks) rows.after = __ldg(p.tile_row + (end >> chunk_shift));
    rows.last = __ldg(p.tile_row + ((end - 1) >> chunk_shift));
  }
  // The first tile row without tiles that this warp may have to write (a load whose answer is needed last).
  const int64_t first_empty_candidate = int64_t{blockIdx.x} * kWarps + warp;
  int32_t candidate_ptr[2] = {0, 0};
  if (first_empty_candidate < grid_rows)
    candidate_ptr[0] = __ldg(p.row_ptr + first_empty_candidate),
    candidate_ptr[1] = __ldg(p.row_ptr + first_empty_candidate + 1);

    // The first kStages chunks' A (it needs no metadata); each chunk's B follows in the same cp.async group, so that
    // the group of chunk i is the i-th committed.
#pragma unroll
  for (int s = 0; s < kStages; ++s)
    if (begin + s < end) sources.post_a(stage_at(s), lane, begin + s);
  const auto tile_meta = [&](int32_t tile) {  // {column, row} of a tile at or past the window (moves it on)
    if (tile == window + 32) window += 32, meta = meta_next, meta_next = load_meta(window + 32 + lane);
    const int index = tile - window;
    return make_int2(__shfl_sync(~0u, meta.x, index), __shfl_sync(~0u, meta.y, index));
  };
  // Chunk `chunk`'s {row, column} into stage s, and (B col-major with 16-byte rows) its B.
  const bool vector_b = p.b_col_major && p.b_vector;
  const auto post_rest = [&](int s, int32_t chunk, int2 column_row) {
    stage_meta[32 * s] = make_int2(column_row.y, column_row.x);
    if (vector_b) sources.post_b(stage_at(s), lane, chunk, column_row.x);
  };
  // Launched overlapping the kernel before it (programmatic dependent launch), the CTA has read only the weight so
  // far; B, C, the workspace and D may belong to that kernel until it completes.
  ptx::grid_dependency_wait();
  // The first chunks' columns come with the schedule's record, so that their B is posted without waiting for the
  // window (which serves the chunks after them).
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (begin + s < end)
      post_rest(s, begin + s, led ? make_int2(lead.column[s], lead.row[s]) : tile_meta((begin + s) >> chunk_shift));
    ptx::cp_async_commit();  // one group per stage, empty past the range
  }

  if (!led && begin < end) rows.first = stage_meta[0].x;
  const int32_t before_row = rows.before, after_row = rows.after, first_row = rows.first, last_row = rows.last;

  // The main loop: one chunk per step, its stage refilled with the chunk kStages ahead. A tile row's part ends at
  // the chunk before the next row's: into the warp's first or last part slot if other warps hold parts of the row
  // too, else through the last part's slot to D.
  // One loop for both ways of reading B (a uniform branch per chunk): a second copy of the loop would double the
  // code that every SM fetches once per launch.
  const auto stream_chunks = [&]() {
    Accumulators acc = {};
    int s = 0;
    for (int32_t chunk = begin; chunk < end; ++chunk) {
      ptx::cp_async_wait<kStages - 1>();  // this chunk's group has landed
      ChunkOperands c;
      read_stage(stage_at(s), lane, vector_b, c);
      const int2 row_column = stage_meta[32 * s];
      if (!vector_b) sources.load_b_elementwise(c, chunk, row_column.y);
      const int next_s = s + 1 == kStages ? 0 : s + 1;
      const int32_t row = row_column.x, next_row = chunk + 1 < end ? stage_meta[32 * next_s].x : -1;
      multiply_chunk<Element>(c, acc);  // the stage is read (its registers are consumed) before it is refilled
      if (chunk + kStages < end) {
        sources.post_a(stage_at(s), lane, chunk + kStages);
        post_rest(s, chunk + kStages, tile_meta((chunk + kStages) >> chunk_shift));
      }
      ptx::cp_async_commit();
      s = next_s;
      if (next_row == row) continue;
      const bool shared = (row == first_row && before_row == row) || (row == last_row && after_row == row);
      float4* const part = slot(warp, shared && row == first_row ? kFirstPartSlot : kLastPartSlot);
      put_part(part, lane, acc);
      if (!shared) store_slot<Out>(p, int64_t{row} * kRows, n0, lane, part);
      clear(acc);
    }
    ptx::cp_async_wait<0>();
  };
  stream_chunks();
  ptx::launch_dependents();  // the next kernel's CTAs may load their weight while this one sums and stores
  WarpRows* const warp_rows =
      reinterpret_cast<WarpRows*>(warp_slots + kPartSlotFloat4s + kWarps * kRingFloat4s + kStageMetaFloat4s);
  if (lane == 0) warp_rows[warp] = rows;
  __syncthreads();  // every warp's parts and rows are in shared memory

  // A shared row is summed by the last of the CTA's warps that holds a part of it, in warp order; a row that goes
  // on in other CTAs' ranges is then summed over CTAs through the workspace in the same way (the CTA that brings
  // the last part adds them in CTA order), so the result does not depend on which warp or CTA ends last. This warp
  // holds the CTA's last part of its first row if that row ends inside its range, and of its last row if the CTA's
  // range ends with it or the next warp's range starts a new row: those are the rows it sums (0-2).
  bool sums_first_row = false, sums_last_row = false;
  if (begin < end) {
    const bool last_in_cta = ends_cta || after_row != last_row;
    if (first_row != last_row || before_row == first_row || after_row == first_row) {
      sums_first_row = before_row == first_row && (first_row != last_row || last_in_cta);
      sums_last_row =
          first_row != last_row ? after_row == last_row && last_in_cta : before_row != first_row && last_in_cta;
    }
  }
  // The CTA's warps' rows, warp i's in lane i: which warps hold parts of a row is a ballot away.
  const WarpRows lane_rows = warp_rows[lane % kWarps];
  float4* const scratch = warp_slots + kPartSlotFloat4s + warp * kRingFloat4s;  // this warp's ring, free now
#pragma unroll 1
  for (int i = 0; i < 2; ++i) {
    if (!(i == 0 ? sums_first_row : sums_last_row)) continue;
    const int32_t row = i == 0 ? first_row : last_row;
    // The warps whose range goes on from the previous warp's (or CTA's) in this row, and those holding the row as
    // their range's first row (their part is in their first slot, the others' in their last). The owners: back from
    // this warp to the first warp whose range does not go on from the previous one's.
    const uint32_t goes_back = __ballot_sync(~0u, lane < kWarps && lane_rows.first == row && lane_rows.before == row);
    const uint32_t first_slot = __ballot_sync(~0u, lane < kWarps && lane_rows.first == row);
    const int first_warp = 31 - __clz((~goes_back & ((2u << warp) - 1)) | 1u);
    Accumulators sum = {};
    for (int owner = first_warp; owner <= warp; ++owner)
      add_part<false>(slot(owner, first_slot >> owner & 1 ? kFirstPartSlot : kLastPartSlot), lane, sum);
    const bool starts_in_cta = !(goes_back & 1), ends_in_cta = !ends_cta || after_row != row;
    if (!starts_in_cta || !ends_in_cta) {  // the row goes on in other CTAs' ranges
      const auto cta_slot = [&](int64_t cta, int which) {
        return reinterpret_cast<float4*>(w.partials) +
               ((int64_t{blockIdx.y} * gridDim.x + cta) * 2 + which) * kSlotFloat4s;
      };
      // The CTAs holding the row, and whether the first of them holds it as its last part (its range starts before).
      int64_t first, last;
      bool first_holds_last_part;
      if (led) {
        const int2 ctas = i == 0 ? first_row_ctas : last_row_ctas;
        first = ctas.x >> 1, first_holds_last_part = ctas.x & 1, last = ctas.y;
      } else {  // ranges of equal length: the row's extent tells which CTAs hold it
        const int64_t row_begin = int64_t{__ldg(p.row_ptr + row)} << chunk_shift;
        const int64_t row_end = int64_t{__ldg(p.row_ptr + row + 1)} << chunk_shift;
        first = cta_ranges.part_of(row_begin), last = cta_ranges.part_of(row_end - 1);
        first_holds_last_part = cta_ranges.begin(first) < row_begin;
      }
      // The CTA's part goes to its first slot if the row is the CTA's first row, else to its last.
      put_part(cta_slot(blockIdx.x, first_slot & 1 ? 0 : 1), lane, sum);
      __syncwarp();  // every lane's share of the part is written before lane 0 releases it
      int brings_last_part = 0;
      if (lane == 0) {
        int32_t* arrivals = w.arrivals + int64_t{blockIdx.y} * grid_rows + row;
        ptx::fence_acq_rel_gpu();  // release: the part is visible GPU-wide before its arrival is counted
        brings_last_part = atomicAdd(arrivals, 1) == static_cast<int>(last - first);
        if (brings_last_part) {
          *arrivals = 0;             // every part has arrived: ready for the next launch
          ptx::fence_acq_rel_gpu();  // acquire: the other CTAs' parts, read below
        }
      }
      if (!__shfl_sync(~0u, brings_last_part, 0)) continue;
      __syncwarp();
      clear(sum);
      for (int64_t owner = first; owner <= last; ++owner)
        add_part<true>(cta_slot(owner, owner == first && first_holds_last_part ? 1 : 0), lane, sum);
    }
    put_part(scratch, lane, sum);
    store_slot<Out>(p, int64_t{row} * kRows, n0, lane, scratch);
  }

  // Tile rows without tiles: D = beta C + bias there (last, so that the loads above start at once; the first
  // candidate's extent was loaded at the start).
  bool zero_written = false;
  for (int64_t r = first_empty_candidate; r < grid_rows; r += int64_t{gridDim.x} * kWarps) {
    const bool empty = r == first_empty_candidate ? candidate_ptr[0] == candidate_ptr[1]
                                                  : __ldg(p.row_ptr + r) == __ldg(p.row_ptr + r + 1);
    if (!empty) continue;
    if (!zero_written) {
      const Accumulators zero = {};
      put_part(scratch, lane, zero);
      zero_written = true;
    }
    store_slot<Out>(p, r * kRows, n0, lane, scratch);
  }
#endif
}

// The kernel, its dynamic shared-memory limit raised past the default 48 KiB (once per instantiation).
template <class Element, class Out>
auto ready_kernel() {
  const auto kernel = warp_stream_tile_spmm_kernel<Element, Out>;
  static cuda::DynamicSmemLimit smem_limit;
  smem_limit.raise(kernel, kSmemBytes);
  return kernel;
}

}  // namespace

bool warp_stream_fits_device() {
  int device = 0, optin_bytes = 0;
  NMKIT_CUDA_CHECK(cudaGetDevice(&device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return optin_bytes >= kSmemBytes;
}

int warp_stream_max_ctas() {
  require(warp_stream_fits_device(), ErrorCode::unsupported, [&] {
    return "warp-stream tile: the kernel needs " + std::to_string(kSmemBytes / 1024) +
           " KiB of shared memory per CTA, more than this device allows (H100 and H200 have 227 KiB)";
  });
  int per_sm = 0;
  NMKIT_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ready_kernel<__half, __half>(), kThreads, kSmemBytes));
  return std::max(per_sm, 1) * nm24::device_facts().sm_count;
}

std::size_t warp_stream_partial_floats(int64_t max_ctas, int64_t n) {
  return static_cast<std::size_t>(ceil_div(n, int64_t{kBlockN}) * max_ctas * 2 * kSlotFloat4s * 4);
}

template <class Element, class Out>
void launch_warp_stream(const TileParams& p, const StreamWork& w, cudaStream_t stream, bool overlap) {
  if (p.tile_rows != kRows ||
      (p.tile_cols != kChunkCols && p.tile_cols != 2 * kChunkCols && p.tile_cols != 4 * kChunkCols))
    throw Error(ErrorCode::invalid_argument, "warp-stream tile: tiles must be 32 rows by 32, 64 or 128 columns, got " +
                                                 std::to_string(p.tile_rows) + "x" + std::to_string(p.tile_cols));
  const int64_t token_blocks = ceil_div(p.n, int64_t{kBlockN});
  require(token_blocks <= 65535, ErrorCode::unsupported, "warp-stream tile: more than 65535 token blocks");
  const dim3 grid(static_cast<unsigned>(w.ctas), static_cast<unsigned>(token_blocks));
  // The kernel's chunk indices (and a ring's worth past them) and columns are 32-bit.
  constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max() - 2 * kStages;
  require(p.nnz_tiles * (p.tile_cols / kChunkCols) <= kMaxIndex && p.cols <= kMaxIndex, ErrorCode::unsupported, [&] {
    return "warp-stream tile: the kernel takes at most " + std::to_string(kMaxIndex) + " 32-column chunks and columns";
  });
  require(w.ctas >= 1 && (p.nnz_tiles == 0 || w.ctas <= p.nnz_tiles * (p.tile_cols / kChunkCols)),
          ErrorCode::invalid_argument, "warp-stream tile: the grid must not exceed the stored chunks");
  const cuda::OverlappableLaunch launch_config(grid, dim3(kThreads), kSmemBytes, stream, overlap);
  NMKIT_CUDA_CHECK(cudaLaunchKernelEx(launch_config.config(), ready_kernel<Element, Out>(), p, w));
}

template void launch_warp_stream<__half, __half>(const TileParams&, const StreamWork&, cudaStream_t, bool);
template void launch_warp_stream<__half, float>(const TileParams&, const StreamWork&, cudaStream_t, bool);
template void launch_warp_stream<__nv_bfloat16, __nv_bfloat16>(const TileParams&, const StreamWork&, cudaStream_t,
                                                               bool);
template void launch_warp_stream<__nv_bfloat16, float>(const TileParams&, const StreamWork&, cudaStream_t, bool);

}  // namespace nmkit::gpu::tile
