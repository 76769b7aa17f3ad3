// query_cuda_devices() of a build without CUDA.
#include "nmkit/device.hpp"

namespace nmkit {

DeviceQuery query_cuda_devices() { return {{}, "nmkit was built without CUDA (preset 'cpu')"}; }

}  // namespace nmkit
