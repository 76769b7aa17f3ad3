#include <cuda_runtime.h>

#include <string>

#include "common/check.cuh"
#include "nmkit/gpu/detail/device_buffer.hpp"

namespace nmkit::gpu {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  NMKIT_CUDA_CHECK(cudaMalloc(&ptr_, bytes ? bytes : 1));
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    cudaFree(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

void DeviceBuffer::copy_from_host(const void* src, std::size_t bytes) {
  require(bytes <= bytes_, ErrorCode::invalid_argument,
          [&] { return "DeviceBuffer: copying " + std::to_string(bytes) + " bytes into " + std::to_string(bytes_); });
  NMKIT_CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t bytes) const {
  require(bytes <= bytes_, ErrorCode::invalid_argument,
          [&] { return "DeviceBuffer: copying " + std::to_string(bytes) + " bytes out of " + std::to_string(bytes_); });
  NMKIT_CUDA_CHECK(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace nmkit::gpu
