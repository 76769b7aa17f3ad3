// The Hopper tile kernel built with its timeline recorded (RecordTimeline), for diagnosis only: f16 A, B and D,
// the instantiations one benchmark dtype needs, apart from the product's so that they cost it no compile time.
#include "sm90_tile_kernel.cuh"

namespace nmkit::gpu::tile {

void launch_sm90_timeline(const TileParams& p, const Sm90TileConfig& config, uint64_t* timeline, cudaStream_t stream) {
  launch_with<__half, __half>(p, config, RecordTimeline{timeline}, stream);
}

}  // namespace nmkit::gpu::tile
