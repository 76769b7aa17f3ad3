#pragma once
// A sparse linear layer on the GPU: y[T, R] = act(x[T, K] W^T + bias), W a pruned weight in any GPU format
// (2:4, V:N:M, tiles), x and y row-major in W's dtype (the layout PyTorch's nn.Linear uses, no transpose).
//
//   SparseLinear layer = SparseLinear::create(prune_magnitude(w, parse_format_spec("2:4")).compressed);
//   layer.run(stream, x, y, tokens, bias);   // one launch; the plan for `tokens` is made on first use
//
// It owns the packed device weight of its format's kernel family and one plan per token count seen, so a model
// calls run() with whatever T its batch has. The Python package (nmkit.torch.SparseLinear) is a thin layer on it.
#include <cstdint>
#include <memory>
#include <string>

#include "nmkit/format/spec.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {

class SparseLinear {
 public:
  // Packs `weight` for its family's kernels and uploads it: 2:4 (N:M with N = 2, M = 4), vnm:V:N:M (the form
  // pack_vnm picks for x[T, K]) or tile:RxC. f16 or bf16 values. Throws Error (unsupported for other N:M
  // patterns and dtypes). `bias`: run() takes an fp32 bias of R values.
  static SparseLinear create(const SparseMatrix& weight, Activation activation = Activation::none, bool bias = false);
  SparseLinear(SparseLinear&&) noexcept;
  SparseLinear& operator=(SparseLinear&&) noexcept;
  ~SparseLinear();

  // x: tokens x K, y: tokens x R (row-major, W's dtype, 16-byte aligned for the Hopper kernels; other alignments
  // take the portable ones), bias: R floats when the layer has one, else nullptr. tokens == 0 launches nothing.
  // Asynchronous on `stream`; throws Error on null pointers, a missing or unexpected bias, or tokens < 0. Not
  // thread-safe (the first call for a token count makes its plan); tile layers at few tokens may run a kernel
  // with a workspace, so one layer's runs must not overlap on two streams.
  void run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias = nullptr);

  int64_t in_features() const noexcept;   // K
  int64_t out_features() const noexcept;  // R
  DType dtype() const noexcept;
  Activation activation() const noexcept;
  bool has_bias() const noexcept;
  const std::string& format() const noexcept;  // "2:4", "vnm:128:2:8", "tile:64x64"
  // The kernel a run with `tokens` launches (makes its plan if there is none yet), e.g. "sm90_wgmma_sp n256".
  std::string kernel(int64_t tokens);

 private:
  struct Impl;
  explicit SparseLinear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nmkit::gpu
