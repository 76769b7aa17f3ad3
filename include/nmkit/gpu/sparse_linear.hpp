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
// x and y may also be feature-major (RunLayout): a layer that writes y^T hands the next one, through elementwise
// ops, an x it reads without the transpose a condensed V:N:M weight needs of token-major x.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include "nmkit/format/quantized.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {
// How a layer's x and y lie in memory: token_major is nn.Linear's, x[T, K] and y[T, R] row-major; feature_major is
// their transposes row-major, x^T[K, T] and y^T[R, T] (the product's own B and D: y^T = W x^T).
enum class ActivationLayout : uint8_t { token_major, feature_major };
struct RunLayout {
  ActivationLayout x = ActivationLayout::token_major;
  ActivationLayout y = ActivationLayout::token_major;
  int64_t ldx = 0;  // feature-major x: elements from one row of x^T to the next, >= tokens (0: tokens)
};

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
  // Device scratch a run of `tokens` in `layout` uses: x's 8-bit codes and per-token scales (8-bit weights), x^T with
  // its rows padded to a multiple of 8 tokens (condensed V:N:M: token-major x, or feature-major x with
  // ldx % 8 != 0), or x from feature-major x (the other 16-bit weights); 0 for the rest.
  std::size_t workspace_bytes(int64_t tokens, RunLayout layout = {}) const;
  // run() on scratch of the caller's: at least workspace_bytes(tokens, layout) bytes, 16-byte aligned (null when
  // that is 0), used by this launch alone in `stream`'s order. Layers that run one after another on a stream can
  // then share one buffer, or take it from a caching allocator per call (nmkit.torch does), where run() above keeps
  // a buffer per layer for the layer's life. x and y as `layout` says: the row gather of a condensed V:N:M weight reads
  // feature-major x in place where ldx % 8 == 0 (else a copy with its rows padded to 8 tokens, in the workspace);
  // 2:4, full-2:4 V:N:M and tiles transpose it to token-major x in the workspace (their kernels read B row-major
  // without the narrow n-tiles and split-K of small T); 8-bit weights quantize token-major x only (Error
  // unsupported). Every weight writes either y.
  // Throws Error as run() does, and for scratch too small or misaligned, or ldx < tokens.
  struct Workspace {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  void run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias, Workspace workspace,
           RunLayout layout = {});
  bool reads_feature_major_in_place() const noexcept;  // the row gather: feature-major x needs no transpose
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
  const std::string& format() const noexcept;                 // "2:4", "vnm:128:2:8", "tile:64x64", "2:4 e4m3"
  std::string kernel(int64_t tokens, RunLayout layout = {});  // what such a run launches (makes its plan)
  std::size_t plans() const noexcept;                         // plans held now (bounded)

 private:
  struct Impl;
  explicit SparseLinear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
}  // namespace nmkit::gpu
