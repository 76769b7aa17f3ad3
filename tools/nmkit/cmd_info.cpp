#include <fmt/core.h>

#include "commands.hpp"
#include "nmkit/device.hpp"

namespace nmkit::cli {

Action add_info(CLI::App&) {
  return [] {
    const BuildInfo b = build_info();
    fmt::print("nmkit {}\n", b.version);
    fmt::print("compiler: {}\n", b.compiler);
    fmt::print("CUDA: {}\n", b.cuda ? fmt::format("yes (architectures {})", b.cuda_architectures) : std::string("no"));
    const DeviceQuery q = query_cuda_devices();
    if (q.devices.empty()) fmt::print("devices: none ({})\n", q.why_none);
    for (const auto& d : q.devices)
      fmt::print("device {}: {} (sm_{}{}, {} SMs, {})\n", d.index, d.name, d.cc_major, d.cc_minor, d.sm_count,
                 human_bytes(static_cast<double>(d.memory_bytes)));
    return 0;
  };
}

}  // namespace nmkit::cli
