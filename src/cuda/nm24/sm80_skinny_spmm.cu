// The skinny SpMM on 16-bit values (sm80_skinny_kernel.cuh): its instantiations and tile shapes.
#include "sm80_skinny_kernel.cuh"

namespace nmkit::gpu::nm24 {

TileShape skinny_tile_shape(int block_m, int block_n) {
  // A capture default, so that the lambda has no conversion to a function pointer (whose template nvcc warns of).
  return with_tile(block_m, block_n, [&]<int kTilesN, int kSlabs>() {
    using Shape = SkinnyShape<kTilesN, kSlabs>;  // shared memory as the chunk path (a PyTorch layer's x) takes it
    return TileShape{Shape::kRows, Shape::kCols, kFragmentK * kWarps, 0, kThreads, Shape::smem_bytes(true)};
  });
}

#define NMKIT_INSTANTIATE_SKINNY(ELEMENT, OUT) \
  template void launch_skinny<ELEMENT, OUT>(const Params&, int, int, SkinnyB, const LaunchOn&, const CodeScales&);
NMKIT_INSTANTIATE_SKINNY(__half, __half)
NMKIT_INSTANTIATE_SKINNY(__half, float)
NMKIT_INSTANTIATE_SKINNY(__nv_bfloat16, __nv_bfloat16)
NMKIT_INSTANTIATE_SKINNY(__nv_bfloat16, float)
#undef NMKIT_INSTANTIATE_SKINNY

}  // namespace nmkit::gpu::nm24
