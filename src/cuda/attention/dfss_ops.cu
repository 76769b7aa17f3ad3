// The unfused DFSS ops (include/nmkit/attention/dfss_ops_gpu.hpp): scores pruned to 2:4 into the nm24 packed layout,
// and the softmax over a packed row's kept scores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "../common/check.cuh"
#include "../common/convert.cuh"
#include "keep_two_of_four.cuh"
#include "nmkit/attention/dfss_ops_gpu.hpp"
#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_layout.hpp"

namespace nmkit::gpu {
namespace {

using cuda::attention::keep_two_of_four;
using cuda::attention::KeptPair;

constexpr int kGroupKeys = 4;
constexpr int kGroupsPerHalf = 4;                                  // groups of one metadata half-word pair (16 keys)
constexpr int kHalves = kFragmentK / kGroupKeys / kGroupsPerHalf;  // 2: lanes 4g + {0, 2} and 4g + {1, 3}
constexpr uint32_t kPaddingNibble = 0u | (1u << 2);                // positions 0 and 1, ordered, as pack_nm24's padding
constexpr int kThreadsPerBlock = 256;

template <class T>
__device__ __forceinline__ float load_score(const T* s, int64_t i) {
  if constexpr (std::is_same_v<T, float>)
    return s[i];
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(s[i]);
  else
    return __bfloat162float(s[i]);
}

template <class Element>
__device__ __forceinline__ float unpack_value(uint32_t word, int half) {
  const uint16_t bits = static_cast<uint16_t>(word >> (16 * half));
  if constexpr (std::is_same_v<Element, __half>)
    return __half2float(__ushort_as_half(bits));
  else
    return __bfloat162float(__ushort_as_bfloat16(bits));
}

// One thread per metadata word of a 16 x 32 fragment (slab, kblock): rows g and g + 8 of the slab, the four groups
// of half h of the k-block. It writes those 8 groups' value words and the metadata word of lane 4g + h.
template <class Score, class Element>
__global__ void prune_scores_kernel(const Score* __restrict__ s, int64_t rows, int64_t cols, int64_t ld, float scale,
                                    bool causal, int64_t kblocks, int64_t fragments, uint32_t* __restrict__ values,
                                    uint32_t* __restrict__ metadata) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= fragments * kSlabRows) return;
  const int half = static_cast<int>(id % kHalves), g = static_cast<int>(id / kHalves % 8);
  const int64_t fragment = id / (kHalves * 8), kblock = fragment % kblocks, slab = fragment / kblocks;
  uint32_t meta = 0;
#pragma unroll
  for (int upper = 0; upper < 2; ++upper) {
    const int64_t row = slab * kSlabRows + g + 8 * upper;
#pragma unroll
    for (int q = 0; q < kGroupsPerHalf; ++q) {
      const int64_t first_key = kblock * kFragmentK + (half * kGroupsPerHalf + q) * kGroupKeys;
      uint32_t word = 0, nibble = kPaddingNibble;
      if (row < rows) {
        float x[kGroupKeys];
#pragma unroll
        for (int e = 0; e < kGroupKeys; ++e) {
          const int64_t key = first_key + e;
          x[e] = key < cols && !(causal && key > row) ? scale * load_score(s, row * ld + key) : -INFINITY;
        }
        const KeptPair kept = keep_two_of_four(x[0], x[1], x[2], x[3]);
        word = cuda::pack_pair<Element>(kept.first, kept.second);
        nibble = kept.nibble;
      }
      values[packed_value_word(slab, kblock, kblocks, 4 * g + q, upper + 2 * half)] = word;
      meta |= nibble << (16 * upper + 4 * q);
    }
  }
  metadata[packed_meta_word(slab, kblock, kblocks, 4 * g + half)] = meta;
}

// One warp per row: its kept scores are 8 words per k-block (lanes 4g + q, registers upper + 2h); lane l takes
// k-blocks l, l + 32, ... The row is read three times (max, sum, write), from L2.
template <class Element>
__global__ void softmax_rows_kernel(uint32_t* __restrict__ values, int64_t rows, int64_t kblocks, float* lse) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  if (row >= rows) return;
  const int64_t slab = row / kSlabRows;
  const int g = static_cast<int>(row % 8), upper = static_cast<int>(row % kSlabRows / 8);
  const auto word_at = [&](int64_t kblock, int h, int q) -> uint32_t& {
    return values[packed_value_word(slab, kblock, kblocks, 4 * g + q, upper + 2 * h)];
  };
  float m = -INFINITY;
  for (int64_t kb = lane; kb < kblocks; kb += kLanes)
    for (int h = 0; h < kHalves; ++h)
      for (int q = 0; q < kGroupsPerHalf; ++q) {
        const uint32_t w = word_at(kb, h, q);
        m = fmaxf(m, fmaxf(unpack_value<Element>(w, 0), unpack_value<Element>(w, 1)));
      }
  for (int offset = kLanes / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  const float ref = m == -INFINITY ? 0.0f : m;  // a row with nothing valid: every exp is 0, not NaN
  float sum = 0.0f;
  for (int64_t kb = lane; kb < kblocks; kb += kLanes)
    for (int h = 0; h < kHalves; ++h)
      for (int q = 0; q < kGroupsPerHalf; ++q) {
        const uint32_t w = word_at(kb, h, q);
        sum += __expf(unpack_value<Element>(w, 0) - ref) + __expf(unpack_value<Element>(w, 1) - ref);
      }
  for (int offset = kLanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int64_t kb = lane; kb < kblocks; kb += kLanes)
    for (int h = 0; h < kHalves; ++h)
      for (int q = 0; q < kGroupsPerHalf; ++q) {
        uint32_t& w = word_at(kb, h, q);
        w = cuda::pack_pair<Element>(__expf(unpack_value<Element>(w, 0) - ref) * inv,
                                     __expf(unpack_value<Element>(w, 1) - ref) * inv);
      }
  if (lse != nullptr && lane == 0) lse[row] = sum > 0.0f ? ref + logf(sum) : -INFINITY;
}

unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

}  // namespace

void prune_scores_nm24(Stream stream, const ScoresView& v, DeviceNm24& p) {
  const int64_t ld = v.ld == 0 ? v.cols : v.ld;
  require(v.scores != nullptr || v.rows == 0 || v.cols == 0, ErrorCode::invalid_argument,
          "prune_scores_nm24: scores must not be null");
  require(v.rows == p.rows() && v.cols == p.cols(), ErrorCode::invalid_argument, [&] {
    return "prune_scores_nm24: scores are " + std::to_string(v.rows) + "x" + std::to_string(v.cols) + ", P holds " +
           std::to_string(p.rows()) + "x" + std::to_string(p.cols());
  });
  require(ld >= v.cols, ErrorCode::invalid_argument, [&] {
    return "prune_scores_nm24: ld " + std::to_string(ld) + " is less than cols " + std::to_string(v.cols);
  });
  require(p.dtype() == DType::f16 || p.dtype() == DType::bf16, ErrorCode::unsupported,
          [&] { return std::string("prune_scores_nm24: P holds f16 or bf16, not ") + dtype_name(p.dtype()); });
  const int64_t kblocks = p.cols_padded() / kFragmentK, fragments = p.rows_padded() / kSlabRows * kblocks;
  auto* values = static_cast<uint32_t*>(p.values());
  auto* metadata = static_cast<uint32_t*>(p.metadata());
  const auto launch = [&]<class Score, class Element>() {
    prune_scores_kernel<Score, Element><<<blocks_for(fragments * kSlabRows), kThreadsPerBlock, 0, stream>>>(
        static_cast<const Score*>(v.scores), v.rows, v.cols, ld, v.scale, v.causal, kblocks, fragments, values,
        metadata);
  };
  const auto with_score = [&]<class Element>() {
    switch (v.dtype) {
      case DType::f32:
        return launch.template operator()<float, Element>();
      case DType::f16:
        return launch.template operator()<__half, Element>();
      case DType::bf16:
        return launch.template operator()<__nv_bfloat16, Element>();
    }
  };
  if (p.dtype() == DType::f16)
    with_score.template operator()<__half>();
  else
    with_score.template operator()<__nv_bfloat16>();
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

void softmax_nm24(Stream stream, DeviceNm24& p, float* lse) {
  require(p.values() != nullptr || p.rows() == 0, ErrorCode::invalid_argument, "softmax_nm24: P is empty");
  if (p.rows() == 0) return;
  const int64_t kblocks = p.cols_padded() / kFragmentK;
  auto* values = static_cast<uint32_t*>(p.values());
  const unsigned blocks = blocks_for(p.rows() * kLanes);
  if (p.dtype() == DType::f16)
    softmax_rows_kernel<__half><<<blocks, kThreadsPerBlock, 0, stream>>>(values, p.rows(), kblocks, lse);
  else
    softmax_rows_kernel<__nv_bfloat16><<<blocks, kThreadsPerBlock, 0, stream>>>(values, p.rows(), kblocks, lse);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace nmkit::gpu
