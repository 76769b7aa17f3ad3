// The 2:4 SpMM on Hopper: the sm90 sparse kernel (sm90_kernel.cuh) with B staged by TMA (K-major for B
// col-major, MN-major for B row-major).
#include "sm90_kernel.cuh"

namespace nmkit::gpu::nm24 {

using sm90::BSource;

template <class Element, class Out>
void launch_sm90(const Params& p, int block_n, const LaunchOn& on) {
  using sm90::launch;
  require(on.split == 1 || p.b_col_major, ErrorCode::invalid_argument, "sm90 nm24: split-K takes B col-major");
  if (!p.b_col_major) {  // B row-major: MN-major boxes of 64 columns
    constexpr BSource kRows = BSource::tma_rows;
    switch (block_n) {
      case 256:
        return launch<Element, Out, 256, kRows, 1>(p, on);
      case 192:
        return launch<Element, Out, 192, kRows, 1>(p, on);
      case 128:
        return launch<Element, Out, 128, kRows, 1>(p, on);
      case 64:
        return launch<Element, Out, 64, kRows, 1>(p, on);
      default:
        throw Error(ErrorCode::invalid_argument,
                    "sm90 nm24: B row-major needs block_n 64, 128, 192 or 256, got " + std::to_string(block_n));
    }
  }
  // Split-K (a cluster per tile) is built for the narrow n-tiles of grids under a wave.
  constexpr BSource kTma = BSource::tma;
  const bool split = on.split > 1;
  require(!split || block_n <= 64, ErrorCode::invalid_argument,
          [&] { return "sm90 nm24: split-K runs n-tiles of 16, 32 or 64, got " + std::to_string(block_n); });
  switch (block_n) {
    case 256:
      return launch<Element, Out, 256, kTma, 1>(p, on);
    case 192:
      return launch<Element, Out, 192, kTma, 1>(p, on);
    case 128:
      return launch<Element, Out, 128, kTma, 1>(p, on);
    case 64:
      return split ? launch<Element, Out, 64, kTma, 1, true>(p, on) : launch<Element, Out, 64, kTma, 1>(p, on);
    case 32:
      return split ? launch<Element, Out, 32, kTma, 1, true>(p, on) : launch<Element, Out, 32, kTma, 1>(p, on);
    case 16:
      return split ? launch<Element, Out, 16, kTma, 1, true>(p, on) : launch<Element, Out, 16, kTma, 1>(p, on);
    default:
      throw Error(ErrorCode::invalid_argument, "sm90 nm24: no kernel with block_n " + std::to_string(block_n));
  }
}

TileShape sm90_tile_shape(int block_n, bool split_k) {
  return sm90::tma_tile_shape<__half>(block_n, split_k, "sm90 nm24");
}

template void launch_sm90<__half, __half>(const Params&, int, const LaunchOn&);
template void launch_sm90<__half, float>(const Params&, int, const LaunchOn&);
template void launch_sm90<__nv_bfloat16, __nv_bfloat16>(const Params&, int, const LaunchOn&);
template void launch_sm90<__nv_bfloat16, float>(const Params&, int, const LaunchOn&);

}  // namespace nmkit::gpu::nm24
