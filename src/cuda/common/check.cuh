#pragma once
// CUDA runtime errors become nmkit::Error(cuda_error) naming the call and where it failed.
#include <cuda_runtime.h>

#include <string>

#include "nmkit/error.hpp"

namespace nmkit::cuda {

inline void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    throw Error(ErrorCode::cuda_error, std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
                                           cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace nmkit::cuda

#define NMKIT_CUDA_CHECK(expr) ::nmkit::cuda::check((expr), #expr, __FILE__, __LINE__)
