#pragma once
// Launch configurations for cudaLaunchKernelEx: a plain launch, or one that may overlap the kernel before it in the
// stream (programmatic dependent launch; the kernel waits with ptx::grid_dependency_wait, ptx/griddep.cuh).
#include <cuda_runtime.h>

namespace nmkit::cuda {

class OverlappableLaunch {
 public:
  OverlappableLaunch(dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, bool overlap) {
    config_.gridDim = grid, config_.blockDim = block;
    config_.dynamicSmemBytes = static_cast<size_t>(smem_bytes), config_.stream = stream;
    attribute_.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute_.val.programmaticStreamSerializationAllowed = 1;
    config_.attrs = &attribute_, config_.numAttrs = overlap ? 1 : 0;
  }
  OverlappableLaunch(const OverlappableLaunch&) = delete;  // config_ points into this object
  OverlappableLaunch& operator=(const OverlappableLaunch&) = delete;
  const cudaLaunchConfig_t* config() const noexcept { return &config_; }

 private:
  cudaLaunchConfig_t config_{};
  cudaLaunchAttribute attribute_{};
};

}  // namespace nmkit::cuda
