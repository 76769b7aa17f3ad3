#pragma once
// Shared-memory addresses as the 32-bit values PTX instructions take (PTX ISA §5.1.5, state spaces; cvta).
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace nmkit::ptx
