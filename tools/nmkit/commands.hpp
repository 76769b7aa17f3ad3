#pragma once
// The subcommands of the nmkit CLI. Each registers its options on the app and returns the
// action to run once parsing succeeded.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

namespace nmkit::cli {

using Action = std::function<int()>;

// The linear layers of a BERT encoder file (what demo and eval prune).
inline constexpr const char* kEncoderLinearWeights = R"(^encoder\..*\.weight$)";

Action add_info(CLI::App& app);
Action add_prune(CLI::App& app);
Action add_inspect(CLI::App& app);
Action add_demo(CLI::App& app);
Action add_eval(CLI::App& app);
Action add_bench(CLI::App& app);

// The real model: $NMKIT_MODEL, else the path configured at build time.
std::string default_model_path();
// "1.5 MiB"
std::string human_bytes(double bytes);
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace nmkit::cli

namespace nmkit {
struct ModelPruneReport;
enum class DType : uint8_t;
}  // namespace nmkit
namespace nmkit::cli {
// The per-tensor table of a pruning run and its totals; `all` lists unpruned tensors too.
void print_prune_report(const ModelPruneReport& report, bool all);
// A --dtype of stored values that is no 8-bit type: f32, f16 or bf16; Error naming every choice otherwise.
DType parse_value_dtype(const std::string& name);
// Where config.json and vocab.txt are expected for a weights file: its directory.
std::string calibration_model_dir(const std::string& weights_file);
}  // namespace nmkit::cli
