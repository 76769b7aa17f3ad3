// nmkit: prune, inspect and benchmark structured-sparse weights. Errors are one line on stderr.
#include <fmt/core.h>

#include <cstdlib>
#include <vector>

#include "commands.hpp"
#include "nmkit/device.hpp"
#include "nmkit/error.hpp"

namespace nmkit::cli {

std::string default_model_path() {
  if (const char* env = std::getenv("NMKIT_MODEL"); env && *env) return env;
  return NMKIT_DEFAULT_MODEL;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) bytes /= 1024.0, ++u;
  return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s.empty() ? "scalar" : s;
}

}  // namespace nmkit::cli

int main(int argc, char** argv) {
  using namespace nmkit::cli;
  CLI::App app{fmt::format("nmkit {}: structured sparsity (N:M, V:N:M, tile) for sparse tensor cores",
                           nmkit::build_info().version)};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, Action>> commands;
  auto add = [&](const char* name, const char* help, Action (*make)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands.emplace_back(sub, make(*sub));
  };
  add("info", "Version, build options and the CUDA devices found", add_info);
  add("prune", "Prune the 2-D weights of a safetensors file into a sparse format", add_prune);
  add("inspect", "Per tensor: format, shape, density and storage against dense", add_inspect);
  add("demo", "Prune a real model (all-MiniLM-L6-v2) and run one layer's SpMM, verified", add_demo);
  add("eval", "Compare a pruned BERT model's sentence embeddings with the dense model's", add_eval);
  add("bench", "2:4 SpMM on the GPU against cuBLAS and cuSPARSELt (arguments go to nmkit_bench; try --help)",
      add_bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, action] : commands)
      if (sub->parsed()) return action();
  } catch (const nmkit::Error& e) {
    fmt::print(stderr, "nmkit: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "nmkit: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
