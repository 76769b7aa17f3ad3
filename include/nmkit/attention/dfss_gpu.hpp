#pragma once
// Fused DFSS attention on the GPU (Hopper): O = softmax(prune(scale * Q * K^T + causal mask)) * V, each row of scores
// pruned to 2:4 over the keys in registers (the rule of nmkit/attention/dfss.hpp), P * V on the sparse tensor cores.
//   AttentionDesc desc{.batch = 2, .heads = 32, .seq_q = 4096, .seq_k = 4096, .head_dim = 128};
//   AttentionPlan plan = AttentionPlan::create(desc);                 // validates, once per shape
//   plan.run(stream, {.q = q, .k = k, .v = v, .o = o});               // one launch
#include <cstdint>
#include <optional>

#include "nmkit/dtype.hpp"

struct CUstream_st;
namespace nmkit::gpu {

enum class AttentionPattern : uint8_t { dense, nm24 };  // dense: the same kernel with pruning off (the control)
const char* pattern_name(AttentionPattern p) noexcept;

// Element strides of a [batch, heads, tokens, head_dim] tensor whose head_dim is contiguous. All zero: packed
// [B, H, S, D] (PyTorch SDPA's layout; under variable lengths [H, total, D]). Under variable lengths the batch
// stride is unused: sequence b's tokens start at cu_seqlens[b] (FlashAttention's [total, H, D] is {0, D, H * D}).
struct AttentionStrides {
  int64_t batch = 0, head = 0, token = 0;
};

struct AttentionDesc {
  int64_t batch = 1;                 // sequences
  int64_t heads = 1;                 // query heads
  int64_t kv_heads = 0;              // key/value heads, dividing heads (grouped-query attention); 0: heads
  int64_t seq_q = 0, seq_k = 0;      // tokens per sequence; under variable lengths the longest
  int64_t total_q = 0, total_k = 0;  // variable lengths: all sequences' tokens (the tensors' token extent)
  int head_dim = 128;                // 64 or 128, the same for Q, K and V
  DType dtype = DType::bf16;         // Q, K, V and O: f16 or bf16
  AttentionPattern pattern = AttentionPattern::nm24;
  bool causal = false;         // key j > query i masked (top-left aligned, as PyTorch's is_causal)
  std::optional<float> scale;  // default 1 / sqrt(head_dim)
  // run() takes cu_seqlens_q/k (batch + 1 int32 offsets, first 0, the last at most total_q/total_k) and seq_q/seq_k
  // must be at least the longest sequence (unchecked: they are on the device). Keys past a sequence's end are
  // masked; their V rows are multiplied by 0, so they must be finite.
  bool variable_lengths = false;
  AttentionStrides q, k, v, o;
};

// Device pointers, 16-byte aligned. lse (optional): fp32 natural-log log-sum-exp of each row's kept scores,
// [batch, heads, seq_q] (variable lengths: [heads, total_q]); -inf for a row with nothing to attend (O is 0 there).
struct AttentionTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
};

struct AttentionConfig {
  int block_m = 0, block_n = 0, stages = 0, threads = 0, smem_bytes = 0;
};

class AttentionPlan {
 public:
  // Throws Error(invalid_argument) for shapes, strides or patterns outside the above, Error(unsupported) off Hopper.
  static AttentionPlan create(const AttentionDesc& desc);
  // Throws Error on null or misaligned pointers; never synchronises.
  void run(CUstream_st* stream, const AttentionTensors& tensors) const;
  const AttentionDesc& desc() const noexcept { return desc_; }
  const AttentionConfig& config() const noexcept { return config_; }
  float scale() const noexcept;

 private:
  AttentionDesc desc_;
  AttentionConfig config_;
};

}  // namespace nmkit::gpu
