// The 2:4 SpMM on Hopper: the sm90 sparse kernel (sm90_kernel.cuh) with B staged by TMA.
#include "sm90_kernel.cuh"

namespace nmkit::gpu::nm24 {

using sm90::BSource;

template <class Element, class Out>
void launch_sm90(const Params& p, int block_n, bool multicast, cudaStream_t stream) {
  using sm90::launch;
  require(!multicast || (ceil_div(p.rows, sm90::kBlockM) % 2 == 0 && block_n >= 128), ErrorCode::invalid_argument,
          "sm90 nm24: B multicast needs an even number of row tiles and an n-tile of at least 128");
  constexpr BSource kTma = BSource::tma;
  switch (block_n) {
    case 256: multicast ? launch<Element, Out, 256, kTma, 1, true>(p, stream) : launch<Element, Out, 256, kTma, 1, false>(p, stream); break;
    case 192: multicast ? launch<Element, Out, 192, kTma, 1, true>(p, stream) : launch<Element, Out, 192, kTma, 1, false>(p, stream); break;
    case 128: multicast ? launch<Element, Out, 128, kTma, 1, true>(p, stream) : launch<Element, Out, 128, kTma, 1, false>(p, stream); break;
    case 64: launch<Element, Out, 64, kTma, 1, false>(p, stream); break;
    case 32: launch<Element, Out, 32, kTma, 1, false>(p, stream); break;
    case 16: launch<Element, Out, 16, kTma, 1, false>(p, stream); break;
    default: throw Error(ErrorCode::invalid_argument, "sm90 nm24: no kernel with block_n " + std::to_string(block_n));
  }
}

TileShape sm90_tile_shape(int block_n) {
  using sm90::shape_of;
  switch (block_n) {
    case 256: return shape_of<256>();
    case 192: return shape_of<192>();
    case 128: return shape_of<128>();
    case 64: return shape_of<64>();
    case 32: return shape_of<32>();
    case 16: return shape_of<16>();
  }
  throw Error(ErrorCode::invalid_argument, "sm90 nm24: no kernel with block_n " + std::to_string(block_n));
}

template void launch_sm90<__half, __half>(const Params&, int, bool, cudaStream_t);
template void launch_sm90<__half, float>(const Params&, int, bool, cudaStream_t);
template void launch_sm90<__nv_bfloat16, __nv_bfloat16>(const Params&, int, bool, cudaStream_t);
template void launch_sm90<__nv_bfloat16, float>(const Params&, int, bool, cudaStream_t);

}  // namespace nmkit::gpu::nm24
