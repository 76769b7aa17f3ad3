// The skinny SpMM on 8-bit codes (sm80_skinny_kernel.cuh; mma.sp m16n8k64, sm_89 and later): decode-sized products of
// an fp8 or int8 2:4 weight, in a translation unit of its own so that the two element widths compile in parallel.
#include "sm80_skinny_kernel.cuh"

namespace nmkit::gpu::nm24 {

#define NMKIT_INSTANTIATE_SKINNY_8BIT(ELEMENT)                                                                        \
  template void launch_skinny<ELEMENT, __half>(const Params&, int, int, SkinnyB, const LaunchOn&, const CodeScales&); \
  template void launch_skinny<ELEMENT, __nv_bfloat16>(const Params&, int, int, SkinnyB, const LaunchOn&,              \
                                                      const CodeScales&);                                             \
  template void launch_skinny<ELEMENT, float>(const Params&, int, int, SkinnyB, const LaunchOn&, const CodeScales&);
NMKIT_INSTANTIATE_SKINNY_8BIT(__nv_fp8_e4m3)
NMKIT_INSTANTIATE_SKINNY_8BIT(__nv_fp8_e5m2)
NMKIT_INSTANTIATE_SKINNY_8BIT(int8_t)
#undef NMKIT_INSTANTIATE_SKINNY_8BIT

}  // namespace nmkit::gpu::nm24
