#pragma once
// OBS with an empirical Fisher as the curvature source (oBERT), a solver like the Hessian OBS of obs.hpp.
//
// Per row, the weights are cut into blocks of B consecutive columns; each block's inverse Fisher
// (lambda I + 1/m sum g g^T)^-1 is built from the m gradient samples by Woodbury rank-one updates; the mask is
// chosen by selection by score over the single-weight saliency, refined with the OBS saliency of the candidate
// sets, and each block's kept weights take the OBS update dw = -F^-1[:, Q] (F^-1_QQ)^-1 w_Q of its pruned set Q.
#include <string>

#include "nmkit/io/safetensors.hpp"
#include "nmkit/prune/obs.hpp"

namespace nmkit {

struct FisherOptions {
  int block = 64;      // columns per Fisher block; a multiple of the format's group (M, or the tile width)
  double damp = 1e-5;  // lambda
  ObsCandidates candidates = ObsCandidates::combinatorial;
};

// Gradient samples of one weight: m x R x K values (any of F32/F16/BF16 in a file), row-major.
struct GradientSamples {
  int64_t samples = 0, rows = 0, cols = 0;
  std::vector<float> values;
};

// Throws Error naming `what`, the sample, row and column of the first NaN or infinity in `grads`.
void require_finite(const GradientSamples& grads, std::string_view what);

// Reads tensor `name` of a gradients file as [m, R, K]; Error naming the tensor when it is missing, its
// shape does not match the weight's R x K, or it holds NaN or infinity.
GradientSamples read_gradients(const SafetensorsFile& file, const std::string& name, int64_t rows, int64_t cols);

// (damp I + 1/m sum_i g_i g_i^T)^-1 for m gradients g_i of length `block` (g_i at grads + i * stride), by
// Woodbury rank-one updates; block x block, row-major.
std::vector<double> fisher_inverse(const float* grads, int64_t stride, int64_t m, int block, double damp);

PruneResult prune_obs_fisher(const DenseMatrix& weight, const GradientSamples& grads, const FormatSpec& spec,
                             const FisherOptions& options = {});

}  // namespace nmkit
