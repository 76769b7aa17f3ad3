#pragma once
// Owning device memory: the device weights' storage, and scratch for the CLI and tests, which include no CUDA headers.
#include <cstddef>
#include <vector>

namespace nmkit::gpu {
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);  // cudaMalloc; throws Error(cuda_error)
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return bytes_; }
  void copy_from_host(const void* src, std::size_t bytes);  // synchronous
  void copy_to_host(void* dst, std::size_t bytes) const;    // synchronous (waits for the device)

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};
}  // namespace nmkit::gpu
