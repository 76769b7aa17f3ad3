#pragma once
// Raising a kernel's dynamic shared-memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize) once per kernel
// and size, not on every launch: kernels whose shared memory depends on run-time arguments keep one
// DynamicSmemLimit (a function-local static) and call raise() before each launch.
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

#include "check.cuh"

namespace nmkit::cuda {

// The most dynamic shared memory one sm_90 CTA may take (of the SM's 228 KiB, 1 KiB stays reserved).
inline constexpr int kSm90SharedMemoryPerCta = 227 * 1024;

class DynamicSmemLimit {
 public:
  template <class Kernel>
  void raise(Kernel kernel, int bytes) {
    if (allowed_.load(std::memory_order_acquire) >= bytes) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    if (allowed_.load(std::memory_order_relaxed) >= bytes) return;
    NMKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    allowed_.store(bytes, std::memory_order_release);
  }

 private:
  std::atomic<int> allowed_{0};
  std::mutex mutex_;
};

}  // namespace nmkit::cuda
