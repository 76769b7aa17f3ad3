#pragma once
// A benchmark run that later calls continue (`nmkit_bench --resume FILE`): a device call has a time limit, and the
// models suite's rows take several calls. The file is the run's JSON; each call keeps the rows it holds, times only
// the others, and rewrites it after every row. Rows are only comparable within one GPU and one set of timing
// settings, so a file made on another GPU or with other settings is refused, not mixed in.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "nmkit/error.hpp"

namespace nmkit::bench {

// A row's identity in a run: the rows of nm24_bench's 2:4 suites carry these keys.
struct RowKey {
  std::string suite;
  int64_t r = 0, k = 0, c = 0;
  std::string dtype;
};

inline bool row_matches(const nlohmann::json& row, const RowKey& key) {
  return row.is_object() && row.value("suite", "") == key.suite && row.value("r", int64_t{-1}) == key.r &&
         row.value("k", int64_t{-1}) == key.k && row.value("c", int64_t{-1}) == key.c &&
         row.value("dtype", "") == key.dtype;
}

inline bool holds_row(const nlohmann::json& rows, const RowKey& key) {
  for (const nlohmann::json& row : rows)
    if (row_matches(row, key)) return true;
  return false;
}

// The run at `path` to continue, checked against this call's GPU and settings: an object with "gpu", "settings",
// "complete" and a "rows" array. A missing file is a new run (null). Throws Error(invalid_argument) naming the file
// and what does not fit.
inline nlohmann::json load_run_to_resume(const std::string& path, const std::string& gpu,
                                         const nlohmann::json& settings) {
  if (!std::filesystem::exists(path)) return nullptr;
  const auto refuse = [&](const std::string& why) {
    return Error(ErrorCode::invalid_argument, "--resume " + path + ": " + why);
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw refuse("cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json run = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (run.is_discarded()) throw refuse("not JSON (an nmkit_bench --json or --resume file)");
  if (!run.is_object() || !run.contains("rows") || !run["rows"].is_array() || !run.contains("gpu"))
    throw refuse("not an nmkit_bench run (no \"gpu\" or \"rows\")");
  if (run["gpu"] != gpu) throw refuse("made on " + run["gpu"].dump() + ", this GPU is \"" + gpu + "\"");
  if (!run.contains("settings")) throw refuse("records no timing settings, so its rows cannot be matched");
  if (run["settings"] != settings)
    throw refuse("timed with other settings (" + run["settings"].dump() + ", here " + settings.dump() + ")");
  return run;
}

}  // namespace nmkit::bench
