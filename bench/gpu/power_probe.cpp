#include "power_probe.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../../src/cuda/common/check.cuh"
#include "nmkit/error.hpp"

namespace nmkit::bench {

// The NVML entry points used, declared by their documented C signatures (nvml.h is not needed to build).
struct PowerProbe::Nvml {
  using Return = int;                 // nvmlReturn_t: NVML_SUCCESS is 0
  using Device = void*;               // nvmlDevice_t, an opaque handle
  static constexpr int kClockSm = 1;  // nvmlClockType_t NVML_CLOCK_SM

  void* library = nullptr;
  Return (*init)() = nullptr;                                      // nvmlInit_v2
  Return (*shutdown)() = nullptr;                                  // nvmlShutdown
  Return (*device_by_pci_bus_id)(const char*, Device*) = nullptr;  // nvmlDeviceGetHandleByPciBusId_v2
  Return (*clock_mhz)(Device, int, unsigned*) = nullptr;           // nvmlDeviceGetClockInfo
  Return (*power_mw)(Device, unsigned*) = nullptr;                 // nvmlDeviceGetPowerUsage (milliwatts)
  bool initialised = false;
  Device device = nullptr;
  std::string why = "not probed";
};

PowerProbe::PowerProbe(int cuda_device) : nvml_(std::make_unique<Nvml>()) {
  Nvml& n = *nvml_;
  n.library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (n.library == nullptr) {
    n.why = "libnvidia-ml.so.1 (the driver's NVML) not found";
    return;
  }
  const auto bind = [&](auto& function, const char* name) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(n.library, name));
    return function != nullptr;
  };
  if (!bind(n.init, "nvmlInit_v2") || !bind(n.shutdown, "nvmlShutdown") ||
      !bind(n.device_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") ||
      !bind(n.clock_mhz, "nvmlDeviceGetClockInfo") || !bind(n.power_mw, "nvmlDeviceGetPowerUsage")) {
    n.why = "NVML lacks one of the entry points used";
    return;
  }
  if (n.init() != 0) {
    n.why = "nvmlInit_v2 failed";
    return;
  }
  n.initialised = true;
  char bus_id[32];
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, cuda_device) != cudaSuccess ||
      n.device_by_pci_bus_id(bus_id, &n.device) != 0) {
    n.device = nullptr;
    n.why = "NVML does not know the CUDA device";
    return;
  }
  unsigned mhz = 0, mw = 0;
  if (n.clock_mhz(n.device, Nvml::kClockSm, &mhz) != 0 || n.power_mw(n.device, &mw) != 0) {
    n.device = nullptr;
    n.why = "NVML cannot read the SM clock or the power of the device";
  }
}

PowerProbe::~PowerProbe() {
  if (nvml_->initialised) nvml_->shutdown();
  if (nvml_->library != nullptr) dlclose(nvml_->library);
}

bool PowerProbe::available() const noexcept { return nvml_->device != nullptr; }
const char* PowerProbe::why_unavailable() const noexcept { return available() ? "" : nvml_->why.c_str(); }

namespace {

struct Event {
  cudaEvent_t event{};
  Event() { NMKIT_CUDA_CHECK(cudaEventCreate(&event)); }
  ~Event() { cudaEventDestroy(event); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

}  // namespace

SustainedRun PowerProbe::run(const std::function<void(int)>& launch, int sets, double ms, cudaStream_t stream) {
  require(available(), ErrorCode::unsupported, std::string("power probe: ") + why_unavailable());
  require(sets >= 1 && ms > 0, ErrorCode::invalid_argument,
          "power probe: needs an operand set and a positive duration");
  const Nvml& n = *nvml_;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  const auto elapsed_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };

  struct Sample {
    double at_ms;
    unsigned mhz, mw;
  };
  std::vector<Sample> samples;
  samples.reserve(static_cast<std::size_t>(ms) + 64);
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling.load(std::memory_order_relaxed)) {
      unsigned mhz = 0, mw = 0;
      if (n.clock_mhz(n.device, Nvml::kClockSm, &mhz) == 0 && n.power_mw(n.device, &mw) == 0)
        samples.push_back({elapsed_ms(), mhz, mw});
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  // The sampler stops and is joined however this function is left.
  struct StopSampler {
    std::atomic<bool>& sampling;
    std::thread& sampler;
    ~StopSampler() {
      sampling.store(false, std::memory_order_relaxed);
      if (sampler.joinable()) sampler.join();
    }
  } stop_sampler{sampling, sampler};

  // Batches of launches with at most two in flight: the GPU never waits for the host, and the host never runs
  // more than two batches ahead of it.
  constexpr int kBatch = 8;
  Event start, stop, batch_done[2];
  NMKIT_CUDA_CHECK(cudaEventRecord(start.event, stream));
  int launches = 0;
  for (int batch = 0; elapsed_ms() < ms; ++batch) {
    Event& done = batch_done[batch % 2];
    if (batch >= 2) NMKIT_CUDA_CHECK(cudaEventSynchronize(done.event));
    for (int i = 0; i < kBatch; ++i) launch(launches++ % sets);
    NMKIT_CUDA_CHECK(cudaEventRecord(done.event, stream));
  }
  NMKIT_CUDA_CHECK(cudaEventRecord(stop.event, stream));
  NMKIT_CUDA_CHECK(cudaEventSynchronize(stop.event));
  const double end_ms = elapsed_ms();
  sampling.store(false, std::memory_order_relaxed);
  sampler.join();  // the samples are complete (the guard then finds nothing to join)
  float gpu_ms = 0;
  NMKIT_CUDA_CHECK(cudaEventElapsedTime(&gpu_ms, start.event, stop.event));

  SustainedRun r;
  r.launches = launches;
  r.ms_per_launch = gpu_ms / launches;
  std::vector<unsigned> mhz;
  double mw_sum = 0;
  for (const Sample& s : samples)
    if (s.at_ms >= end_ms / 2) mhz.push_back(s.mhz), mw_sum += s.mw;
  r.samples = static_cast<int>(mhz.size());
  if (!mhz.empty()) {
    std::nth_element(mhz.begin(), mhz.begin() + mhz.size() / 2, mhz.end());
    r.sm_mhz = mhz[mhz.size() / 2];
    r.watts = mw_sum / 1000.0 / static_cast<double>(mhz.size());
  }
  return r;
}

}  // namespace nmkit::bench
