#pragma once
// The seed's unfused DFSS pipeline on the GPU, one (sequence, head) at a time: scores S = Q * K^T from any dense
// GEMM, pruned to 2:4 (the rule of nmkit/attention/dfss.hpp) into the packed operand of Nm24SpmmPlan, the softmax
// over the kept scores in place, then O = P * V by an Nm24SpmmPlan {rows = S_q, cols = S_k, n = d} with V row-major
// and overlap_launch off (P is written by the launch just before it).
// The fused kernel (dfss_gpu.hpp) is the product; these ops are its baseline and the seed's building blocks.
//   DeviceNm24 p = DeviceNm24::allocate(seq_q, seq_k, DType::bf16);
//   prune_scores_nm24(stream, {.scores = s, .dtype = DType::bf16, .rows = seq_q, .cols = seq_k, .scale = 0.088f}, p);
//   softmax_nm24(stream, p, lse);                               // lse: seq_q floats, or null
//   Nm24SpmmPlan::create({seq_q, seq_k, d, DType::bf16, ...}, {.overlap_launch = false}).run(stream, p, v, nullptr, o);
#include <cstdint>

#include "nmkit/dtype.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {

struct ScoresView {
  const void* scores = nullptr;  // rows x cols, row-major with row stride `ld` (0: cols) elements
  DType dtype = DType::bf16;     // f32, f16 or bf16
  int64_t rows = 0, cols = 0;    // queries, keys
  int64_t ld = 0;
  float scale = 1.0f;   // applied before the rule: the kept values are scale * S
  bool causal = false;  // key j > query i is never kept (top-left aligned)
};

// Each row of scale * S pruned to 2:4 over the keys, written into p (allocated for rows x cols, f16 or bf16: the
// kept scores rounded to its dtype, so they must fit it: |scale * S| <= 65504 for f16). Keys past `cols` and causally
// masked keys score -inf: they are never kept while a group has valid keys, and filler slots hold -inf (softmax_nm24
// turns them into 0). Asynchronous; throws Error on a shape or dtype that does not match p, a null pointer, or ld <
// cols.
void prune_scores_nm24(Stream stream, const ScoresView& scores, DeviceNm24& p);

// In place on a pruned p: each row's kept scores x become exp(x - max) / sum over the row's kept scores; -inf
// scores become 0, and a row with nothing valid becomes zeros. lse (p.rows() floats, or null) receives each row's
// max + log(sum), -inf for a row with nothing valid. Asynchronous; throws Error on a null p.
void softmax_nm24(Stream stream, DeviceNm24& p, float* lse = nullptr);

}  // namespace nmkit::gpu
