#pragma once
// DFSS, dynamic N:M sparse attention, CPU reference: S = scale * Q*K^T (+ masks), each row of S pruned to N:M over
// the keys, softmax over the kept scores only, O = P*V with P compressed. The oracle of the GPU kernels.
//
// THE pruning rule (CPU and GPU alike): in every group of M consecutive keys [g*M, g*M + M) of a row, keep the N
// valid keys with the largest score (the score itself, not its magnitude: softmax is monotone, so these are the
// largest probabilities). Ties go to the lower key index. A key is invalid when it is padding, above the diagonal
// under `causal`, or its additive mask makes the score -inf; invalid keys are never kept. A group with fewer than N
// valid keys keeps only those, its other slots are filler. The fused GPU kernel decides unmasked steps on
// y = (score - reference) * scale * log2(e) rounded to f16, the reference being the row's held maximum: scores whose
// y round to the same f16 count as tied (docs/attention.md).
//
// Patterns: the CPU ops take any 1 <= N < M <= 32, as the N:M format does. The sparse tensor cores take 2:4 for
// f16/bf16, which is what the later GPU kernel takes; 1:2 exists there only for tf32/f32 operands (cuSPARSELt's
// 50 % sparsity: 2:4 for 16-bit types, 1:2 for tf32).
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/format/nm.hpp"

namespace nmkit {

// Which scores may be attended. All parts optional; they combine (an entry is masked if any part masks it).
struct AttentionMask {
  bool causal = false;                   // key j > query i is masked (top-left aligned, as PyTorch's is_causal)
  std::span<const uint8_t> key_padding;  // S_k entries, non-zero: the key is padding, never attended; empty: none
  std::span<const float> additive;       // S_q x S_k, row-major, added to the scaled scores; -inf masks; empty: none
};

struct DfssOptions {
  int n = 2;
  int m = 4;
  std::optional<float> scale;  // default 1 / sqrt(d)
  AttentionMask mask;
};

// The scaled, masked scores of q (S_q x d) and k (S_k x d), each row pruned to N:M by the rule above: an fp32
// NmMatrix (rows S_q, cols S_k; when S_k % M != 0 the last group's slots past S_k are the format's K padding, value 0).
// Filler slots inside the row (a group with fewer than N valid keys) hold -inf, so that they stay masked.
// Throws Error: d or mask shapes that disagree, a pattern outside the format's range, NaN/inf inputs, a NaN or +inf
// additive mask entry, a score that is not finite.
NmMatrix sddmm_nm(ConstMatrixRef q, ConstMatrixRef k, float scale, const AttentionMask& mask, int n, int m);

// Row softmax over the kept scores only: P has the same pattern (fp32), kept entries exp(s - max) / sum, filler and
// K-padding slots 0. `lse`, when given, receives each row's log-sum-exp (max + log sum) over its kept scores. A row
// with nothing kept (fully masked) gives zeros and lse = -inf. Throws Error on an invalid NmMatrix or a NaN/+inf score.
NmMatrix softmax_nm(const NmMatrix& scores, std::vector<float>* lse = nullptr);

// O (S_q x d_v, row-major) = P * v, P an S_q x S_k NmMatrix, v S_k x d_v. Throws Error when S_k differs.
std::vector<float> spmm_nm_v(const NmMatrix& p, ConstMatrixRef v);

// sddmm_nm -> softmax_nm -> spmm_nm_v: O (S_q x d_v, row-major). Fully masked rows give zeros.
std::vector<float> dfss_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, const DfssOptions& options,
                                  std::vector<float>* lse = nullptr);

// Plain dense softmax attention with the same scale and masks (options.n and options.m unused), fp64 accumulation:
// what DFSS is compared with. Fully masked rows give zeros and lse = -inf here too.
std::vector<float> attention_reference(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, const DfssOptions& options,
                                       std::vector<float>* lse = nullptr);

}  // namespace nmkit
