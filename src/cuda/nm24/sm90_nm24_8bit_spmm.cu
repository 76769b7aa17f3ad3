// The 8-bit 2:4 SpMM on Hopper (fp8 e4m3/e5m2, int8): the sm90 sparse kernel (sm90_kernel.cuh) on 8-bit codes, B
// staged by TMA (K-major, the only major-ness 8-bit wgmma takes), the dot products scaled per row and token before
// the epilogue.
#include "sm90_kernel.cuh"

namespace nmkit::gpu::nm24 {

using sm90::BSource;

template <class Element, class Out>
void launch_sm90_8bit(const Params& p, const float* row_scales, const float* token_scales, int block_n,
                      const LaunchOn& on) {
  using sm90::launch;
  require(p.b_col_major, ErrorCode::invalid_argument, "sm90 8-bit: B must be col-major (x[T, K] row-major)");
  const CodeScales scales{row_scales, token_scales};
  constexpr BSource kTma = BSource::tma;
  const bool split = on.split > 1;
  require(!split || block_n <= 64, ErrorCode::invalid_argument,
          [&] { return "sm90 8-bit: split-K runs n-tiles of 16, 32 or 64, got " + std::to_string(block_n); });
  switch (block_n) {
    case 256:
      return launch<Element, Out, 256, kTma, 1>(p, on, scales);
    case 192:
      return launch<Element, Out, 192, kTma, 1>(p, on, scales);
    case 128:
      return launch<Element, Out, 128, kTma, 1>(p, on, scales);
    case 64:
      return split ? launch<Element, Out, 64, kTma, 1, true>(p, on, scales)
                   : launch<Element, Out, 64, kTma, 1>(p, on, scales);
    case 32:
      return split ? launch<Element, Out, 32, kTma, 1, true>(p, on, scales)
                   : launch<Element, Out, 32, kTma, 1>(p, on, scales);
    case 16:
      return split ? launch<Element, Out, 16, kTma, 1, true>(p, on, scales)
                   : launch<Element, Out, 16, kTma, 1>(p, on, scales);
    default:
      throw Error(ErrorCode::invalid_argument, "sm90 8-bit: no kernel with block_n " + std::to_string(block_n));
  }
}

TileShape sm90_8bit_tile_shape(int block_n, bool split_k) {
  return sm90::tma_tile_shape<int8_t>(block_n, split_k, "sm90 8-bit");  // the same stages for every 8-bit type
}

#define NMKIT_INSTANTIATE_8BIT(ELEMENT)                                                                             \
  template void launch_sm90_8bit<ELEMENT, __half>(const Params&, const float*, const float*, int, const LaunchOn&); \
  template void launch_sm90_8bit<ELEMENT, __nv_bfloat16>(const Params&, const float*, const float*, int,            \
                                                         const LaunchOn&);                                          \
  template void launch_sm90_8bit<ELEMENT, float>(const Params&, const float*, const float*, int, const LaunchOn&);
NMKIT_INSTANTIATE_8BIT(__nv_fp8_e4m3)
NMKIT_INSTANTIATE_8BIT(__nv_fp8_e5m2)
NMKIT_INSTANTIATE_8BIT(int8_t)
#undef NMKIT_INSTANTIATE_8BIT

}  // namespace nmkit::gpu::nm24
