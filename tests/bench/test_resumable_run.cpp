// nmkit_bench --resume: which rows a run holds, and which files it refuses to continue.
#include "resumable_run.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "nmkit/error.hpp"
#include "test_util.hpp"

namespace nmkit::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const json kSettings = {{"iters", 5}, {"warmup", 5}, {"variant", ""}};

json run_with_rows(json rows) {
  return {{"gpu", "NVIDIA H200"}, {"settings", kSettings}, {"complete", false}, {"rows", std::move(rows)}};
}

class ResumableRun : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("nmkit_resume_" + std::to_string(::getpid()) + ".json")).string();
    fs::remove(path_);
  }
  void TearDown() override { fs::remove(path_); }
  void write(const std::string& text) const { std::ofstream(path_) << text; }
  std::string path_;
};

TEST(ResumableRunRows, ARowIsItsSuiteShapeAndDtype) {
  const json rows = json::array({{{"suite", "models"}, {"r", 4096}, {"k", 4096}, {"c", 16}, {"dtype", "f16"}},
                                 {{"suite", "models"}, {"r", 1024}, {"k", 8192}, {"c", 1}, {"dtype", "bf16"}}});
  EXPECT_TRUE(holds_row(rows, {"models", 4096, 4096, 16, "f16"}));
  EXPECT_TRUE(holds_row(rows, {"models", 1024, 8192, 1, "bf16"}));
  EXPECT_FALSE(holds_row(rows, {"models", 4096, 4096, 16, "bf16"}));  // another dtype
  EXPECT_FALSE(holds_row(rows, {"models", 4096, 4096, 8, "f16"}));    // another token count
  EXPECT_FALSE(holds_row(rows, {"llm", 4096, 4096, 16, "f16"}));      // another suite
  EXPECT_FALSE(holds_row(rows, {"models", 4096, 1024, 16, "f16"}));   // R and K swapped
  EXPECT_FALSE(holds_row(json::array({"not a row", 3}), {"models", 4096, 4096, 16, "f16"}));
}

TEST_F(ResumableRun, AMissingFileStartsTheRun) {
  EXPECT_TRUE(load_run_to_resume(path_, "NVIDIA H200", kSettings).is_null());
}

TEST_F(ResumableRun, KeepsTheRowsOfARunOnTheSameGpuAndSettings) {
  const json row = {{"suite", "models"}, {"r", 768}, {"k", 768}, {"c", 64}, {"dtype", "f16"}, {"nmkit_ms", 0.01}};
  write(run_with_rows(json::array({row})).dump(2));
  const json run = load_run_to_resume(path_, "NVIDIA H200", kSettings);
  ASSERT_TRUE(run.is_object());
  ASSERT_EQ(run["rows"].size(), 1u);
  EXPECT_EQ(run["rows"][0], row);
  EXPECT_TRUE(holds_row(run["rows"], {"models", 768, 768, 64, "f16"}));
}

TEST_F(ResumableRun, RefusesWhatItCannotContinue) {
  write("{\"gpu\": \"NVIDIA H200\", \"rows\": [");  // cut mid-write
  EXPECT_NMKIT_ERROR(load_run_to_resume(path_, "NVIDIA H200", kSettings), ErrorCode::invalid_argument, "not JSON");
  write("[1, 2, 3]");
  EXPECT_NMKIT_ERROR(load_run_to_resume(path_, "NVIDIA H200", kSettings), ErrorCode::invalid_argument,
                     "not an nmkit_bench run");
  write(json{{"gpu", "NVIDIA H200"}, {"rows", json::object()}, {"settings", kSettings}}.dump());  // rows not a list
  EXPECT_NMKIT_ERROR(load_run_to_resume(path_, "NVIDIA H200", kSettings), ErrorCode::invalid_argument,
                     "not an nmkit_bench run");
  write(run_with_rows(json::array()).dump());
  EXPECT_NMKIT_ERROR(load_run_to_resume(path_, "NVIDIA H100 80GB HBM3", kSettings), ErrorCode::invalid_argument,
                     "made on \"NVIDIA H200\"");
  json other = kSettings;
  other["iters"] = 20;
  EXPECT_NMKIT_ERROR(load_run_to_resume(path_, "NVIDIA H200", other), ErrorCode::invalid_argument, "other settings");
  json unset = run_with_rows(json::array());
  unset.erase("settings");
  write(unset.dump());
  EXPECT_NMKIT_ERROR(load_run_to_resume(path_, "NVIDIA H200", kSettings), ErrorCode::invalid_argument,
                     "no timing settings");
}

}  // namespace
}  // namespace nmkit::bench
