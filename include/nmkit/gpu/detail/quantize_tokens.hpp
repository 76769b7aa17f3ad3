#pragma once
// Activations to 8-bit codes on the GPU, the input side of the fp8 / int8 2:4 products: not yet a public API.
#include <cstdint>

#include "nmkit/format/quantized.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu::detail {

// x (tokens x cols, f16 or bf16, row-major) to codes (tokens x cols bytes, row-major) and one fp32 scale per token,
// as quantize_rows(x, tokens, cols, type, RowScaling::per_row) gives them for x's values (bit for bit). Where that
// throws, a token holding a NaN or an infinity gets a NaN scale instead, which its products then carry. Any
// alignment; asynchronous on `stream`. Throws Error for other dtypes, negative sizes or null pointers.
void quantize_tokens(Stream stream, const void* x, DType x_dtype, int64_t tokens, int64_t cols, QuantType type,
                     uint8_t* codes, float* scales);

}  // namespace nmkit::gpu::detail
