#pragma once
// A sparse linear layer on the GPU: y[T, R] = act(x[T, K] W^T + bias), x and y row-major (nn.Linear's layout). W is
// pruned in any GPU format (2:4, V:N:M, tiles) with x and y in W's dtype, or 2:4 with 8-bit values (e4m3, e5m2,
// int8; a scale per row), x and y then f16 or bf16 and x quantized per token on the GPU before the 8-bit product.
// Owns the weight and a plan per bucket of token counts (detail/token_buckets.hpp; per T for tiles). Condensed
// V:N:M transposes x into a workspace (its tokens padded to a multiple of 8), and an 8-bit weight quantizes x into
// one: the layer's own, grown at the first run of a larger T (run the largest T once before capturing a CUDA
// graph), or the caller's.
//   SparseLinear layer = SparseLinear::create(prune_magnitude(w, parse_format_spec("2:4")).compressed);
//   SparseLinear fp8 = SparseLinear::create(quantize_nm(nm, QuantType::e4m3), DType::bf16, Activation::gelu);
//   layer.run(stream, x, y, tokens, bias);   // asynchronous; the plan of `tokens`' bucket is made on first use
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include "nmkit/format/quantized.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {
class SparseLinear {
 public:
  // Packs, uploads `weight` (2:4, vnm:V:N:M, tile:RxC; f16, bf16), else throws Error. bias: run() takes R floats.
  static SparseLinear create(const SparseMatrix& weight, Activation activation = Activation::none, bool bias = false);
  // An 8-bit 2:4 weight (e4m3, e5m2 or int8 codes, per-row scales; K a multiple of 16) run on x and y of `dtype`
  // (f16 or bf16). Throws Error for other patterns, dtypes or K, an invalid weight, or a code type or device the
  // 8-bit kernel does not take (its plan for one token is made here, so that create says so).
  static SparseLinear create(const QuantizedNmMatrix& weight, DType dtype, Activation activation = Activation::none,
                             bool bias = false);
  SparseLinear(SparseLinear&&) noexcept;
  SparseLinear& operator=(SparseLinear&&) noexcept;
  ~SparseLinear();
  // x: tokens x K, y: tokens x R (16-byte aligned for the Hopper kernels; an 8-bit layer's x any alignment), bias:
  // R floats or null. Asynchronous, none for 0 tokens. Throws Error on null pointers, a wrong bias or tokens < 0.
  // Not thread-safe, one stream at a time (the workspaces are the layer's).
  void run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias = nullptr);
  // Device scratch a run of `tokens` uses: x's 8-bit codes and per-token scales (8-bit weights) or x transposed
  // (condensed V:N:M, its rows padded to a multiple of 8 tokens); 0 for the rest.
  std::size_t workspace_bytes(int64_t tokens) const;
  // run() on scratch of the caller's: at least workspace_bytes(tokens) bytes, 16-byte aligned (null when that is
  // 0), used by this launch alone in `stream`'s order. Layers that run one after another on a stream can then share
  // one buffer, or take it from a caching allocator per call (nmkit.torch does), where run() above keeps a buffer
  // per layer for the layer's life. Throws Error as run() does, and for scratch too small or misaligned.
  struct Workspace {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  void run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias, Workspace workspace);
  // An 8-bit layer on x already quantized: x_codes tokens x K codes of quantized() (row-major, 16-byte aligned),
  // x_scales one float per token (x = code * scale), as detail::quantize_tokens writes them. Throws Error as run()
  // does, and for a 16-bit layer.
  void run_quantized(Stream stream, const uint8_t* x_codes, const float* x_scales, void* y, int64_t tokens,
                     const float* bias = nullptr);
  int64_t in_features() const noexcept;                 // K
  int64_t out_features() const noexcept;                // R
  DType dtype() const noexcept;                         // x's and y's
  std::optional<QuantType> quantized() const noexcept;  // the 8-bit weight's code type (and x's); none: 16-bit
  Activation activation() const noexcept;
  bool has_bias() const noexcept;
  const std::string& format() const noexcept;  // "2:4", "vnm:128:2:8", "tile:64x64", "2:4 e4m3"
  std::string kernel(int64_t tokens);          // what a run with `tokens` launches (makes its plan)
  std::size_t plans() const noexcept;          // plans made so far

 private:
  struct Impl;
  explicit SparseLinear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
}  // namespace nmkit::gpu
