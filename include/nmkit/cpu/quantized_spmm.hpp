#pragma once
// The CPU reference of the 8-bit N:M product, the oracle of the fp8 and int8 GPU kernels: an 8-bit N:M weight
// (format/quantized.hpp, one scale per output channel) times 8-bit activations (one scale per token, or the same
// scale on every token for per-tensor scaling), the scales applied in the epilogue.
//
//   D[r][t] = out( act( alpha * scale_w[r] * scale_x[t] * dot(r, t) + bias[r] + beta * C[r][t] ) )
//   dot(r, t) = sum over the stored entries (r, k) of code_w(r, k) * code_x(t, k)
//
// code_* are the codes' values (code_value: e4m3, e5m2 or int8, unscaled). dot is exact for int8 (int64; a kernel
// accumulating in s32 agrees while K * 127^2 < 2^31, K <= 133,144) and for fp8 summed in double, where every
// product of two fp8 values is exact; alpha * scale_w * scale_x * dot is computed in double and rounded once to
// fp32, then bias, beta * C (fp32) and the activation follow as in spmm's epilogue, and out() rounds to the output
// dtype (round_to: f16 and bf16 to nearest even; the value is written as fp32 into D). Zero scales give exact
// zeros (never NaN). The weight and activations must both be int8 or both fp8 (e4m3 and e5m2 mix, as the
// tensor cores take them).
#include "nmkit/cpu/spmm.hpp"
#include "nmkit/format/quantized.hpp"

namespace nmkit {

// w: R x K; x: T x K (a row per token, as x[T, K] of a linear layer); C and D: R x T in either layout (D col-major
// is y[T, R] row-major). C is read only when beta != 0. Throws Error naming the mismatched shape, an invalid
// weight or activation (validate), or mixed int8 and fp8 (unsupported).
void quantized_spmm(const QuantizedNmMatrix& w, const QuantizedRows& x, ConstMatrixRef c, MatrixRef d,
                    const Epilogue& epilogue = {}, DType output = DType::f32);

}  // namespace nmkit
