#pragma once
// A sparse linear layer on the GPU: y[T, R] = act(x[T, K] W^T + bias), W pruned in any GPU format (2:4, V:N:M,
// tiles), x and y row-major in W's dtype (nn.Linear's layout). Owns the weight and a plan per bucket of token counts
// (detail/token_buckets.hpp; per T for tiles). Condensed V:N:M transposes x into a workspace from 64 tokens on, grown
// at the first run of a larger T: run the largest T once before capturing a CUDA graph.
//   SparseLinear layer = SparseLinear::create(prune_magnitude(w, parse_format_spec("2:4")).compressed);
//   layer.run(stream, x, y, tokens, bias);   // asynchronous; the plan of `tokens`' bucket is made on first use
#include <cstddef>
#include <memory>
#include <string>
#include "nmkit/format/spec.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {
class SparseLinear {
 public:
  // Packs, uploads `weight` (2:4, vnm:V:N:M, tile:RxC; f16, bf16), else throws Error. bias: run() takes R floats.
  static SparseLinear create(const SparseMatrix& weight, Activation activation = Activation::none, bool bias = false);
  SparseLinear(SparseLinear&&) noexcept;
  SparseLinear& operator=(SparseLinear&&) noexcept;
  ~SparseLinear();
  // x: tokens x K, y: tokens x R (16-byte aligned for the Hopper kernels), bias: R floats or null. Asynchronous, none
  // for 0 tokens. Throws Error on null pointers, a wrong bias or tokens < 0. Not thread-safe, one stream at a time.
  void run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias = nullptr);
  int64_t in_features() const noexcept;   // K
  int64_t out_features() const noexcept;  // R
  DType dtype() const noexcept;
  Activation activation() const noexcept;
  bool has_bias() const noexcept;
  const std::string& format() const noexcept;  // "2:4", "vnm:128:2:8", "tile:64x64"
  std::string kernel(int64_t tokens);          // what a run with `tokens` launches (makes its plan)
  std::size_t plans() const noexcept;          // plans made so far

 private:
  struct Impl;
  explicit SparseLinear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
}  // namespace nmkit::gpu
