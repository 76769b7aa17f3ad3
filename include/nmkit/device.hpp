#pragma once
// What CUDA devices this process can see. Public headers stay free of CUDA headers.
#include <cstddef>
#include <string>
#include <vector>

namespace nmkit {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  std::size_t memory_bytes = 0;
};

struct DeviceQuery {
  std::vector<DeviceInfo> devices;
  std::string why_none;  // set when `devices` is empty: no CUDA in this build, no driver, no GPU
};

DeviceQuery query_cuda_devices();

// Compile-time facts about this build of nmkit.
struct BuildInfo {
  const char* version;
  bool cuda;
  const char* cuda_architectures;  // "" without CUDA
  const char* compiler;
};
BuildInfo build_info() noexcept;

}  // namespace nmkit
