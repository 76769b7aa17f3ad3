#pragma once
// 8-bit (e4m3, e5m2, int8) 2:4 weights packed for a wgmma.mma_async.sp m64nNk64 kernel (docs/formats.md, "8-bit
// 2:4 packed for the nm24 kernels"; index maths: nm24_layout_8bit.hpp). Kept in detail/ until the device weight
// and plan that take it exist.
#include <cstdint>
#include <vector>

#include "nmkit/format/quantized.hpp"

namespace nmkit::gpu {

struct PackedNm24x8 {
  int64_t rows = 0, cols = 0;                // logical R, K
  int64_t rows_padded = 0, cols_padded = 0;  // multiples of 128 and 128; padding is zero
  QuantType type = QuantType::e4m3;
  std::vector<uint32_t> values;    // R_padded x K_padded / 2 bytes, tile-major (x8::packed_value_byte)
  std::vector<uint32_t> metadata;  // (fragments, 32 lanes), tile-major (packed_fragment_index)
  std::vector<float> scales;       // (R_padded): the per-row scales, 0 in the padding rows
};

// Packs an 8-bit 2:4 matrix (any R and K). Throws Error for other patterns or whatever validate(a) throws.
PackedNm24x8 pack_nm24(const QuantizedNmMatrix& a);
QuantizedNmMatrix unpack_nm24(const PackedNm24x8& p);  // the inverse (tests, inspection)

}  // namespace nmkit::gpu
