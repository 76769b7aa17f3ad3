#pragma once
// Launch configurations for cudaLaunchKernelEx: a plain launch, one that may overlap the kernel before it in the
// stream (programmatic dependent launch; the kernel waits with ptx::grid_dependency_wait, ptx/griddep.cuh), and
// either in clusters of `cluster` CTAs along x.
#include <cuda_runtime.h>

namespace nmkit::cuda {

class OverlappableLaunch {
 public:
  OverlappableLaunch(dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, bool overlap, int cluster = 1) {
    config_.gridDim = grid, config_.blockDim = block;
    config_.dynamicSmemBytes = static_cast<size_t>(smem_bytes), config_.stream = stream;
    unsigned count = 0;
    if (overlap) {
      attributes_[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes_[count++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
      attributes_[count].id = cudaLaunchAttributeClusterDimension;
      attributes_[count++].val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
    }
    config_.attrs = attributes_, config_.numAttrs = count;
  }
  OverlappableLaunch(const OverlappableLaunch&) = delete;  // config_ points into this object
  OverlappableLaunch& operator=(const OverlappableLaunch&) = delete;
  const cudaLaunchConfig_t* config() const noexcept { return &config_; }

 private:
  cudaLaunchConfig_t config_{};
  cudaLaunchAttribute attributes_[2]{};
};

}  // namespace nmkit::cuda
