#pragma once
// TMA tensor maps (cuTensorMapEncodeTiled, reached through the runtime's driver entry point so that nothing
// links against libcuda) for the 16-bit and 8-bit operands of the Hopper kernels.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "check.cuh"

namespace nmkit::cuda {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status{};
    NMKIT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &status));
    require(status == cudaDriverEntryPointSuccess && f != nullptr, ErrorCode::cuda_error,
            "cuTensorMapEncodeTiled is not available from the driver");
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A rank-`kRank` tensor of f16/bf16 or 8-bit codes (dims innermost first, byte strides of the outer dims) with
// boxes of `box` elements and the 128-byte swizzle (the box's inner extent must be 128 bytes). Out-of-range
// elements of a box are filled with zeros.
template <class Element, int kRank>
CUtensorMap make_tensor_map_sw128(const void* base, const cuuint64_t (&dims)[kRank],
                                  const cuuint64_t (&byte_strides)[kRank - 1], const cuuint32_t (&box)[kRank]) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16> || sizeof(Element) == 1,
                "16-bit or 8-bit operands");
  CUtensorMap map;
  cuuint32_t element_strides[kRank];
  for (int i = 0; i < kRank; ++i) element_strides[i] = 1;
  // 8-bit codes are moved as bytes: TMA does not look at the values.
  const CUtensorMapDataType type = sizeof(Element) == 1              ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : std::is_same_v<Element, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encode_tiled()(&map, type, kRank, const_cast<void*>(base), dims, byte_strides, box,
                                    element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(r == CUDA_SUCCESS, ErrorCode::cuda_error,
          [&] { return "cuTensorMapEncodeTiled failed with code " + std::to_string(r); });
  return map;
}

}  // namespace nmkit::cuda
