#pragma once
// The Hopper tile-sparse SpMM (sm_90a): wgmma on the stored tiles, both operands staged by TMA. The kernel is a
// producer warp (Producer), two consumer warpgroups (Consumer: main loop, then an epilogue) and, with the deferred
// store, a storer lane (run_storer), over one stage ring (cuda::StagePipeline). sm90_tile_spmm.cu instantiates it
// for the product, sm90_tile_timeline.cu with the timeline recorded (a compile-time policy).
//
// A CTA computes a 128-row block of D for kBlockN tokens: one 128-row tile row, or two 64-row tile rows, paired at
// upload by the tile columns they share (pair_tile_rows), so that each half's outputs go to rows of their own
// (block_rows). Its producer warp reads the block's steps, precomputed at upload (tile_block_schedule: the union of
// the rows' tile columns, with the tile of each row), and per 64-column step posts on one mbarrier the step's slab
// of x (the K-major B operand, 64 columns x kBlockN tokens) and the tiles of the rows that store that column; a step
// mask tells each consumer warpgroup (64 rows, one m64nN wgmma per 16 columns) whether its row has a tile there. Two
// 64-row tile rows thus share each x slab that both need, which is where a tile-sparse product spends its L2
// bandwidth. The producer's per-step work is a broadcast of the step and the copies; merging the rows' lists on the
// device put shuffles, ballots and window loads on that path, so the lists are merged once, at upload.
//
// A CTA walks work units (128-row block x kBlockN tokens, in the order unit_place gives): one unit per CTA, or, when
// persistent, every gridDim-th unit (balanced schedules) or the next unit no CTA has claimed yet (blocks of
// unequal length, longest first), its producer streaming the next unit's steps while the consumers finish the
// last. The producer names each finished unit in its end-of-unit step, for the consumers' epilogue and the
// storer. With the deferred store (16-bit D final in registers) the consumers stage each unit as TMA boxes, 128
// tokens at a time, and one producer lane has the copy engine store them while the next unit runs; otherwise
// each consumer warpgroup writes its 64 rows through a staging buffer of its own, 32 tokens at a time. Neither
// drains the pipeline.
// Small grids (few units, e.g. decode) split K instead: the CTAs of a cluster of `split` take equal shares of
// one unit's steps, stage their partial tiles in the (then idle) pipeline, and each writes a share of
// D after summing the cluster's partial tiles through distributed shared memory (no workspace, no second launch).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "../common/check.cuh"
#include "../common/launch.cuh"
#include "../common/named_barrier.cuh"
#include "../common/pipeline.cuh"
#include "../common/sm90.cuh"
#include "../common/smem.cuh"
#include "../common/tensor_map.cuh"
#include "../nm24/nm24_common.cuh"
#include "../nm24/sm90_cluster_epilogue.cuh"
#include "../nm24/sm90_epilogue.cuh"
#include "../ptx/cluster.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/timer.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "../ptx/wgmma_ss.cuh"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/detail/tile_timeline.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "tile_common.cuh"

namespace nmkit::gpu::tile {
namespace {

namespace epi = sm90_epilogue;
using epi::BlockRows;

constexpr int kConsumers = 2;
using cuda::kWarpgroupThreads;
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
constexpr int kBlockRows = epi::kEpilogueRows;  // 128: one m64 wgmma per consumer warpgroup
static_assert(kBlockRows == kSm90BlockRows, "the heuristics count units of the same rows");
constexpr int kWarpgroupRows = kBlockRows / kConsumers;
constexpr int kStepK = 64;  // columns per pipeline step: one 128-byte swizzled row
constexpr int kRowBytes = kStepK * 2;
[[maybe_unused]] constexpr int kWgmmaK = 16;
constexpr int kSwizzleAlign = 1024;
constexpr int kABytes = kBlockRows * kRowBytes;  // a step's tile slots: 128 rows x 64 columns
constexpr int kMaxStages = 8;
constexpr int kMaxSplit = kMaxClusterSplit;
constexpr int kChunkN = 32;  // tokens per epilogue chunk of a warpgroup
static_assert(kWarpgroupRows == 64, "a consumer warpgroup issues m64 wgmma");

// What a CTA may take of an SM: registers per thread of each role (setmaxnreg) and shared memory.
template <int kBlockN>
struct Budget {
  static constexpr int kCtasPerSm = sm90_ctas_per_sm(kBlockN);
  static constexpr int kProducerRegisters = kCtasPerSm == 1 ? 72 : 80;  // step windows, look-ahead, copies: no spills
  static constexpr int kConsumerRegisters = kCtasPerSm == 1 ? 216 : 80;
  static constexpr int kPipelineBytes = (kCtasPerSm == 1 ? 224 : 104) * 1024;  // stages and epilogue buffers
  static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <=
                    (kConsumers + 1) * cuda::launch_registers(kThreads * kCtasPerSm),
                "setmaxnreg budgets must fit the registers allocated at launch");
};

// Step mask: bit w = consumer warpgroup w has a tile in this step. kEndOfUnit: the unit's steps are all posted,
// and the stage's end_origin names the unit's place in D (the consumers' epilogue and the storer learn it from
// there: under dynamic claiming only the producer knows which unit came, and it has loaded where it goes);
// kEndOfWork: the CTA has no more units.
[[maybe_unused]] constexpr uint32_t kEndOfUnit = 1u << 31;
[[maybe_unused]] constexpr uint32_t kEndOfWork = kEndOfUnit | 1u << 30;

// The deferred store stages a unit's 16-bit outputs in parts of at most 64 tokens (16 KiB per part) into two
// buffers in turn, so that the consumers stage one part while the copy engine still reads the other, instead of
// waiting for each read. The buffers take 32 KiB: at n256 a whole unit (64 KiB) would leave 3 pipeline stages
// instead of 4, and the fourth stage is worth ~18 % of a step. Units of one part (n64) keep one buffer.
constexpr int kMaxStorePartN = 64;
template <int kBlockN>
constexpr int kStoreParts = kBlockN > kMaxStorePartN ? kBlockN / kMaxStorePartN : 1;
template <int kBlockN>
constexpr int kStoreBuffers = kStoreParts<kBlockN> >= 2 ? 2 : 1;

// Shared memory: stages [x slab: kBlockN tokens x 128 B][tile slots: 128 rows x 128 B] (1024-aligned), the
// epilogue's buffers (one 64 x kChunkN chunk buffer per consumer warpgroup, or with kDeferred the part buffers of
// the unit's 16-bit outputs), then barriers and step masks.
using ChunkTile = epi::EpilogueTile<kWarpgroupRows, kChunkN>;
template <int kBlockN>
using OutputTile = epi::OutputTile<kBlockRows, kBlockN / kStoreParts<kBlockN>>;
template <int kBlockN, bool kDeferred>
struct Shape {
  static constexpr int kXBytes = kBlockN * kRowBytes;
  static constexpr int kStageBytes = kXBytes + kABytes;
  static constexpr int kChunkBytes = ChunkTile::kBytes;
  static constexpr int kEpilogueBytes =
      kDeferred ? kStoreBuffers<kBlockN> * OutputTile<kBlockN>::kBytes : kConsumers * kChunkBytes;
  static constexpr int kStages = std::min((Budget<kBlockN>::kPipelineBytes - kEpilogueBytes) / kStageBytes, kMaxStages);
  static constexpr int kPipelineEnd = kStages * kStageBytes;
  static constexpr int kBarriers = kPipelineEnd + kEpilogueBytes;
  static constexpr int kBarrierWords = 2 * kStages + 2;  // full, empty; staged, stored (kDeferred)
  // + end_origin[kStages], staged_origin (8 bytes each), step_mask[kStages]
  static constexpr int kSmemBytes = kSwizzleAlign + kBarriers + kBarrierWords * 8 + kStages * 8 + 8 + kStages * 4;
  static_assert(kBlockN % kChunkN == 0 && kChunkBytes % 16 == 0, "whole, aligned epilogue chunks");
  static_assert(kXBytes % kSwizzleAlign == 0 && kStageBytes % kSwizzleAlign == 0, "stages keep the swizzle alignment");
  static_assert(kEpilogueBytes % 16 == 0, "the barriers stay 8-byte aligned and the output tile 16-byte aligned");
  static_assert(kStages >= 2 && kSmemBytes <= cuda::kSm90SharedMemoryPerCta, "the pipeline must fit in shared memory");
  static_assert(kConsumers * epi::EpilogueTile<kWarpgroupRows, kBlockN>::kBytes <= kPipelineEnd,
                "a split's tiles reuse the stages");
};

// With kDeferred, lane 0 of the producer warpgroup's warp 1 has each staged part stored by TMA.
[[maybe_unused]] constexpr int kStorerWarp = 1;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // device helpers of the sm_90a pass only
// Lane l's step of the 32 from `first` (tile_block_schedule's 16-byte TileStep: {column, tile[0], tile[1],
// mask}): the producer warp reads a unit's steps 32 per coalesced load, one window ahead, and broadcasts each
// step from its lane, so that nothing on its per-step path waits for a global load.
__device__ __forceinline__ int4 load_step_window(const int4* steps, int32_t first, int32_t end, int lane) {
  return first + lane < end ? __ldg(steps + first + lane) : make_int4(0, 0, 0, 0);
}
__device__ __forceinline__ int4 broadcast_step(const int4& window, int slot) {
  return make_int4(__shfl_sync(0xffffffffu, window.x, slot), __shfl_sync(0xffffffffu, window.y, slot),
                   __shfl_sync(0xffffffffu, window.z, slot), __shfl_sync(0xffffffffu, window.w, slot));
}

// A work unit: its 128-row block of D and its token block, numbered in the schedule's order (longest blocks
// first), and the CTA's share of the block's steps (split K: equal shares of the steps, so that a cluster's CTAs
// finish together). The loads are independent of each other. 32-bit indices, not 64-bit offsets: the producer
// keeps them through a unit within its 64 registers.
struct UnitOrigin {
  int32_t block, token_block;
};
struct Unit : UnitOrigin {
  int32_t step_begin, step_end;
};
// Unit u's position in the schedule and its token block. Token block by token block (balanced schedules), the
// CTAs running at once read the same x slabs, which then come from L2; position by position, the longest blocks
// of every token block start first.
struct UnitPlace {
  int32_t position, token_block;
};
template <int kBlockN>
__device__ UnitPlace unit_place(const TileParams& p, int32_t unit) {
  if (p.units_by_token_block) {
    const auto positions = static_cast<int32_t>((p.rows + kBlockRows - 1) / kBlockRows);
    return {unit % positions, unit / positions};
  }
  const auto token_blocks = static_cast<int32_t>((p.n + kBlockN - 1) / kBlockN);
  return {unit / token_blocks, unit % token_blocks};
}
// A unit's entries in the schedule, as loaded: unit_lookup issues the loads and unit_from uses them, so that the
// producer can post a step in between instead of waiting for them.
struct UnitLookup {
  int32_t token_block, block, first_step, end_step;
};
template <int kBlockN>
__device__ UnitLookup unit_lookup(const TileParams& p, int32_t unit) {
  const UnitPlace place = unit_place<kBlockN>(p, unit);
  return {place.token_block, __ldg(p.schedule_block + place.position), __ldg(p.schedule_step_ptr + place.position),
          __ldg(p.schedule_step_ptr + place.position + 1)};
}
__device__ __forceinline__ Unit unit_from(const UnitLookup& l, uint32_t rank, uint32_t split) {
  const int64_t steps = l.end_step - l.first_step;
  return {{l.block, l.token_block},
          static_cast<int32_t>(l.first_step + steps * rank / split),
          static_cast<int32_t>(l.first_step + steps * (rank + 1) / split)};
}

// The first rows of D of a block's two 64-row halves (TileBlockSchedule::block_groups; rows past R for a half
// without rows): paired tile rows are not neighbours.
__device__ __forceinline__ BlockRows block_rows(const TileParams& p, int32_t block) {
  const int2 groups = __ldg(reinterpret_cast<const int2*>(p.schedule_block_groups) + block);
  return {{int64_t{groups.x} * kWarpgroupRows, int64_t{groups.y} * kWarpgroupRows}};
}

// One thread: has the copy engine store a staged part of a unit (epi::OutputTile, kRows = 128) to D, each 64-row
// half at its own rows, as one bulk group. D's tensor map has boxes of 64 rows: 64 x kCols (col-major D, a box per
// half) or 64 x 64 (row-major D, two per 64 tokens, one per half).
template <int kRows, int kCols>
__device__ __forceinline__ void issue_staged_halves(const void* d_map, const epi::OutputTile<kRows, kCols>& tile,
                                                    bool col_major, const BlockRows& rows, int64_t n0) {
  static_assert(kRows == 2 * kWarpgroupRows && epi::OutputTile<kRows, kCols>::kWholeBoxes,
                "two halves of 64-element lines");
  constexpr int kHalfLines = kWarpgroupRows * epi::kLineBytes;  // a half's rows in a row-major box
  if (col_major) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      ptx::tma_store_2d(d_map, tile.base + half * epi::OutputTile<kRows, kCols>::box_bytes(true),
                        static_cast<int32_t>(rows.first[half]), static_cast<int32_t>(n0));
  } else {
#pragma unroll
    for (int box = 0; box < kCols / epi::kLineElements; ++box)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        ptx::tma_store_2d(d_map, tile.base + box * epi::OutputTile<kRows, kCols>::box_bytes(false) + half * kHalfLines,
                          static_cast<int32_t>(n0 + box * epi::kLineElements), static_cast<int32_t>(rows.first[half]));
  }
  ptx::bulk_commit_group();
}

// v, opaque to the compiler: what derives from it is computed where it is used instead of hoisted out of the unit
// loop. Hoisted, the split-K epilogue's ~80 per-thread staging addresses spilled the n256 consumers (364 bytes).
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

#endif

// The kernel's instrumentation, a compile-time policy: the product records nothing (NoTimeline, whose calls
// compile to nothing), the diagnosis build records a timeline per CTA (RecordTimeline: detail/tile_timeline.hpp).
struct NoTimeline {
  __device__ void cta_started() const {}
  __device__ void step_posted(int) const {}
  __device__ void step_issued(int) const {}
  __device__ void step_arrived(int) const {}
  __device__ void math_done(int) const {}
  __device__ void first_part_staged(int) const {}
  __device__ void unit_done(int) const {}
  __device__ void cta_ended() const {}
};
// The buffer is a kernel argument of its own, read at each use: as a TileParams field it tipped ptxas into spilling
// the n256 consumer's addresses.
struct RecordTimeline {
  uint64_t* words;
  __device__ void record(int slot, uint64_t value) const {
    words[int64_t{blockIdx.x} * TileTimeline::kWords + slot] = value;
  }
  __device__ void cta_started() const {
    record(TileTimeline::kStartNs, ptx::global_timer_ns()), record(TileTimeline::kStart, clock64());
  }
  __device__ void step_posted(int step) const {
    if (step < TileTimeline::kSteps) record(TileTimeline::kPosted + step, clock64());
  }
  __device__ void step_issued(int step) const {
    if (step < TileTimeline::kSteps) record(TileTimeline::kIssued + step, clock64());
  }
  __device__ void step_arrived(int step) const {
    if (step < TileTimeline::kSteps) record(TileTimeline::kArrived + step, clock64());
  }
  __device__ void math_done(int unit) const {
    if (unit < TileTimeline::kUnits) record(TileTimeline::kMathDone + unit, clock64());
  }
  __device__ void first_part_staged(int unit) const {
    if (unit < TileTimeline::kUnits) record(TileTimeline::kFirstPartStaged + unit, clock64());
  }
  __device__ void unit_done(int unit) const {
    if (unit < TileTimeline::kUnits) record(TileTimeline::kUnitDone + unit, clock64());
  }
  __device__ void cta_ended() const {
    record(TileTimeline::kEndNs, ptx::global_timer_ns()), record(TileTimeline::kEnd, clock64());
  }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The CTA's shared memory (Shape): the stages, the epilogue's buffers, then the stage ring's barriers, the deferred
// store's two barriers and the words the producer passes with each step.
template <int kBlockN, bool kDeferred>
struct SharedStorage {
  using S = Shape<kBlockN, kDeferred>;
  unsigned char* base;  // 1024-aligned
  // Aligned by pointer arithmetic on the shared array itself (not through an integer), so that every address
  // derived from it stays a 32-bit shared one instead of a rebuilt 64-bit generic one.
  __device__ explicit SharedStorage(unsigned char* raw)
      : base(raw + (kSwizzleAlign - ptx::smem_address(raw) % kSwizzleAlign) % kSwizzleAlign) {}
  __device__ unsigned char* stage(int s) const { return base + s * S::kStageBytes; }
  __device__ uint64_t* ring_barriers() const { return reinterpret_cast<uint64_t*>(base + S::kBarriers); }
  __device__ uint64_t* staged() const { return ring_barriers() + 2 * S::kStages; }  // a part staged (256 arrivals)
  __device__ uint64_t* stored() const { return staged() + 1; }  // the copy engine read it (one arrival)
  __device__ UnitOrigin* end_origin() const { return reinterpret_cast<UnitOrigin*>(stored() + 1); }  // [stage]
  __device__ UnitOrigin* staged_origin() const { return end_origin() + S::kStages; }  // block -1: no more parts
  __device__ uint32_t* step_mask() const { return reinterpret_cast<uint32_t*>(staged_origin() + 1); }  // [stage]
  // Part j of the deferred store goes to buffer j % kStoreBuffers.
  __device__ OutputTile<kBlockN> output_buffer(int part) const {
    return OutputTile<kBlockN>{ptx::smem_address(base + S::kPipelineEnd) +
                               (part % kStoreBuffers<kBlockN>)*OutputTile<kBlockN>::kBytes};
  }
  __device__ ChunkTile chunk_tile(bool col_major, int warpgroup) const {
    return {col_major, reinterpret_cast<float*>(base + S::kPipelineEnd + warpgroup * S::kChunkBytes)};
  }
};

// The producer warp: walks the CTA's units and posts each step of a unit on the ring (its mask, and for a step
// with tiles the x slab and the tiles of the masked rows), then an end-of-unit step naming the unit; lane 0 issues
// the copies. The ring position runs on across units: the next unit streams in while the consumers finish the last.
template <int kBlockN, bool kDeferred, class Timeline>
struct Producer {
  using S = Shape<kBlockN, kDeferred>;
  using Pipeline = cuda::StagePipeline<S::kStages>;

  const TileParams& p;
  const CUtensorMap* x_map;
  const CUtensorMap* tile_map;
  const Pipeline& pipeline;
  const SharedStorage<kBlockN, kDeferred>& smem;
  const Timeline& timeline;
  int lane;
  uint32_t rank, split;
  int tile_rows_per_block;   // 1 or 2
  uint32_t tile_step_bytes;  // one tile's 64 columns
  cuda::ProducerRing<S::kStages> ring{};
  int steps = 0;  // posted, for the timeline

  __device__ Producer(const TileParams& p, const CUtensorMap* x_map, const CUtensorMap* tile_map,
                      const Pipeline& pipeline, const SharedStorage<kBlockN, kDeferred>& smem, const Timeline& timeline,
                      int lane, uint32_t rank, uint32_t split)
      : p(p),
        x_map(x_map),
        tile_map(tile_map),
        pipeline(pipeline),
        smem(smem),
        timeline(timeline),
        lane(lane),
        rank(rank),
        split(split),
        tile_rows_per_block(kBlockRows / p.tile_rows),
        tile_step_bytes(p.tile_rows * kRowBytes) {}

  __device__ void run(int32_t first_unit, int32_t units) {
    const int steps_per_tile = p.tile_cols / kStepK;  // 1 or 2
    // The next unit is found while this one streams, in three dependent stages, one per step posted, so that the
    // producer does not stop on a load's result: its number (every gridDim-th by cluster, or with p.unit_claims
    // the next one no CTA has claimed: an atomicAdd by lane 0), its entries in the schedule, then its first 32
    // steps. It begins after the unit's first steps or, claiming, kClaimAheadSteps before its end (a claim made
    // early is a static assignment). Done in one go, the dependent loads held the producer 1-2 us per unit.
    constexpr int kLookaheadStep = 2, kClaimAheadSteps = 6;
    enum : int { kNotBegun, kNumbered, kLookedUp, kLoaded };
    int32_t unit = first_unit;
    Unit next = unit < units ? unit_from(unit_lookup<kBlockN>(p, unit), rank, split) : Unit{};
    int4 next_window = load_step_window(p.schedule_steps, next.step_begin, next.step_end, lane);
    while (unit < units) {
      const Unit u = next;
      int4 window = next_window, ahead = load_step_window(p.schedule_steps, u.step_begin + 32, u.step_end, lane);
      const int32_t look_at =
          u.step_begin +
          (p.unit_claims ? max(kLookaheadStep, u.step_end - u.step_begin - kClaimAheadSteps) : kLookaheadStep);
      int32_t next_unit = 0;  // when claimed, lane 0's until kLookedUp
      UnitLookup lookup{};
      int lookahead = kNotBegun;
      const auto look_ahead = [&] {  // its next stage
        if (lookahead == kNotBegun) {
          if (!p.unit_claims)
            next_unit = unit + static_cast<int32_t>(gridDim.x / split);
          else if (lane == 0)
            next_unit = static_cast<int32_t>(gridDim.x) + atomicAdd(p.unit_claims + kUnitsClaimed, 1);
        } else if (lookahead == kNumbered) {
          if (p.unit_claims) next_unit = __shfl_sync(0xffffffffu, next_unit, 0);
          if (next_unit < units) lookup = unit_lookup<kBlockN>(p, next_unit);
        } else if (next_unit < units) {
          next = unit_from(lookup, rank, split);
          next_window = load_step_window(p.schedule_steps, next.step_begin, next.step_end, lane);
        }
        ++lookahead;
      };
      for (int32_t i = u.step_begin, slot = 0; i < u.step_end; ++i, ++slot) {
        if (slot == 32) {
          window = ahead, slot = 0;
          ahead = load_step_window(p.schedule_steps, i + 32, u.step_end, lane);
        }
        if (i >= look_at && lookahead < kLoaded) look_ahead();
        const int4 tiles = broadcast_step(window, slot);
        for (int part = 0; part < steps_per_tile; ++part) post(static_cast<uint32_t>(tiles.w), tiles, part, u);
      }
      while (lookahead < kLoaded) look_ahead();
      post(kEndOfUnit, int4{}, 0, u);
      unit = next_unit;
    }
    post(kEndOfWork, int4{}, 0, Unit{});
    if (p.unit_claims && lane == 0) {  // the last CTA to retire leaves the counters zero for the next launch
      __threadfence();
      if (atomicAdd(p.unit_claims + kCtasRetired, 1) == static_cast<int>(gridDim.x) - 1)
        p.unit_claims[kUnitsClaimed] = 0, p.unit_claims[kCtasRetired] = 0;
    }
  }

 private:
  // One step: its mask, and for a step with tiles (`tiles`: a TileStep) the x slab of 64 columns `part` of the
  // tile column and the tiles of the masked rows, all counted by the stage's transaction bytes.
  __device__ void post(uint32_t mask, const int4& tiles, int part, const Unit& u) {
    ring.acquire(pipeline);
    const int s = ring.at.stage;
    ring.advance();
    const int step = steps++;
    if (lane != 0) return;
    timeline.step_posted(step);
    smem.step_mask()[s] = mask;
    if (mask & kEndOfUnit) {
      smem.end_origin()[s] = u;
      pipeline.post(s);
      return;
    }
    unsigned char* stage = smem.stage(s);
    const uint32_t tile_copies = tile_rows_per_block == 1 ? 1u : __popc(mask);  // a 128-row tile: one copy
    pipeline.expect_bytes(s, S::kXBytes + tile_copies * tile_step_bytes);
    const int32_t k_in_tile = part * kStepK;
    uint64_t* full = pipeline.full(s);
    ptx::tma_load_2d(stage, x_map, full, tiles.x * p.tile_cols + k_in_tile, u.token_block * kBlockN);
    if (mask & 1u) ptx::tma_load_3d(stage + S::kXBytes, tile_map, full, k_in_tile, 0, tiles.y);
    if (tile_rows_per_block == 2 && mask & 2u)
      ptx::tma_load_3d(stage + S::kXBytes + kWarpgroupRows * kRowBytes, tile_map, full, k_in_tile, 0, tiles.z);
    timeline.step_issued(step);
  }
};

// With the deferred store, one lane of the producer warpgroup (warp kStorerWarp): has the copy engine store each
// part the consumers staged, until they stage a part of block -1.
template <class Out, int kBlockN, class Timeline>
__device__ __forceinline__ void run_storer(const TileParams& p, const CUtensorMap* d_map,
                                           const SharedStorage<kBlockN, true>& smem, const Timeline& timeline) {
  ptx::prefetch_tensor_map(d_map);
  constexpr int kPartN = kBlockN / kStoreParts<kBlockN>;
  // A unit's parts come in order; block -1 ends the CTA. Arrival i on `stored` follows the issue of part i's
  // store: with one buffer once that part has been read, with two once part i - 1 has (arrival 0 then only says
  // that part 0's origin was taken). Either way the consumers, who wait for arrival j - 1 before staging part j,
  // never run two phases ahead of this thread on `staged` (a parity wait cannot tell those apart).
  for (int parts_stored = 0;; ++parts_stored) {
    ptx::mbarrier_wait_suspended(smem.staged(), static_cast<uint32_t>(parts_stored & 1));
    const UnitOrigin origin = *smem.staged_origin();
    if (origin.block < 0) break;
    issue_staged_halves(d_map, smem.output_buffer(parts_stored), p.d_col_major, block_rows(p, origin.block),
                        int64_t{origin.token_block} * kBlockN + parts_stored % kStoreParts<kBlockN> * kPartN);
    if constexpr (kStoreBuffers<kBlockN> == 1)
      ptx::bulk_wait_group_read<0>();
    else if (parts_stored > 0)
      ptx::bulk_wait_group_read<1>();
    ptx::mbarrier_arrive(smem.stored());
  }
  ptx::bulk_wait_group<0>();  // D written before the CTA retires
  timeline.cta_ended();
}

// What ends a consumer's unit: the end-of-unit step's mark (kEndOfUnit, or kEndOfWork) and the unit it names.
struct UnitEnd {
  uint32_t mark;
  UnitOrigin origin;
};

// A consumer warpgroup (64 rows of each unit): the main loop issues one m64nN wgmma group per step that has its
// row's tile and hands each stage back once the group after it is issued; the epilogue writes the unit's rows.
template <class Element, class Out, int kBlockN, bool kDeferred, class Timeline>
struct Consumer {
  using S = Shape<kBlockN, kDeferred>;
  using Pipeline = cuda::StagePipeline<S::kStages>;
  using Wgmma = ptx::WgmmaSS<kBlockN, typename nm24::ElementTraits<Element>::Mma>;

  const TileParams& p;
  const Pipeline& pipeline;
  const SharedStorage<kBlockN, kDeferred>& smem;
  const Timeline& timeline;
  int tid, warpgroup, thread_in_group;
  uint32_t split;
  float acc[Wgmma::kAccumulators];
  cuda::RingPosition<S::kStages> ring{};
  int steps = 0;  // seen, for the timeline

  __device__ void run() {
    const ChunkTile chunk_tile = smem.chunk_tile(p.d_col_major, warpgroup);
    for (int units_done = 0;; ++units_done) {  // until the producer's kEndOfWork
      const UnitEnd end = mainloop();
      timeline_by_thread0([&] { timeline.math_done(units_done); });
      if (end.mark == kEndOfWork) {
        if constexpr (kDeferred) end_deferred_store(units_done);
        break;
      }
      // This warpgroup's first row of D (its block's 64-row group), and the token block's first token.
      const int64_t rows0 = block_rows(p, end.origin.block).of(warpgroup);
      const int64_t n0 = int64_t{end.origin.token_block} * kBlockN;
      if constexpr (kDeferred)
        stage_deferred(end.origin, rows0, units_done);
      else if (split == 1)
        store_chunked(chunk_tile, rows0, n0);
      else  // split K (one unit per CTA): the pipeline is idle now; the cluster sums its partial tiles there
        epi::write_cluster_sum<Out, kBlockN>(p, reinterpret_cast<float*>(smem.base), acc,
                                             block_rows(p, end.origin.block), n0, opaque(tid));
      timeline_by_thread0([&] { timeline.unit_done(units_done); });
    }
    if constexpr (!kDeferred) timeline_by_thread0([&] { timeline.cta_ended(); });
  }

 private:
  template <class F>
  __device__ void timeline_by_thread0(const F& record) const {
    if (tid == 0) record();
  }

  // One unit's steps into acc, up to its end-of-unit step; on return every wgmma of the unit is complete and every
  // stage handed back.
  __device__ UnitEnd mainloop() {
#pragma unroll
    for (int i = 0; i < Wgmma::kAccumulators; ++i) acc[i] = 0.0f;
    int pending = -1;  // the stage whose wgmma group may still be reading
    UnitEnd end{0, {}};
    for (;;) {
      const int s = ring.stage;
      pipeline.wait_full(ring);
      ring.advance();
      const int step = steps++;
      timeline_by_thread0([&] { timeline.step_arrived(step); });
      const uint32_t mask = smem.step_mask()[s];
      const bool end_of_unit = (mask & kEndOfUnit) != 0;
      if (end_of_unit || !(mask >> warpgroup & 1u)) {
        // Nothing for this warpgroup: release the pending stage too (the producer may need it before this
        // warpgroup's next tile comes), and this one.
        if (pending >= 0) {
          ptx::wgmma_wait_group<0>();
          pipeline.release(pending);
          pending = -1;
        }
        if (end_of_unit) end.origin = smem.end_origin()[s];  // read before the stage (and the word) goes back
        pipeline.release(s);
        if (end_of_unit) {
          end.mark = mask;
          break;
        }
        continue;
      }
      mma_stage(smem.stage(s));
      ptx::wgmma_wait_group<1>();  // the previous group is done: its stage goes back to the producer
      if (pending >= 0) pipeline.release(pending);
      pending = s;
    }
    // Unconditional, though every path out of the loop has waited already: with only the conditional waits above,
    // ptxas cannot prove the accumulators idle here and serialises every wgmma of the main loop instead (a wait
    // after each one, ptxas info C7518).
    ptx::wgmma_wait_group<0>();
    ptx::fence_registers(acc);
    return end;
  }

  // A stage's 64 columns as one wgmma group: this warpgroup's 64 rows of tile slots against the x slab.
  __device__ void mma_stage(const unsigned char* stage) {
    const uint64_t x_desc = ptx::make_smem_desc_k_major_sw128(ptx::smem_address(stage));
    const uint64_t tile_desc = ptx::make_smem_desc_k_major_sw128(
        ptx::smem_address(stage + S::kXBytes + warpgroup * kWarpgroupRows * kRowBytes));
    ptx::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kStepK / kWgmmaK; ++k)  // 16 columns = 32 bytes further along each swizzled row
      Wgmma::mma(acc, ptx::advance_smem_desc(tile_desc, k * kWgmmaK * 2),
                 ptx::advance_smem_desc(x_desc, k * kWgmmaK * 2), 1);
    ptx::wgmma_commit_group();
  }

  // Epilogue without the deferred store: this warpgroup's 64 rows, kChunkN tokens at a time through its own
  // staging buffer, while the producer loads ahead.
  __device__ void store_chunked(const ChunkTile& chunk_tile, int64_t rows0, int64_t n0) {
#pragma unroll
    for (int chunk = 0; chunk < kBlockN / kChunkN; ++chunk) {
      cuda::warpgroup_barrier_sync(warpgroup);  // the previous chunk is written
      epi::stage_accumulators(p, chunk_tile, acc, p.bias, rows0, 0, chunk * kChunkN, thread_in_group);
      cuda::warpgroup_barrier_sync(warpgroup);
      epi::write_tile<Out>(p, chunk_tile, rows0, n0 + chunk * kChunkN, thread_in_group, kWarpgroupThreads,
                           epi::LocalStaged{});
    }
  }

  // Epilogue with the deferred store: stages each part of the final outputs once the copy engine has read its
  // buffer, for the storer.
  __device__ void stage_deferred(const UnitOrigin& origin, int64_t rows0, int units_done) {
    constexpr int kParts = kStoreParts<kBlockN>, kPartAccumulators = Wgmma::kAccumulators / kParts;
    static_assert(kParts % kStoreBuffers<kBlockN> == 0, "every unit starts on the first buffer");
#pragma unroll
    for (int part = 0; part < kParts; ++part) {  // part i: the i-th kBlockN / kParts tokens, as many accumulators
      const int parts_staged = units_done * kParts + part;
      // Arrival parts_staged - 1 (see run_storer): this part's buffer has been read, and the storer has taken the
      // last part's origin.
      if (parts_staged > 0) ptx::mbarrier_wait(smem.stored(), static_cast<uint32_t>((parts_staged - 1) & 1));
      const auto& part_acc = *reinterpret_cast<const float(*)[kPartAccumulators]>(acc + part * kPartAccumulators);
      // Staged at the warpgroup's 64 rows of the part's buffer; m0 + row_offset = rows0 for the bias.
      epi::stage_outputs<Out>(p, smem.output_buffer(part), part_acc, rows0 - warpgroup * kWarpgroupRows,
                              warpgroup * kWarpgroupRows, thread_in_group);
      if (tid == 0) *smem.staged_origin() = origin;
      ptx::mbarrier_arrive(smem.staged());
      if (part == 0) timeline_by_thread0([&] { timeline.first_part_staged(units_done); });
    }
  }

  // The storer's last part: none (once it has taken the last real one's origin).
  __device__ void end_deferred_store(int units_done) {
    const int parts_staged = units_done * kStoreParts<kBlockN>;
    if (parts_staged > 0) ptx::mbarrier_wait(smem.stored(), static_cast<uint32_t>((parts_staged - 1) & 1));
    if (tid == 0) *smem.staged_origin() = UnitOrigin{-1, 0};
    ptx::mbarrier_arrive(smem.staged());
  }
};
#endif

template <class Element, class Out, int kBlockN, bool kDeferred, class Timeline>
__global__ void __launch_bounds__(kThreads, Budget<kBlockN>::kCtasPerSm)
    sm90_tile_spmm_kernel(const __grid_constant__ TileParams p, const __grid_constant__ CUtensorMap x_map,
                          const __grid_constant__ CUtensorMap tile_map, const __grid_constant__ CUtensorMap d_map,
                          const Timeline timeline) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Shape<kBlockN, kDeferred>;
  extern __shared__ unsigned char smem_raw[];
  const SharedStorage<kBlockN, kDeferred> smem(smem_raw);
  const cuda::StagePipeline<S::kStages> pipeline(smem.ring_barriers());

  const int tid = threadIdx.x, warpgroup = tid / kWarpgroupThreads;
  const uint32_t split = ptx::cluster_nctarank(), rank = ptx::cluster_ctarank();
  // Fewer than 2^30 units (launch checks): 32-bit unit arithmetic, unit + grid size included.
  const auto units = static_cast<int32_t>((p.rows + kBlockRows - 1) / kBlockRows * ((p.n + kBlockN - 1) / kBlockN));

  if (tid == 0) {
    timeline.cta_started();
    ptx::prefetch_tensor_map(&x_map);
    ptx::prefetch_tensor_map(&tile_map);
    pipeline.init(1, kConsumers * kWarpgroupThreads);
    ptx::mbarrier_init(smem.staged(), kConsumers * kWarpgroupThreads);
    ptx::mbarrier_init(smem.stored(), 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == kConsumers) {  // producer: warp 0 reads the unit's steps, its lane 0 issues the copies
    ptx::setmaxnreg_dec<Budget<kBlockN>::kProducerRegisters>();
    if (tid % kWarpgroupThreads < 32) {
      Producer<kBlockN, kDeferred, Timeline> producer(p, &x_map, &tile_map, pipeline, smem, timeline, tid % 32, rank,
                                                      split);
      producer.run(static_cast<int32_t>(blockIdx.x / split), units);
    } else if constexpr (kDeferred) {
      if (tid % kWarpgroupThreads == kStorerWarp * 32) run_storer<Out, kBlockN>(p, &d_map, smem, timeline);
    }
    if (split > 1) {  // the consumers' two cluster barriers (write_cluster_sum), met by whole warps
      __syncwarp();
      ptx::cluster_sync();
      ptx::cluster_sync_relaxed();
    }
    return;
  }

  ptx::setmaxnreg_inc<Budget<kBlockN>::kConsumerRegisters>();
  Consumer<Element, Out, kBlockN, kDeferred, Timeline> consumer{
      p, pipeline, smem, timeline, tid, warpgroup, tid % kWarpgroupThreads, split};
  consumer.run();
#endif
}

template <class Element, class Out, int kBlockN, bool kDeferred, class Timeline>
auto ready_kernel() {  // the kernel, its dynamic shared-memory limit raised to what it takes
  auto kernel = sm90_tile_spmm_kernel<Element, Out, kBlockN, kDeferred, Timeline>;
  static cuda::DynamicSmemLimit smem_limit;
  smem_limit.raise(kernel, Shape<kBlockN, kDeferred>::kSmemBytes);
  return kernel;
}

}  // namespace

// A slot of the current device's pool of unit-claim counters (unit_claim_pool): each launch takes the next one,
// so that launches running at the same time (other streams) count apart, up to kUnitClaimSlots of them.
int32_t* unit_claim_slot();

namespace {
template <class Element, class Out, int kBlockN, bool kDeferred, class Timeline>
void launch(const TileParams& params, int split, bool persistent, const Timeline& timeline, cudaStream_t stream) {
  using S = Shape<kBlockN, kDeferred>;
  const auto kernel = ready_kernel<Element, Out, kBlockN, kDeferred, Timeline>();
  TileParams p = params;
  // x[C, K] (B col-major) in boxes of 64 columns x kBlockN tokens; the packed tiles as {tile_cols, tile_rows, nnz}
  // in boxes of 64 columns x one whole tile.
  const CUtensorMap x_map =
      cuda::make_tensor_map_sw128<Element, 2>(p.b, {static_cast<cuuint64_t>(p.cols), static_cast<cuuint64_t>(p.n)},
                                              {static_cast<cuuint64_t>(p.cols) * 2}, {kStepK, kBlockN});
  const cuuint64_t tiles = static_cast<cuuint64_t>(std::max<int64_t>(p.nnz_tiles, 1));  // a map needs one tile
  const auto tile_cols = static_cast<cuuint64_t>(p.tile_cols), tile_rows = static_cast<cuuint64_t>(p.tile_rows);
  const CUtensorMap tile_map = cuda::make_tensor_map_sw128<Element, 3>(
      p.tiles, {tile_cols, tile_rows, tiles}, {tile_cols * 2, tile_rows * tile_cols * 2},
      {kStepK, static_cast<cuuint32_t>(p.tile_rows), 1});
  // D for the deferred store (its contiguous dimension first, boxes of 64 x a staged part's other extent);
  // unused otherwise.
  CUtensorMap d_map{};
  if constexpr (kDeferred) {
    const auto rows = static_cast<cuuint64_t>(p.rows), n = static_cast<cuuint64_t>(p.n);
    d_map = p.d_col_major
                ? cuda::make_tensor_map_sw128<Out, 2>(p.d, {rows, n}, {rows * 2},
                                                      {epi::kLineElements, kBlockN / kStoreParts<kBlockN>})
                : cuda::make_tensor_map_sw128<Out, 2>(p.d, {n, rows}, {n * 2}, {epi::kLineElements, kWarpgroupRows});
  }
  // One unit per CTA (per cluster when split), balanced by the hardware's CTA scheduler; or persistent: one CTA
  // per slot (sm90_ctas_per_sm per SM) at most, each striding over the units or claiming the next one as it nears
  // the end of one, so that CTAs that drew longer units (or run on slower SMs) take fewer.
  const int64_t units = ceil_div(p.rows, int64_t{kBlockRows}) * ceil_div(p.n, int64_t{kBlockN});
  const int64_t blocks = sm90_grid_ctas(units, split, persistent, kBlockN, nm24::device_facts().sm_count);
  require(units * split < (int64_t{1} << 30), ErrorCode::unsupported, "sm90 tile: 2^30 or more work units x split");
  p.unit_claims =
      sm90_claims_units(units, blocks, split, persistent, p.units_by_token_block) ? unit_claim_slot() : nullptr;
  const cuda::OverlappableLaunch launch(dim3(static_cast<unsigned>(blocks)), dim3(kThreads), S::kSmemBytes, stream,
                                        /*overlap=*/false, split);
  NMKIT_CUDA_CHECK(cudaLaunchKernelEx(launch.config(), kernel, p, x_map, tile_map, d_map, timeline));
}

// launch_sm90's body for one instrumentation policy: checks the configuration and picks the instantiation.
template <class Element, class Out, class Timeline>
void launch_with(const TileParams& p, const Sm90TileConfig& config, const Timeline& timeline, cudaStream_t stream) {
  require(p.tile_rows == 64 || p.tile_rows == 128, ErrorCode::invalid_argument,
          [&] { return "sm90 tile: tile rows must be 64 or 128, got " + std::to_string(p.tile_rows); });
  require(p.tile_cols == 64 || p.tile_cols == 128, ErrorCode::invalid_argument,
          [&] { return "sm90 tile: tile columns must be 64 or 128, got " + std::to_string(p.tile_cols); });
  require(config.split >= 1 && config.split <= kMaxSplit, ErrorCode::invalid_argument, "sm90 tile: split must be 1..8");
  // The deferred store trades pipeline stages for an epilogue off the consumers' critical path (the plan decides).
  require(!config.deferred_store ||
              (config.split == 1 && config.block_n >= epi::kLineElements && nm24::aligned16(p.d) &&
               epi::outputs_final_in_registers(sizeof(Out) == 2, p.beta, p.activation, p.d_col_major ? p.rows : p.n)),
          ErrorCode::invalid_argument,
          "sm90 tile: the deferred store needs split 1, block_n >= 64, a 16-bit D with 16-byte aligned address and "
          "stride, beta 0 and no GELU");
  const auto launch_n = [&]<int kBlockN>() {
    if constexpr (sizeof(Out) == 2 && kBlockN >= epi::kLineElements)
      if (config.deferred_store)
        return launch<Element, Out, kBlockN, true>(p, config.split, config.persistent, timeline, stream);
    launch<Element, Out, kBlockN, false>(p, config.split, config.persistent, timeline, stream);
  };
  switch (config.block_n) {
    case 32:
      return launch_n.template operator()<32>();
    case 64:
      return launch_n.template operator()<64>();
    case 128:
      return launch_n.template operator()<128>();
    case 256:
      return launch_n.template operator()<256>();
  }
  throw Error(ErrorCode::invalid_argument, "sm90 tile: no kernel for block_n " + std::to_string(config.block_n));
}

}  // namespace
}  // namespace nmkit::gpu::tile
