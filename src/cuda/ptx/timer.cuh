#pragma once
// Timers (PTX ISA §10.26 %globaltimer: nanoseconds, the same clock on every SM; clock64() counts this SM's cycles).
#include <cstdint>

namespace nmkit::ptx {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns));
  return ns;
}

}  // namespace nmkit::ptx
