// Times the CPU reference: pruning into each format and the SpMM oracle at a given size.
// Usage: nmkit_cpu_bench [R K C [FORMAT...]]   (default 4096 4096 4096 and six formats)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/prune/magnitude.hpp"

using namespace nmkit;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t r = argc > 3 ? std::atoll(argv[1]) : 4096, k = argc > 3 ? std::atoll(argv[2]) : 4096,
                c = argc > 3 ? std::atoll(argv[3]) : 4096;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> w(static_cast<std::size_t>(r * k)), b(static_cast<std::size_t>(k * c)),
      d(static_cast<std::size_t>(r * c));
  for (float& x : w) x = normal(rng);
  for (float& x : b) x = normal(rng);
  const DenseMatrix weight = DenseMatrix::from_float(r, k, w, DType::f16);
  std::printf("%-16s %12s %12s %10s\n", "format", "prune [s]", "spmm [s]", "energy");
  std::vector<const char*> specs = {"2:4",          "vnm:64:2:8",    "vnm:128:2:16",
                                    "vnm:128:2:32", "vnm:128:2:100", "tile:64x64:0.25"};
  if (argc > 4) specs.assign(argv + 4, argv + argc);
  for (const char* spec : specs) {
    auto t0 = std::chrono::steady_clock::now();
    const PruneResult p = prune_magnitude(weight, parse_format_spec(spec));
    const double prune_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    spmm(p.compressed, {b.data(), k, c, Layout::col_major}, {}, {d.data(), r, c, Layout::row_major});
    std::printf("%-16s %12.2f %12.2f %10.4f\n", spec, prune_s, seconds_since(t0), p.energy);
  }
  auto t0 = std::chrono::steady_clock::now();
  gemm(weight, {b.data(), k, c, Layout::col_major}, {}, {d.data(), r, c, Layout::row_major});
  std::printf("%-16s %12s %12.2f\n", "dense gemm", "-", seconds_since(t0));
  return 0;
}
