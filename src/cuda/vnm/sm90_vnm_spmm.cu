// The V:N:M SpMM on Hopper: the sm90 sparse kernel (../nm24/sm90_kernel.cuh) on the condensed 2:4 weight,
// with B's rows gathered through the weight's table while they are staged.
#include "../nm24/sm90_kernel.cuh"

namespace nmkit::gpu::nm24 {

using sm90::BSource;

namespace {

// n-tiles per B source: one B tile per stage (V a multiple of 128) or one per consumer warpgroup (V = 64).
template <class Element, class Out, BSource kSource>
void launch_source(const Params& p, int block_n, int b_tiles, const LaunchOn& on) {
  using sm90::launch;
  if (b_tiles == 1) {
    switch (block_n) {
      case 256:
        return launch<Element, Out, 256, kSource, 1>(p, on);
      case 128:
        return launch<Element, Out, 128, kSource, 1>(p, on);
      case 64:
        if constexpr (kSource == BSource::gather_rows)
          if (on.split > 1) return launch<Element, Out, 64, kSource, 1, true>(p, on);
        return launch<Element, Out, 64, kSource, 1>(p, on);
    }
  } else if (b_tiles == 2) {
    switch (block_n) {
      case 128:
        return launch<Element, Out, 128, kSource, 2>(p, on);
      case 64:
        return launch<Element, Out, 64, kSource, 2>(p, on);
    }
  }
  throw Error(ErrorCode::invalid_argument, "sm90 vnm: no kernel with block_n " + std::to_string(block_n) + " and " +
                                               std::to_string(b_tiles) + " B tiles per stage");
}

}  // namespace

template <class Element, class Out>
void launch_sm90_gather(const Params& p, int block_n, Layout b_layout, const LaunchOn& on) {
  const int b_tiles = sm90::kBlockM / p.gather_block_rows;
  if (b_layout == Layout::row_major)
    launch_source<Element, Out, BSource::gather_rows>(p, block_n, b_tiles, on);
  else
    launch_source<Element, Out, BSource::gather_cols>(p, block_n, b_tiles, on);
}

TileShape sm90_gather_tile_shape(int block_n, int b_tiles, bool split_k) {
  using sm90::shape_of;
  if (split_k && b_tiles == 1 && block_n == 64) return shape_of<64, BSource::gather_rows, 1, true>();
  require(!split_k, ErrorCode::invalid_argument, [&] {
    return "sm90 vnm: split-K gathers n-tiles of 64 with one B tile per stage, got block_n " + std::to_string(block_n) +
           " and " + std::to_string(b_tiles) + " B tiles";
  });
  if (b_tiles == 1 && block_n == 256) return shape_of<256, BSource::gather_rows, 1>();
  if (b_tiles == 1 && block_n == 128) return shape_of<128, BSource::gather_rows, 1>();
  if (b_tiles == 1 && block_n == 64) return shape_of<64, BSource::gather_rows, 1>();
  if (b_tiles == 2 && block_n == 128) return shape_of<128, BSource::gather_rows, 2>();
  if (b_tiles == 2 && block_n == 64) return shape_of<64, BSource::gather_rows, 2>();
  throw Error(ErrorCode::invalid_argument, "sm90 vnm: no kernel with block_n " + std::to_string(block_n) + " and " +
                                               std::to_string(b_tiles) + " B tiles per stage");
}

template void launch_sm90_gather<__half, __half>(const Params&, int, Layout, const LaunchOn&);
template void launch_sm90_gather<__half, float>(const Params&, int, Layout, const LaunchOn&);
template void launch_sm90_gather<__nv_bfloat16, __nv_bfloat16>(const Params&, int, Layout, const LaunchOn&);
template void launch_sm90_gather<__nv_bfloat16, float>(const Params&, int, Layout, const LaunchOn&);

}  // namespace nmkit::gpu::nm24
