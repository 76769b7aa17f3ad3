#pragma once
// Sustained runs with the SM clock and the board power sampled through NVML. Under load the H200 does not hold its
// boost clock (power and heat set it), so two kernels that need the same cycles can differ in speed by the energy
// they spend per cycle; this measures the clock and the power each one holds.
// NVML is loaded at run time (libnvidia-ml.so.1, part of the driver), so the benchmark builds and runs without it.
#include <cuda_runtime.h>

#include <functional>
#include <memory>

namespace nmkit::bench {

struct SustainedRun {
  double ms_per_launch = 0;  // the run's GPU time (CUDA events) over its launches
  double sm_mhz = 0;         // median SM clock of the samples taken in the run's second half
  double watts = 0;          // mean board power of those samples
  int launches = 0, samples = 0;
};

class PowerProbe {
 public:
  // Unavailable (available() false, with the reason in why_unavailable()) where NVML or the device is missing.
  explicit PowerProbe(int cuda_device);
  ~PowerProbe();
  PowerProbe(const PowerProbe&) = delete;
  PowerProbe& operator=(const PowerProbe&) = delete;

  bool available() const noexcept;
  const char* why_unavailable() const noexcept;
  // Launches launch(i % sets) back to back on `stream` for about `ms` milliseconds of wall time, sampling the SM
  // clock and the power every millisecond meanwhile. Requires available().
  SustainedRun run(const std::function<void(int)>& launch, int sets, double ms, cudaStream_t stream);

 private:
  struct Nvml;
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace nmkit::bench
