// nmkit bench: runs the GPU benchmark driver (bench/gpu/nm24_bench.cpp and its vnm/tile suites, built as nmkit_bench)
// with the remaining arguments, e.g. `nmkit bench --suite llm --json out.json`.
#include <fmt/core.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "commands.hpp"
#include "nmkit/error.hpp"

namespace nmkit::cli {
namespace {

namespace fs = std::filesystem;

// $NMKIT_BENCH, else nmkit_bench next to this executable or where the build tree puts it.
std::string find_bench() {
  if (const char* env = std::getenv("NMKIT_BENCH"); env && *env) return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& candidate :
         {self.parent_path() / "nmkit_bench", self.parent_path() / "../../bench/nmkit_bench"})
      if (fs::exists(candidate)) return fs::weakly_canonical(candidate).string();
  }
  throw Error(ErrorCode::unsupported,
              "nmkit_bench not found (it is built with CUDA: preset 'default'); set NMKIT_BENCH to its path");
}

}  // namespace

Action add_bench(CLI::App& app) {
  app.allow_extras();
  app.prefix_command();  // everything after `bench` goes to the driver,
  app.set_help_flag();   // --help included
  return [&app]() -> int {
    const std::string bench = find_bench();
    std::vector<std::string> args{bench};
    for (const auto& a : app.remaining()) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bench.c_str(), argv.data());
    throw Error(ErrorCode::io_error, bench + ": cannot execute");
  };
}

}  // namespace nmkit::cli
