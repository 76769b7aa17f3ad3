// Lists the CUDA devices; the only CUDA code of the foundation, so the toolchain is exercised early.
#include <cuda_runtime.h>

#include "nmkit/device.hpp"

namespace nmkit {

DeviceQuery query_cuda_devices() {
  DeviceQuery q;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    q.why_none = std::string("no CUDA device available (") + cudaGetErrorString(status) + ")";
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return q;
  }
  if (count == 0) q.why_none = "no CUDA device found";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    q.devices.push_back({i, prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem});
  }
  return q;
}

}  // namespace nmkit
