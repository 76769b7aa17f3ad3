#pragma once
// The fused DFSS forward on Hopper. A CTA owns 128 queries of one (sequence, head): two consumer warpgroups of 64
// rows each and a producer warpgroup that streams Q once and K, V in steps of StepShape's keys through two stage
// rings (K released after Q*K^T, V after P*V, so the next K lands while P*V runs), all by TMA from one thread: 2:4 K
// with its keys permuted (PermutedKeys), except where a box cannot bound the keys (the step that holds the sequence's
// end) or the batch folds into no map dimension (KeyLoad::copies): there the producer's first warp copies them.
//
// Consumer step: S = Q*K^T on wgmma (f32 accumulators), the causal and length masks, the online softmax's row
// maxima (a group's largest score is always kept, so the maximum over kept scores is the maximum over valid ones),
// then per 32-key step the 2:4 prune in registers, exponentials of the kept scores only, and P*V on wgmma.sp with
// the compressed P as the register operand and its metadata built in registers. Software-pipelined: Q*K^T of step n
// and P*V of step n - 1 run together, and step n's softmax runs while P*V of step n - 1 finishes. The two consumer
// warpgroups take turns to issue their wgmma groups (a named-barrier pair), so that one's softmax runs under the
// other's GEMMs instead of both waiting on interleaved GEMMs at once; 2:4 at d = 128 issues without turns
// (Consumer::Turn). Pattern dense runs the same steps with every score kept and P*V on the dense wgmma: the control
// that isolates the gain of sparsity.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/convert.cuh"
#include "../common/named_barrier.cuh"
#include "../common/pipeline.cuh"
#include "../common/sm90.cuh"
#include "../ptx/cp_async.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "../ptx/wgmma_rs.cuh"
#include "../ptx/wgmma_ss.cuh"
#include "keep_two_of_four.cuh"
#include "keep_two_of_four_x2.cuh"

namespace nmkit::cuda::attention {

inline constexpr int kConsumers = 2;
inline constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
inline constexpr int kRowsPerConsumer = 64;  // wgmma's M
inline constexpr int kBlockM = kConsumers * kRowsPerConsumer;
inline constexpr int kChunkColumns = 64;  // head-dim columns per 128-byte swizzled row
inline constexpr int kRowBytes = 128;
inline constexpr int kSparseStepKeys = 32;  // wgmma.sp k32
inline constexpr int kDenseStepKeys = 16;   // wgmma k16
inline constexpr int kProducerRegisters = 40;
inline constexpr int kConsumerRegisters = 232;
static_assert(kConsumers == 2, "the consumers take turns in pairs (GemmTurns)");
using GemmTurns = Turns<NamedBarrier::gemm_turn>;
static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <= (kConsumers + 1) * launch_registers(kThreads),
              "setmaxnreg budgets must fit the registers allocated at launch");

// Keys per step and the depth of the K and V rings, by head dim. Shorter steps pay their fixed work (the stage and
// turn waits, each group's fence and wait, the fast path's vote) more often, longer ones lengthen the 2:4 softmax
// more than they save; a third stage lets K land ahead of the softmax at both head dims.
template <int kHeadDim>
struct StepShape {
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 3;
};

// 2:4 mode loads K with its keys permuted, so that the score accumulators of thread t of a quad hold whole 2:4
// groups: with H = kBlockN / 2 and B = kBlockN / 16, shared-memory row (= accumulator column) Hc + 8b + 2t + e holds
// key 16b + 4t + 2c + e (b < B, t < 4, c, e < 2). Thread t's accumulator blocks b and b + B then hold group 4b + t
// (keys 16b + 4t .. 16b + 4t + 3), and in 32-key step s its groups 8s + t and 8s + 4 + t (b = 2s, 2s + 1): exactly
// the sparse A fragment's groups, pruned without exchanging a score. Each half c of the tile is one TMA box of
// 2 x 4 x B tokens (token strides 1, 4, 16) from key 2c. P * V reads V in key order.
inline constexpr int kPairKeys = 2;    // e: keys side by side in a thread's accumulator pair
inline constexpr int kGroupKeys = 4;   // a 2:4 group; t steps by one group
inline constexpr int kBlockKeys = 16;  // b steps by one block: a group per pair t of a quad
template <int kBlockN>
struct PermutedKeys {
  static_assert(kBlockN % (2 * kBlockKeys) == 0, "whole 32-key steps");
  static constexpr int kGroupBlocks = kBlockN / kBlockKeys;  // b < kGroupBlocks: half a step
  static constexpr int kHalfRows = kBlockN / 2;
  __host__ __device__ static constexpr int key(int row) {
    const int c = row / kHalfRows, b = row % kHalfRows / 8, t = row % 8 / 2, e = row % 2;
    return kBlockKeys * b + kGroupKeys * t + kPairKeys * c + e;
  }
  // Thread t's score register of key `position` (0..3) of group 4b + t in row half r (0: row g, 1: g + 8).
  __host__ __device__ static constexpr int group_register(int b, int r, int position) {
    return 4 * (b + kGroupBlocks * (position / 2)) + 2 * r + position % 2;
  }
  // The layout's promises: row Hc + 8b + 2t + e holds key 16b + 4t + 2c + e (mask() spells this out with t < 4
  // known), and group_register(b, r, 2c + e) is the register of accumulator column 8(b + Bc) + 2t + e in row half r.
  static constexpr bool holds() {
    for (int c = 0; c < 2; ++c)
      for (int b = 0; b < kGroupBlocks; ++b)
        for (int t = 0; t < 4; ++t)
          for (int e = 0; e < 2; ++e) {
            const int row = kHalfRows * c + 8 * b + 2 * t + e;
            if (key(row) != 16 * b + 4 * t + 2 * c + e) return false;
            for (int r = 0; r < 2; ++r)
              if (group_register(b, r, 2 * c + e) != 4 * (b + kGroupBlocks * c) + 2 * r + e) return false;
          }
    return true;
  }
};
static_assert(PermutedKeys<StepShape<64>::kBlockN>::holds() && PermutedKeys<StepShape<128>::kBlockN>::holds());

// How the 2:4 producer loads a step of K: by TMA boxes, the tensor's batch folded into its heads or its tokens (the
// 5-D map has no dimension left for it), or, where the strides fold into neither, by copies.
enum class KeyLoad : int { copies = 0, boxes_batch_in_heads = 1, boxes_batch_in_tokens = 2 };

struct Params {
  const void* k;                     // 2:4: K read by the producer warp's copies (permuted_key)
  int64_t k_batch, k_head, k_token;  // element strides of K
  void* o;
  float* lse;
  const int32_t* cu_seqlens_q;  // null: fixed lengths
  const int32_t* cu_seqlens_k;
  int64_t o_batch, o_head, o_token;  // element strides of O
  int seq_q, seq_k;                  // fixed lengths
  int total_q;                       // variable lengths: the lse's row count per head
  int heads, kv_group;               // query heads; query heads per key/value head
  float scale;                       // softmax scale
  float scale_log2;                  // scale * log2(e): exponentials as exp2
  int causal;
  KeyLoad key_load;  // 2:4
  int kv_heads;      // K's heads (the batch-in-heads fold's stride)
};

// Shared memory: Q (128 rows), then the K and V rings; each tile as head_dim / 64 swizzled column chunks of
// [rows][64] (TMA's 128-byte boxes), then the barriers.
template <int kHeadDim>
struct SharedLayout {
  static constexpr int kBlockN = StepShape<kHeadDim>::kBlockN, kStages = StepShape<kHeadDim>::kStages;
  static constexpr int kChunks = kHeadDim / kChunkColumns;
  static constexpr int kQChunkBytes = kBlockM * kRowBytes;
  static constexpr int kKvChunkBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kChunks * kQChunkBytes;
  static constexpr int kKvBytes = kChunks * kKvChunkBytes;
  static constexpr int kKOffset = kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKvBytes;
  static constexpr int kBarrierOffset = kVOffset + kStages * kKvBytes;
  static constexpr int kPipelineBarrierBytes = StagePipeline<kStages>::kBarrierBytes;
  static constexpr int kBytes = kBarrierOffset + 8 + 2 * kPipelineBarrierBytes;
  static constexpr int kAlignment = 1024;  // the 128-byte swizzle's atom
  static constexpr int kAllocationBytes = kBytes + kAlignment;
};

template <class Element>
using MmaOf = std::conditional_t<std::is_same_v<Element, __half>, ptx::MmaF16, ptx::MmaBF16>;

// 2^x on the SFU (ex2.approx, flushing denormals): the exponentials of the online softmax.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Which (sequence, head, 128 queries) a CTA owns, and the ranges of rows and keys that exist there.
template <int kBlockN>
struct CtaWork {
  int batch, head, m_block;
  int q_begin, k_begin;  // first token of the sequence in the tensors' token dimension
  int len_q, len_k;      // the sequence's lengths
  int batch_coordinate;  // the tensor maps' batch coordinate (0 under variable lengths)
  int key_steps;         // kBlockN-key steps this CTA runs

  __device__ CtaWork(const Params& p) {
    // The heaviest causal blocks (the last queries) first.
    m_block = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
    head = static_cast<int>(blockIdx.y);
    batch = static_cast<int>(blockIdx.z);
    if (p.cu_seqlens_q != nullptr) {
      q_begin = p.cu_seqlens_q[batch];
      len_q = p.cu_seqlens_q[batch + 1] - q_begin;
      k_begin = p.cu_seqlens_k[batch];
      len_k = p.cu_seqlens_k[batch + 1] - k_begin;
      batch_coordinate = 0;
    } else {
      q_begin = k_begin = 0;
      len_q = p.seq_q, len_k = p.seq_k;
      batch_coordinate = batch;
    }
    const int keys = p.causal ? min(len_k, (m_block + 1) * kBlockM) : len_k;
    key_steps = keys > 0 ? (keys + kBlockN - 1) / kBlockN : 0;
  }
  __device__ bool empty() const { return m_block * kBlockM >= len_q; }
};

template <int kHeadDim>
struct SharedStorage {
  using L = SharedLayout<kHeadDim>;
  unsigned char* base;
  __device__ explicit SharedStorage(unsigned char* raw)
      : base(reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + L::kAlignment - 1) &
                                              ~uintptr_t{L::kAlignment - 1})) {}
  __device__ unsigned char* q() const { return base; }
  __device__ unsigned char* k(int stage) const { return base + L::kKOffset + stage * L::kKvBytes; }
  __device__ unsigned char* v(int stage) const { return base + L::kVOffset + stage * L::kKvBytes; }
  __device__ uint64_t* q_full() const { return reinterpret_cast<uint64_t*>(base + L::kBarrierOffset); }
  __device__ uint64_t* k_barriers() const { return q_full() + 1; }
  __device__ uint64_t* v_barriers() const { return k_barriers() + 2 * L::kStages; }
};

// The producer warpgroup; only its first warp works. One thread loads Q once and V of each step by TMA, and K the
// same way (dense: a plain box; 2:4: permuted_key's layout, as boxes of a 5-D map). The step that holds the
// sequence's end (2:4) is copied by the warp's 16-byte copies instead, zero-filled past the end, since the 5-D
// map cannot bound a key by the sequence's length; so is every step where the batch folds into no map dimension
// (KeyLoad::copies), each waited for before the step is posted.
template <int kHeadDim, bool kPermuteKeys>
struct Producer {
  using L = SharedLayout<kHeadDim>;
  static constexpr int kBlockN = L::kBlockN, kStages = L::kStages;
  using Keys = PermutedKeys<kBlockN>;
  using Work = CtaWork<kBlockN>;
  static constexpr int kCopyBytes = 16;
  static constexpr int kCopiesPerRow = kHeadDim * 2 / kCopyBytes;
  const SharedStorage<kHeadDim>& smem;
  const StagePipeline<kStages>& k_pipe;
  const StagePipeline<kStages>& v_pipe;
  int lane;  // in the producer's working warp

  __device__ void load_tile(unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int row, int head, int batch,
                            int chunk_bytes) const {
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c)
      ptx::tma_load_4d(dst + c * chunk_bytes, map, bar, c * kChunkColumns, row, head, batch);
  }

  // K of a step whose keys all exist, permuted: each half c of the tile is one box of the 5-D map (head dim, token,
  // 4-token step, 16-token step, head), whose rows e + 2t + 8b hold tokens first + 2c + e + 4t + 16b.
  __device__ void load_permuted_keys(unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int first_token,
                                     int head) const {
#pragma unroll
    for (int chunk = 0; chunk < L::kChunks; ++chunk)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        ptx::tma_load_5d(dst + chunk * L::kKvChunkBytes + c * Keys::kHalfRows * kRowBytes, map, bar,
                         chunk * kChunkColumns, first_token + Keys::key(c * Keys::kHalfRows), 0, 0, head);
  }

  // K of a step by copies (the step that holds the sequence's end, or any step under KeyLoad::copies), row r of
  // the tile holding key Keys::key(r), in TMA's 128-byte swizzle (16-byte chunk j of row r lands at chunk
  // j ^ (r % 8)). A lane copies one 16-byte column of every kRowsPerPass-th row from its first_row < kRowsPerPass:
  // first_row only sets bits below kRowsPerPass, inside a row's 8-row block (e and t), which kRowsPerPass * i never
  // carries into, so row first_row + kRowsPerPass * i holds key Keys::key(first_row) + Keys::key(kRowsPerPass * i).
  __device__ void copy_permuted_keys(unsigned char* dst, const Params& p, const Work& work, int kv_head,
                                     int step) const {
    constexpr int kRowsPerPass = 32 / kCopiesPerRow;
    static_assert(kRowsPerPass >= 1 && (kRowsPerPass & (kRowsPerPass - 1)) == 0,
                  "a power of two: a lane's rows differ from its first only in the bits above it");
    static_assert(kRowsPerPass <= 8 && Keys::kHalfRows % 8 == 0, "first_row stays inside an 8-row block");
    const int first_row = lane / kCopiesPerRow, column = lane % kCopiesPerRow;
    const int64_t token_bytes = 2 * p.k_token;
    const auto* base = static_cast<const unsigned char*>(p.k) + column * kCopyBytes +
                       2 * (static_cast<int64_t>(work.batch) * (p.cu_seqlens_k ? 0 : p.k_batch) + kv_head * p.k_head);
    const int first_key = step * kBlockN + Keys::key(first_row);
    const auto* first = base + (work.k_begin + first_key) * token_bytes;
    const uint32_t at = ptx::smem_address(dst) + column / 8 * L::kKvChunkBytes;
    // Rolled in part: the producer has few registers (kProducerRegisters).
#pragma unroll 4
    for (int i = 0; i < kBlockN / kRowsPerPass; ++i) {
      const int row = first_row + kRowsPerPass * i, offset = Keys::key(kRowsPerPass * i);
      const bool valid = first_key + offset < work.len_k;
      ptx::cp_async_16(at + row * kRowBytes + (column % 8 ^ row % 8) * kCopyBytes,
                       valid ? first + offset * token_bytes : base, valid ? kCopyBytes : 0);
    }
  }

  __device__ void run(const Work& work, const Params& p, const CUtensorMap* q_map, const CUtensorMap* k_map,
                      const CUtensorMap* v_map) const {
    const bool leader = lane == 0;
    if (!kPermuteKeys && !leader) return;
    if (leader) {
      ptx::mbarrier_arrive_expect_tx(smem.q_full(), L::kQBytes);
      load_tile(smem.q(), q_map, smem.q_full(), work.q_begin + work.m_block * kBlockM, work.head, work.batch_coordinate,
                L::kQChunkBytes);
    }
    const int kv_head = work.head / p.kv_group;
    ProducerRing<kStages> k_ring, v_ring;
    for (int step = 0; step < work.key_steps; ++step) {
      const int row = work.k_begin + step * kBlockN;
      if (kPermuteKeys && (p.key_load == KeyLoad::copies || (step + 1) * kBlockN > work.len_k)) {
        // The warp's copies, once the stage is free; then the leader posts them as landed.
        if (leader) k_ring.acquire(k_pipe);
        __syncwarp();
        copy_permuted_keys(smem.k(k_ring.at.stage), p, work, kv_head, step);
        ptx::cp_async_commit();  // wait_group waits for committed groups only
        ptx::cp_async_wait<0>();
        __syncwarp();
        if (leader) k_pipe.post(k_ring.at.stage);
      } else if (leader) {
        k_ring.acquire(k_pipe);
        k_pipe.expect_bytes(k_ring.at.stage, L::kKvBytes);
        if constexpr (kPermuteKeys) {
          const bool in_heads = p.key_load == KeyLoad::boxes_batch_in_heads;
          const int fold = p.cu_seqlens_k ? 0 : work.batch;
          load_permuted_keys(smem.k(k_ring.at.stage), k_map, k_pipe.full(k_ring.at.stage),
                             row + (in_heads ? 0 : fold * p.seq_k), kv_head + (in_heads ? fold * p.kv_heads : 0));
        } else
          load_tile(smem.k(k_ring.at.stage), k_map, k_pipe.full(k_ring.at.stage), row, kv_head, work.batch_coordinate,
                    L::kKvChunkBytes);
      }
      k_ring.advance();
      if (!leader) continue;
      v_ring.acquire(v_pipe);
      v_pipe.expect_bytes(v_ring.at.stage, L::kKvBytes);
      load_tile(smem.v(v_ring.at.stage), v_map, v_pipe.full(v_ring.at.stage), row, kv_head, work.batch_coordinate,
                L::kKvChunkBytes);
      v_ring.advance();
    }
  }
};

template <class Element, int kHeadDim, bool kSparse>
struct Consumer {
  // 2:4 at d = 128 issues without taking turns: its shorter P * V leaves the other warpgroup's GEMMs too little
  // time to cover a softmax, so the turns only add their waits.
  using Turn = std::conditional_t<kSparse && kHeadDim == 128, NoTurns, GemmTurns>;
  using L = SharedLayout<kHeadDim>;
  static constexpr int kBlockN = L::kBlockN, kStages = L::kStages;
  using Keys = PermutedKeys<kBlockN>;
  using Work = CtaWork<kBlockN>;
  using Mma = MmaOf<Element>;
  static constexpr int kScoreRegisters = kBlockN / 2;  // the 64 x kBlockN score tile
  static constexpr int kOutRegisters = kHeadDim / 2;
  static constexpr int kStepKeys = kSparse ? kSparseStepKeys : kDenseStepKeys;
  static constexpr int kPSteps = kBlockN / kStepKeys;
  // P of one key step as wgmma's register operand: per step four registers and (2:4) the metadata register.
  struct PFragments {
    uint32_t a[kPSteps][4];
    uint32_t e[kSparse ? kPSteps : 1];
  };
  // A step's metadata register as two halves, OR-ed into P's registers only after the wait: with a plain copy ptxas
  // gives both the same register, which the P * V in flight still reads, and serialises every wgmma (C7511).
  static constexpr int kMetaWords = kSparse ? 2 * kPSteps : 1;
  // The probabilities P is written from, beside the scores (which the next Q * K^T overwrites): 2:4 keeps half of
  // them, two per group, in the k32 fragment's register order; dense keeps all, in the accumulator's order.
  static constexpr int kProbRegisters = kSparse ? kScoreRegisters / 2 : kScoreRegisters;

  const SharedStorage<kHeadDim>& smem;
  const StagePipeline<kStages>& k_pipe;
  const StagePipeline<kStages>& v_pipe;
  int warpgroup, warp, lane, g, t;  // t = lane % 4: the column pair; g = lane / 4: the row
  float o[kOutRegisters];
  float row_max[2];  // raw (unscaled) scores; rows g and g + 8 of this warp's 16
  float row_sum[2];  // this thread's share of the kept exponentials

  __device__ Consumer(const SharedStorage<kHeadDim>& s, const StagePipeline<kStages>& kp,
                      const StagePipeline<kStages>& vp, int tid)
      : smem(s), k_pipe(kp), v_pipe(vp) {
    warpgroup = tid / kWarpgroupThreads;
    warp = tid % kWarpgroupThreads / 32;
    lane = tid % 32;
    g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < kOutRegisters; ++i) o[i] = 0.0f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
  }

  // The query index of this thread's row r (0: g, 1: g + 8) within the sequence.
  __device__ int query(const Work& w, int r) const {
    return w.m_block * kBlockM + warpgroup * kRowsPerConsumer + warp * 16 + g + 8 * r;
  }

  // Issues S = Q * K^T of the stage as one wgmma group; the caller waits for it. Every input of the group is
  // written before its first wgmma: registers defined between them make ptxas serialise the kernel's wgmma.
  __device__ void issue_scores(float (&s)[kScoreRegisters], int stage) const {
    // 2:4 K of a copied step (the sequence's end, or KeyLoad::copies) was written by cp.async, through the generic
    // proxy: order those writes before wgmma's reads.
    if constexpr (kSparse) ptx::fence_proxy_async_shared();
    constexpr int kSteps = kHeadDim / 16, kStepsPerChunk = kChunkColumns / 16, kStepBytes = 32;
    const uint32_t q_base = ptx::smem_address(smem.q()) + warpgroup * kRowsPerConsumer * kRowBytes;
    const uint32_t k_base = ptx::smem_address(smem.k(stage));
    uint64_t q_desc[kSteps], k_desc[kSteps];
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const int chunk = kk / kStepsPerChunk, within = kk % kStepsPerChunk * kStepBytes;
      q_desc[kk] = ptx::make_smem_desc_k_major_sw128(q_base + chunk * L::kQChunkBytes + within);
      k_desc[kk] = ptx::make_smem_desc_k_major_sw128(k_base + chunk * L::kKvChunkBytes + within);
    }
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) ptx::WgmmaSS<kBlockN, Mma>::mma(s, q_desc[kk], k_desc[kk], kk > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
  }

  // The descriptors of a V stage's key steps, made before any wgmma group is in flight: registers defined while a
  // group runs would make ptxas serialise every wgmma of the kernel.
  __device__ void v_descriptors(int stage, uint64_t (&desc)[kPSteps]) const {
    const uint32_t v_base = ptx::smem_address(smem.v(stage));
#pragma unroll
    for (int c = 0; c < kPSteps; ++c)
      desc[c] = ptx::make_smem_desc_mn_major_sw128(v_base + c * kStepKeys * kRowBytes, L::kKvChunkBytes, 8 * kRowBytes);
  }

  // Issues O += P * V of the stage as one wgmma group: sparse k32 steps or dense k16 steps.
  __device__ void issue_pv(const PFragments& pf, const uint64_t (&v_desc)[kPSteps]) {
    ptx::wgmma_fence();
#pragma unroll
    for (int c = 0; c < kPSteps; ++c) {
      if constexpr (kSparse)
        ptx::WgmmaSpRS<kHeadDim, Mma>::template mma<1>(o, pf.a[c], v_desc[c], pf.e[c], 1);
      else
        ptx::WgmmaRS<kHeadDim, Mma>::template mma<1>(o, pf.a[c], v_desc[c], 1);
    }
    ptx::wgmma_commit_group();
  }

  // After a wait: the accumulators' new values are read from here on, and P's registers, which the wgmma read
  // asynchronously, were live until here (so no later value took their place early).
  __device__ void fence_p(PFragments& pf) {
#pragma unroll
    for (int c = 0; c < kPSteps; ++c) ptx::fence_registers(pf.a[c]);
    if constexpr (kSparse) ptx::fence_registers(pf.e);
  }

  // Scores of masked keys (past the sequence, or after the query under causal) become -inf.
  __device__ void mask(float (&s)[kScoreRegisters], const Work& w, int step, bool causal) const {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // Column 8j + 2t + e holds key 8j + 2t + e, or Keys::key() of it (2:4), spelled out with t < 4 known.
          const int key = step * kBlockN + (kSparse ? kBlockKeys * (j % Keys::kGroupBlocks) + kGroupKeys * t +
                                                          kPairKeys * (j / Keys::kGroupBlocks) + e
                                                    : 8 * j + 2 * t + e);
          if (key >= w.len_k || (causal && key > query(w, r))) s[4 * j + 2 * r + e] = -INFINITY;
        }
  }

  // Each row keeps its reference maximum until a score exceeds it by more than 2^kRescaleLog2 after the exp2: the
  // probabilities then stay below 2^4 (well inside f16 and bf16), and O, the row sums and the lse all use the same
  // reference, so the result is the same while most steps leave O alone. The bound also keeps the fast 2:4 path's
  // f16 y of the largest probabilities within 4 of 0, where f16 resolves them finely (packed_probabilities). The row
  // sums move to a new reference now, O (still being summed) later by `correction`. Returns whether a row of this
  // thread moved; max_scaled receives the scaled references to subtract.
  static constexpr float kRescaleLog2 = 4.0f;
  __device__ bool update_max(const float (&s)[kScoreRegisters], float scale_log2, float (&max_scaled)[2],
                             float (&correction)[2]) {
    bool moved = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      // From -inf (nothing valid yet) any finite maximum moves the row, its correction exp2(-inf) = 0 (O and the sum
      // are still 0); -inf to -inf is NaN > threshold, false: the row keeps -inf and 0 as the value to subtract.
      const bool move = (m - row_max[r]) * scale_log2 > kRescaleLog2;
      correction[r] = move ? exp2_approx((row_max[r] - m) * scale_log2) : 1.0f;
      if (move) row_max[r] = m;
      max_scaled[r] = row_max[r] == -INFINITY ? 0.0f : row_max[r] * scale_log2;
      row_sum[r] *= correction[r];
      moved |= move;
    }
    return moved;
  }

  __device__ void rescale_o(const float (&correction)[2]) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) o[4 * j + 2 * r] *= correction[r], o[4 * j + 2 * r + 1] *= correction[r];
  }

  // This step's probabilities (prob) and 2:4 metadata (meta), while P * V of the step before still runs: masks,
  // maxima, the prune and the exponentials of the kept scores. Nothing here writes P's registers, which that P * V
  // reads until it completes; write_p packs them after the wait.
  __device__ bool prepare_p(float (&s)[kScoreRegisters], const Work& w, int step, const Params& p,
                            float (&prob)[kProbRegisters], uint32_t (&meta)[kMetaWords], float (&correction)[2]) {
    const int step_end = (step + 1) * kBlockN;
    const int first_row = w.m_block * kBlockM + warpgroup * kRowsPerConsumer;
    // Each path (masked, fast, exact) runs the whole step, so that no branch joins between the two waits: at a join
    // ptxas no longer knows which wgmma groups are done and waits for all of them before the first score is read,
    // which would hold this step's softmax until P * V of the step before has finished.
    if (step_end > w.len_k || (p.causal && step_end - 1 > first_row)) {
      mask(s, w, step, p.causal);
      return probabilities(s, p, prob, meta, correction);
    }
    if constexpr (kSparse) {
      if (packed_probabilities(s, p.scale_log2, prob, meta)) {
        correction[0] = correction[1] = 1.0f;
        return false;
      }
    }
    return probabilities(s, p, prob, meta, correction);
  }

  // The fast path of an unmasked 2:4 step: the rule on two rows at once in f16 (keep_two_of_four_x2), on
  // y = s * scale_log2 - reference, then the exponentials of the kept y. It keeps every row's reference, so it
  // gives up (returns false, having counted nothing) when a row of the warp has none yet or a score passes it by
  // more than 2^kRescaleLog2; the exact path then runs the step. Scores whose y round to the same f16 (at most one
  // ulp, 2^-10 of |y|, apart) count as tied (the lower key wins), and rounding moves a kept probability by at most
  // |y| * 2^-11 * ln 2: 0.14 % for those within 2^4 of the reference either way (the rest weigh less than 1/16 of
  // the largest), below bf16's rounding of P, above f16's.
  __device__ bool packed_probabilities(const float (&s)[kScoreRegisters], float scale_log2,
                                       float (&prob)[kProbRegisters], uint32_t (&meta)[kMetaWords]) {
    if (!__all_sync(0xffffffffu, row_max[0] != -INFINITY && row_max[1] != -INFINITY)) return false;
    const float reference[2] = {row_max[0] * scale_log2, row_max[1] * scale_log2};
    __half2 largest = __float2half2_rn(-INFINITY);  // lane r: row r's largest y
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < kPSteps; ++c)
      packed_prune_step(s, c, reference, scale_log2, prob, meta[2 * c], meta[2 * c + 1], sums, largest);
    largest = __hmax2(largest, __shfl_xor_sync(0xffffffffu, largest, 1));
    largest = __hmax2(largest, __shfl_xor_sync(0xffffffffu, largest, 2));
    if (__any_sync(0xffffffffu, __hgt2_mask(largest, __float2half2_rn(kRescaleLog2)) != 0)) return false;
    row_sum[0] += sums[0];
    row_sum[1] += sums[1];
    return true;
  }

  // prune_step's groups, both rows of a group position in the two lanes of the packed rule.
  __device__ void packed_prune_step(const float (&s)[kScoreRegisters], int c, const float (&reference)[2],
                                    float scale_log2, float (&prob)[kProbRegisters], uint32_t& own, uint32_t& partner,
                                    float (&sums)[2], __half2& largest) {
    uint32_t words[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int b = 2 * c + half;
      const auto y = [&](int position, int r) {
        return fmaf(s[Keys::group_register(b, r, position)], scale_log2, -reference[r]);
      };
      const KeptPairs kept =
          keep_two_of_four_x2(__floats2half2_rn(y(0, 0), y(0, 1)), __floats2half2_rn(y(1, 0), y(1, 1)),
                              __floats2half2_rn(y(2, 0), y(2, 1)), __floats2half2_rn(y(3, 0), y(3, 1)));
      largest = __hmax2(largest, half2_of(kept.largest));
      const float2 first = __half22float2(half2_of(kept.first)), second = __half22float2(half2_of(kept.second));
      const int k = 4 * (2 * c + half);  // row r's pair at k + 2r: the k32 fragment's register order
      prob[k] = exp2_approx(first.x);
      prob[k + 1] = exp2_approx(second.x);
      prob[k + 2] = exp2_approx(first.y);
      prob[k + 3] = exp2_approx(second.y);
      sums[0] += prob[k] + prob[k + 1];
      sums[1] += prob[k + 2] + prob[k + 3];
      words[half] = kept.nibbles;  // row r's nibble at bit 16 r, as prune_step builds it
    }
    gather_metadata(words, own, partner);
  }

  __device__ bool probabilities(const float (&s)[kScoreRegisters], const Params& p, float (&prob)[kProbRegisters],
                                uint32_t (&meta)[kMetaWords], float (&correction)[2]) {
    float max_scaled[2];
    const bool moved = update_max(s, p.scale_log2, max_scaled, correction);
    if constexpr (kSparse) {
#pragma unroll
      for (int c = 0; c < kPSteps; ++c) prune_step(s, c, max_scaled, p.scale_log2, prob, meta[2 * c], meta[2 * c + 1]);
    } else {
#pragma unroll
      for (int i = 0; i < kScoreRegisters; ++i) {
        const int r = i / 2 % 2;  // register 4j + 2r + e holds row g + 8r
        prob[i] = exp2_approx(fmaf(s[i], p.scale_log2, -max_scaled[r]));
        row_sum[r] += prob[i];
      }
    }
    return moved;
  }

  // 2:4 of one 32-key step c. With K permuted (permuted_key), thread t holds groups t (accumulator blocks 2c,
  // 2c + 8) and 4 + t (blocks 2c + 1, 2c + 9) of rows g and g + 8: the sparse A fragment's own groups, so each
  // group's two kept probabilities are one register of the fragment. The metadata, one nibble per group and row at
  // lanes t = 0 (groups 0-3) and t = 1 (groups 4-7) of the quad, is gathered in three shuffles (the last half's
  // OR left to write_p).
  __device__ void prune_step(const float (&s)[kScoreRegisters], int c, const float (&max_scaled)[2], float scale_log2,
                             float (&prob)[kProbRegisters], uint32_t& own, uint32_t& partner) {
    uint32_t words[2] = {0, 0};  // groups 0-3, groups 4-7
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int b = 2 * c + half;
        const KeptPair kept = keep_two_of_four(s[Keys::group_register(b, r, 0)], s[Keys::group_register(b, r, 1)],
                                               s[Keys::group_register(b, r, 2)], s[Keys::group_register(b, r, 3)]);
        const int k = 4 * (2 * c + half) + 2 * r;  // the pair's place in prob: the k32 fragment's register order
        prob[k] = exp2_approx(fmaf(kept.first, scale_log2, -max_scaled[r]));
        prob[k + 1] = exp2_approx(fmaf(kept.second, scale_log2, -max_scaled[r]));
        row_sum[r] += prob[k] + prob[k + 1];
        words[half] |= kept.nibble << (16 * r);
      }
    gather_metadata(words, own, partner);
  }

  // A 32-key step's metadata from each thread's nibbles (words[half]: groups t and 4 + t, row r's at bit 16 r):
  // group t's nibbles to their place in the word, lanes t and t ^ 2 combine, then lane 0 takes the odd lanes'
  // groups 0-3 and lane 1 the even lanes' 4-7.
  __device__ void gather_metadata(uint32_t (&words)[2], uint32_t& own, uint32_t& partner) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      words[half] <<= 4 * t;
      words[half] |= __shfl_xor_sync(0xffffffffu, words[half], 2);
    }
    const int odd = t & 1;
    own = odd ? words[1] : words[0];
    partner = __shfl_xor_sync(0xffffffffu, odd ? words[0] : words[1], 1);
  }

  // P as wgmma's register operand, two probabilities per register: dense, the k16 A fragment is the accumulator's
  // own layout; 2:4, the sparse k32 fragment prune_step ordered prob in, and its metadata.
  __device__ void write_p(const float (&prob)[kProbRegisters], const uint32_t (&meta)[kMetaWords], PFragments& pf) {
#pragma unroll
    for (int c = 0; c < kPSteps; ++c)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int k = 4 * (2 * c + half) + 2 * r;
          pf.a[c][2 * half + r] = pack_pair<Element>(prob[k], prob[k + 1]);
        }
    if constexpr (kSparse)
#pragma unroll
      for (int c = 0; c < kPSteps; ++c) pf.e[c] = meta[2 * c] | meta[2 * c + 1];
  }

  __device__ void release(const StagePipeline<kStages>& pipe, int stage) const {
    __syncwarp();
    if (lane == 0) pipe.release(stage);
  }

  // One pipelined key step: Q * K^T of `step` and P * V of step - 1 (from pf) in flight together. The warps wait
  // for the scores only and compute this step's probabilities while P * V runs, then, once it is done, rescale O
  // and write the new P into pf.
  __device__ void pipelined_step(int step, const Work& w, const Params& p, RingPosition<kStages>& k_at,
                                 RingPosition<kStages>& v_at, float (&s)[kScoreRegisters], PFragments& pf) {
    uint64_t v_desc[kPSteps];
    v_descriptors(v_at.stage, v_desc);
    k_pipe.wait_full(k_at);
    Turn::wait(warpgroup);
    issue_scores(s, k_at.stage);
    v_pipe.wait_full(v_at);
    issue_pv(pf, v_desc);
    Turn::pass(warpgroup);
    ptx::wgmma_wait_group<1>();
    ptx::fence_registers(s);
    release(k_pipe, k_at.stage);
    k_at.advance();
    float correction[2];
    float prob[kProbRegisters];
    uint32_t meta[kMetaWords];
    const bool moved = prepare_p(s, w, step, p, prob, meta, correction);
    ptx::wgmma_wait_group<0>();
    ptx::fence_registers(o);
    fence_p(pf);
    release(v_pipe, v_at.stage);
    v_at.advance();
    if (__any_sync(0xffffffffu, moved)) rescale_o(correction);  // rows that kept their reference have correction 1
    ptx::fence_registers(o);
    write_p(prob, meta, pf);
  }

  // The turns: each warpgroup issues key_steps + 1 times (the first Q * K^T, the pipelined steps, the last P * V).
  __device__ void run(const Work& w, const Params& p) {
    ptx::mbarrier_wait(smem.q_full(), 0);
    if (w.key_steps == 0) return store(w, p);
    RingPosition<kStages> k_at, v_at;
    float s[kScoreRegisters];
    PFragments pf;

    Turn::start(warpgroup);
    k_pipe.wait_full(k_at);
    Turn::wait(warpgroup);
    issue_scores(s, k_at.stage);
    Turn::pass(warpgroup);
    ptx::wgmma_wait_group<0>();
    ptx::fence_registers(s);
    release(k_pipe, k_at.stage);
    k_at.advance();
    float correction[2];
    float prob[kProbRegisters];
    uint32_t meta[kMetaWords];
    prepare_p(s, w, 0, p, prob, meta, correction);  // O is still zero: nothing to rescale
    write_p(prob, meta, pf);
    for (int step = 1; step < w.key_steps; ++step) pipelined_step(step, w, p, k_at, v_at, s, pf);
    last_pv(v_at, pf);
    Turn::finish(warpgroup);
    store(w, p);
  }

  __device__ void last_pv(const RingPosition<kStages>& v_at, PFragments& pf) {
    uint64_t v_desc[kPSteps];
    v_descriptors(v_at.stage, v_desc);
    v_pipe.wait_full(v_at);
    Turn::wait(warpgroup);
    issue_pv(pf, v_desc);
    Turn::pass(warpgroup);
    ptx::wgmma_wait_group<0>();
    ptx::fence_registers(o);
    fence_p(pf);
    release(v_pipe, v_at.stage);
  }

  __device__ void store(const Work& w, const Params& p) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int q = query(w, r);
      if (q >= w.len_q) continue;
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      Element* row = static_cast<Element*>(p.o) + w.batch * (p.cu_seqlens_q ? 0 : p.o_batch) + w.head * p.o_head +
                     static_cast<int64_t>(w.q_begin + q) * p.o_token;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        *reinterpret_cast<uint32_t*>(row + 8 * j + 2 * t) =
            pack_pair<Element>(o[4 * j + 2 * r] * inverse, o[4 * j + 2 * r + 1] * inverse);
      if (p.lse != nullptr && t == 0) {
        const float lse = sum > 0.0f ? row_max[r] * p.scale + logf(sum) : -INFINITY;
        const int64_t index = p.cu_seqlens_q ? static_cast<int64_t>(w.head) * p.total_q + w.q_begin + q
                                             : (static_cast<int64_t>(w.batch) * p.heads + w.head) * p.seq_q + q;
        p.lse[index] = lse;
      }
    }
  }
};

// k_map: dense, a 4-D map like Q's and V's; 2:4, the 5-D map of load_permuted_keys (unused under KeyLoad::copies).
template <class Element, int kHeadDim, bool kSparse>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_dfss_kernel(const Params p, const __grid_constant__ CUtensorMap q_map,
                     const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  using L = SharedLayout<kHeadDim>;
  const CtaWork<L::kBlockN> work(p);
  if (work.empty()) return;
  const SharedStorage<kHeadDim> smem(smem_raw);
  const StagePipeline<L::kStages> k_pipe(smem.k_barriers()), v_pipe(smem.v_barriers());
  const int tid = static_cast<int>(threadIdx.x), warpgroup = tid / kWarpgroupThreads;
  constexpr uint32_t kReleasingWarps = kConsumers * kWarpgroupThreads / 32;
  if (tid == 0) {
    ptx::prefetch_tensor_map(&q_map);
    ptx::prefetch_tensor_map(&k_map);
    ptx::prefetch_tensor_map(&v_map);
    ptx::mbarrier_init(smem.q_full(), 1);
    k_pipe.init(1, kReleasingWarps);
    v_pipe.init(1, kReleasingWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == kConsumers) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (tid % kWarpgroupThreads < 32)
      Producer<kHeadDim, kSparse>{smem, k_pipe, v_pipe, tid % 32}.run(work, p, &q_map, &k_map, &v_map);
    return;
  }
  ptx::setmaxnreg_inc<kConsumerRegisters>();
  Consumer<Element, kHeadDim, kSparse> consumer(smem, k_pipe, v_pipe, tid);
  consumer.run(work, p);
#endif
}

}  // namespace nmkit::cuda::attention
