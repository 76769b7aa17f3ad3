#pragma once
// Register conversions shared by the kernels' epilogues and softmax.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace nmkit::cuda {

// Two floats rounded to a 16-bit type in one conversion (cvt.rn.{f16,bf16}x2.f32), lo in the low half.
template <class Out>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  static_assert(std::is_same_v<Out, __half> || std::is_same_v<Out, __nv_bfloat16>, "16-bit outputs");
  uint32_t bits;
  if constexpr (std::is_same_v<Out, __half>) {
    const __half2 pair = __floats2half2_rn(lo, hi);
    memcpy(&bits, &pair, sizeof bits);
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &pair, sizeof bits);
  }
  return bits;
}

}  // namespace nmkit::cuda
