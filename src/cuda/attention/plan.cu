// Host side of the fused DFSS attention: validation, tensor maps and the launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../common/check.cuh"
#include "../common/smem.cuh"
#include "../common/tensor_map.cuh"
#include "nmkit/attention/dfss_gpu.hpp"
#include "sm90_dfss_kernel.cuh"

namespace nmkit::gpu {
namespace {

namespace k = cuda::attention;

constexpr const char* kWho = "attention plan";
constexpr float kLog2E = 1.4426950408889634f;

std::string str(int64_t v) { return std::to_string(v); }

// Zero strides mean the packed [B, H, S, D] layout. A tensor without tokens is never read: any valid strides do.
AttentionStrides resolved(const AttentionStrides& s, int64_t heads, int64_t tokens, int head_dim) {
  if (tokens > 0 && (s.batch != 0 || s.head != 0 || s.token != 0)) return s;
  tokens = std::max<int64_t>(tokens, 1);
  return {heads * tokens * head_dim, tokens * head_dim, head_dim};
}

// TMA takes byte strides below 2^40.
constexpr int64_t kMaxStride = int64_t{1} << 38;

void check_strides(const AttentionStrides& s, bool variable_lengths, const char* name) {
  // TMA takes byte strides that are multiples of 16: 8 elements of 16 bits.
  const bool batch_ok = variable_lengths || (s.batch > 0 && s.batch % 8 == 0 && s.batch < kMaxStride);
  require(batch_ok && s.head > 0 && s.head % 8 == 0 && s.head < kMaxStride && s.token > 0 && s.token % 8 == 0 &&
              s.token < kMaxStride,
          ErrorCode::invalid_argument, [&] {
            return std::string(kWho) + ": " + name +
                   " strides must be positive multiples of 8 elements (16 bytes) below 2^38, " + "got batch " +
                   str(s.batch) + ", head " + str(s.head) + ", token " + str(s.token);
          });
}

template <class Element>
CUtensorMap operand_map(const void* base, const AttentionStrides& s, int64_t tokens, int64_t heads, int64_t batch,
                        int head_dim, bool variable_lengths, int box_rows) {
  constexpr int64_t kBytes = sizeof(Element);
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim),
                              static_cast<cuuint64_t>(std::max<int64_t>(tokens, 1)),  // K/V of seq_k = 0 are never read

                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(variable_lengths ? 1 : batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(s.token * kBytes), static_cast<cuuint64_t>(s.head * kBytes),
                                 static_cast<cuuint64_t>((variable_lengths ? s.head : s.batch) * kBytes)};
  const cuuint32_t box[4] = {k::kChunkColumns, static_cast<cuuint32_t>(box_rows), 1, 1};
  return cuda::make_tensor_map_sw128<Element, 4>(base, dims, strides, box);
}

// K for 2:4 by boxes (Producer::load_permuted_keys): dimensions head dim, token, group, block (the last three are
// token strides 1, kGroupKeys and kBlockKeys over the same memory), head; a box of 64 x kPairKeys x 4 x kGroupBlocks
// fills half a step in PermutedKeys' order. Five dimensions leave none for the batch, so it is folded into the
// heads (batch stride = kv_heads head strides) or the tokens (batch stride = seq_k token strides); with other
// strides the kernel copies K instead. The token dimension bounds a box's first kPairKeys keys only: the kernel
// loads whole steps of existing keys this way.
struct PermutedKeyMap {
  k::KeyLoad load = k::KeyLoad::copies;
  CUtensorMap map{};
};

template <class Element, int kBlockN>
PermutedKeyMap permuted_key_map(const void* base, const AttentionDesc& d, const AttentionStrides& s) {
  constexpr int64_t kBytes = sizeof(Element);
  constexpr int kGroupsPerBlock = k::kBlockKeys / k::kGroupKeys;
  constexpr int kGroupBlocks = k::PermutedKeys<kBlockN>::kGroupBlocks;
  int64_t tokens = d.variable_lengths ? d.total_k : d.seq_k, heads = d.kv_heads;
  PermutedKeyMap result;
  if (d.variable_lengths || d.batch == 1 || s.batch == d.kv_heads * s.head) {
    result.load = k::KeyLoad::boxes_batch_in_heads;
    if (!d.variable_lengths) heads *= d.batch;
  } else if (s.batch == d.seq_k * s.token) {
    result.load = k::KeyLoad::boxes_batch_in_tokens;
    tokens *= d.batch;
  }
  // Coordinates are 32-bit; byte strides stay below 2^40.
  const int64_t block_stride = k::kBlockKeys * s.token * kBytes;
  if (result.load == k::KeyLoad::copies || tokens >= (int64_t{1} << 31) || heads >= (int64_t{1} << 31) ||
      block_stride >= (int64_t{1} << 40) || tokens == 0)
    return {};
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(d.head_dim), static_cast<cuuint64_t>(tokens), kGroupsPerBlock,
                              kGroupBlocks, static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[4] = {static_cast<cuuint64_t>(s.token * kBytes),
                                 static_cast<cuuint64_t>(k::kGroupKeys * s.token * kBytes),
                                 static_cast<cuuint64_t>(block_stride), static_cast<cuuint64_t>(s.head * kBytes)};
  const cuuint32_t box[5] = {k::kChunkColumns, k::kPairKeys, kGroupsPerBlock, kGroupBlocks, 1};
  result.map = cuda::make_tensor_map_sw128<Element, 5>(base, dims, strides, box);
  return result;
}

template <class Element, int kHeadDim, bool kSparse>
void launch(const AttentionDesc& d, const AttentionTensors& t, const AttentionStrides& qs, const AttentionStrides& ks,
            const AttentionStrides& vs, const AttentionStrides& os, float scale, cudaStream_t stream) {
  using L = k::SharedLayout<kHeadDim>;
  const bool varlen = d.variable_lengths;
  const int64_t tokens_q = varlen ? d.total_q : d.seq_q, tokens_k = varlen ? d.total_k : d.seq_k;
  const CUtensorMap q_map = operand_map<Element>(t.q, qs, tokens_q, d.heads, d.batch, kHeadDim, varlen, k::kBlockM);
  const PermutedKeyMap permuted = kSparse ? permuted_key_map<Element, L::kBlockN>(t.k, d, ks) : PermutedKeyMap{};
  const CUtensorMap k_map =
      permuted.load != k::KeyLoad::copies
          ? permuted.map
          : operand_map<Element>(t.k, ks, tokens_k, d.kv_heads, d.batch, kHeadDim, varlen, L::kBlockN);
  const CUtensorMap v_map = operand_map<Element>(t.v, vs, tokens_k, d.kv_heads, d.batch, kHeadDim, varlen, L::kBlockN);
  k::Params p{};
  p.k = t.k, p.k_batch = ks.batch, p.k_head = ks.head, p.k_token = ks.token;
  p.o = t.o, p.lse = t.lse;
  p.cu_seqlens_q = varlen ? t.cu_seqlens_q : nullptr;
  p.cu_seqlens_k = varlen ? t.cu_seqlens_k : nullptr;
  p.o_batch = os.batch, p.o_head = os.head, p.o_token = os.token;
  p.seq_q = static_cast<int>(d.seq_q), p.seq_k = static_cast<int>(d.seq_k);
  p.total_q = static_cast<int>(d.total_q);
  p.heads = static_cast<int>(d.heads), p.kv_group = static_cast<int>(d.heads / d.kv_heads);
  p.scale = scale, p.scale_log2 = scale * kLog2E;
  p.causal = d.causal ? 1 : 0;
  p.key_load = permuted.load;
  p.kv_heads = static_cast<int>(d.kv_heads);

  constexpr int kSmem = L::kAllocationBytes;
  static_assert(kSmem <= cuda::kSm90SharedMemoryPerCta, "the stages fit one CTA");
  auto kernel = k::sm90_dfss_kernel<Element, kHeadDim, kSparse>;
  static cuda::DynamicSmemLimit limit;
  limit.raise(kernel, kSmem);
  const dim3 grid(static_cast<unsigned>((d.seq_q + k::kBlockM - 1) / k::kBlockM), static_cast<unsigned>(d.heads),
                  static_cast<unsigned>(d.batch));
  kernel<<<grid, k::kThreads, kSmem, stream>>>(p, q_map, k_map, v_map);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

template <class Element, int kHeadDim>
void dispatch(const AttentionDesc& d, const AttentionTensors& t, float scale, cudaStream_t stream) {
  if (d.pattern == AttentionPattern::nm24)
    launch<Element, kHeadDim, true>(d, t, d.q, d.k, d.v, d.o, scale, stream);
  else
    launch<Element, kHeadDim, false>(d, t, d.q, d.k, d.v, d.o, scale, stream);
}

template <class Element>
void dispatch(const AttentionDesc& d, const AttentionTensors& t, float scale, cudaStream_t stream) {
  if (d.head_dim == 64)
    dispatch<Element, 64>(d, t, scale, stream);
  else
    dispatch<Element, 128>(d, t, scale, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

const char* pattern_name(AttentionPattern p) noexcept { return p == AttentionPattern::nm24 ? "2:4" : "dense"; }

AttentionPlan AttentionPlan::create(const AttentionDesc& desc) {
  AttentionDesc d = desc;
  if (d.kv_heads == 0) d.kv_heads = d.heads;
  require(d.batch >= 1 && d.heads >= 1 && d.kv_heads >= 1 && d.seq_q >= 0 && d.seq_k >= 0, ErrorCode::invalid_argument,
          [&] {
            return std::string(kWho) + ": batch, heads and kv_heads must be >= 1 and lengths >= 0, got batch " +
                   str(d.batch) + ", heads " + str(d.heads) + ", kv_heads " + str(d.kv_heads) + ", seq_q " +
                   str(d.seq_q) + ", seq_k " + str(d.seq_k);
          });
  require(d.heads % d.kv_heads == 0, ErrorCode::invalid_argument, [&] {
    return std::string(kWho) + ": kv_heads (" + str(d.kv_heads) + ") must divide heads (" + str(d.heads) + ")";
  });
  require(d.head_dim == 64 || d.head_dim == 128, ErrorCode::invalid_argument,
          [&] { return std::string(kWho) + ": head_dim must be 64 or 128, got " + str(d.head_dim); });
  require(d.dtype == DType::f16 || d.dtype == DType::bf16, ErrorCode::invalid_argument,
          [&] { return std::string(kWho) + ": dtype must be f16 or bf16, got " + dtype_name(d.dtype); });
  require(!d.scale || (std::isfinite(*d.scale) && *d.scale > 0.0f), ErrorCode::invalid_argument,
          [&] { return std::string(kWho) + ": scale must be finite and positive"; });
  if (d.variable_lengths) {
    require(d.total_q >= d.seq_q && d.total_k >= d.seq_k && d.total_q >= 1 && d.total_k >= 1,
            ErrorCode::invalid_argument, [&] {
              return std::string(kWho) +
                     ": variable lengths need total_q >= seq_q, total_k >= seq_k, both >= 1, got total_q " +
                     str(d.total_q) + ", total_k " + str(d.total_k);
            });
  }
  // 32-bit token and grid arithmetic in the kernel.
  constexpr int64_t kMaxTokens = int64_t{1} << 30;
  require(std::max({d.seq_q, d.seq_k, d.total_q, d.total_k}) < kMaxTokens && d.heads < 65536 && d.batch < 65536,
          ErrorCode::invalid_argument,
          [&] { return std::string(kWho) + ": at most 2^30 tokens, 65535 heads and sequences"; });
  d.q = resolved(d.q, d.heads, d.variable_lengths ? d.total_q : d.seq_q, d.head_dim);
  d.k = resolved(d.k, d.kv_heads, d.variable_lengths ? d.total_k : d.seq_k, d.head_dim);
  d.v = resolved(d.v, d.kv_heads, d.variable_lengths ? d.total_k : d.seq_k, d.head_dim);
  d.o = resolved(d.o, d.heads, d.variable_lengths ? d.total_q : d.seq_q, d.head_dim);
  check_strides(d.q, d.variable_lengths, "q");
  check_strides(d.k, d.variable_lengths, "k");
  check_strides(d.v, d.variable_lengths, "v");
  require(d.o.head > 0 && d.o.token > 0 && (d.variable_lengths || d.o.batch > 0) && d.o.head % 2 == 0 &&
              d.o.token % 2 == 0 && d.o.batch % 2 == 0,
          ErrorCode::invalid_argument, [&] {
            return std::string(kWho) + ": o strides must be positive and even (pairs of elements are stored together)";
          });

  int device = 0, major = 0;
  NMKIT_CUDA_CHECK(cudaGetDevice(&device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  require(major == 9, ErrorCode::unsupported, [&] {
    return std::string(kWho) + ": the fused kernel needs a Hopper GPU (sm_90a), this device is sm_" + str(major) + "x";
  });

  AttentionPlan plan;
  plan.desc_ = d;
  const auto config_of = [](auto layout) {
    using L = decltype(layout);
    return AttentionConfig{k::kBlockM, L::kBlockN, L::kStages, k::kThreads, L::kAllocationBytes};
  };
  plan.config_ = d.head_dim == 64 ? config_of(k::SharedLayout<64>{}) : config_of(k::SharedLayout<128>{});
  return plan;
}

float AttentionPlan::scale() const noexcept {
  return desc_.scale ? *desc_.scale : 1.0f / std::sqrt(static_cast<float>(desc_.head_dim));
}

void AttentionPlan::run(CUstream_st* stream, const AttentionTensors& t) const {
  const AttentionDesc& d = desc_;
  require(t.q && t.k && t.v && t.o, ErrorCode::invalid_argument,
          [&] { return std::string(kWho) + ": q, k, v and o must not be null"; });
  require(aligned16(t.q) && aligned16(t.k) && aligned16(t.v), ErrorCode::invalid_argument,
          [&] { return std::string(kWho) + ": q, k and v must be 16-byte aligned"; });
  require(reinterpret_cast<uintptr_t>(t.o) % 4 == 0 && reinterpret_cast<uintptr_t>(t.lse) % 4 == 0,
          ErrorCode::invalid_argument, [&] { return std::string(kWho) + ": o and lse must be 4-byte aligned"; });
  require(!d.variable_lengths || (t.cu_seqlens_q && t.cu_seqlens_k), ErrorCode::invalid_argument,
          [&] { return std::string(kWho) + ": variable lengths need cu_seqlens_q and cu_seqlens_k"; });
  if (d.seq_q == 0) return;
  if (d.dtype == DType::f16)
    dispatch<__half>(d, t, scale(), stream);
  else
    dispatch<__nv_bfloat16>(d, t, scale(), stream);
}

}  // namespace nmkit::gpu
