// Output files: where a write lands, what it refuses, and that a failed or interrupted write leaves no trace.
#include "nmkit/io/output_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "nmkit/error.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

namespace fs = std::filesystem;

class OutputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("nmkit_output_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static void write(const std::string& p, const std::string& text) {
    const auto* bytes = reinterpret_cast<const std::byte*>(text.data());
    write_file_atomically(p, std::span<const std::byte>(bytes, text.size()));
  }
  bool temporaries_left() const {
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
    return false;
  }

  fs::path dir_;
};

TEST_F(OutputFile, ReplacesARegularFileAndKeepsItsMode) {
  write(path("a"), "first");
  EXPECT_EQ(read(path("a")), "first");
  ASSERT_EQ(::chmod(path("a").c_str(), 0444), 0);
  write(path("a"), "second");
  EXPECT_EQ(read(path("a")), "second");
  struct stat st {};
  ASSERT_EQ(::stat(path("a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444u);
  EXPECT_FALSE(temporaries_left());
}

TEST_F(OutputFile, RefusesDevicesDirectoriesAndFifos) {
  EXPECT_NMKIT_ERROR(write("/dev/null", "x"), ErrorCode::io_error, "not a regular file");
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  fs::create_directory(path("d"));
  EXPECT_NMKIT_ERROR(write(path("d"), "x"), ErrorCode::io_error, "is a directory");
  ASSERT_EQ(::mkfifo(path("f").c_str(), 0644), 0);
  EXPECT_NMKIT_ERROR(write(path("f"), "x"), ErrorCode::io_error, "not a regular file");
  EXPECT_NMKIT_ERROR(write(path("missing/x"), "x"), ErrorCode::io_error, "'" + path("missing") + "' does not exist");
  write(path("plain"), "x");
  EXPECT_NMKIT_ERROR(write(path("plain/x"), "x"), ErrorCode::io_error, "is not a directory");
  EXPECT_FALSE(temporaries_left());
}

// A killed run leaves its temporary file behind, and a later process may get the same pid (containers do):
// the write must still find a name of its own, and leave the leftovers as they were.
TEST_F(OutputFile, LeftoverTemporaryFilesDoNotBlockAWrite) {
  const std::string pid = std::to_string(::getpid());
  std::vector<std::string> leftovers{path("a.tmp." + pid)};
  for (int i = 0; i < 50; ++i) leftovers.push_back(path("a.tmp." + pid + "." + std::to_string(i)));
  for (const std::string& leftover : leftovers) std::ofstream(leftover) << "stale";
  write(path("a"), "fresh");
  EXPECT_EQ(read(path("a")), "fresh");
  for (const std::string& leftover : leftovers) EXPECT_EQ(read(leftover), "stale");
}

TEST_F(OutputFile, FollowsLinksEvenDanglingOnes) {
  write(path("target"), "old");
  fs::create_symlink(path("target"), path("link"));
  write(path("link"), "new");
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_EQ(read(path("target")), "new");
  fs::create_symlink("later", path("dangling"));  // relative, into the same folder
  write(path("dangling"), "made");
  EXPECT_TRUE(fs::is_symlink(path("dangling")));
  EXPECT_EQ(read(path("later")), "made");
  fs::create_symlink(path("loop1"), path("loop2"));
  fs::create_symlink(path("loop2"), path("loop1"));
  EXPECT_NMKIT_ERROR(write(path("loop1"), "x"), ErrorCode::io_error, "too many levels of symbolic links");
}

TEST_F(OutputFile, RefusesTheInputHoweverItIsSpelt) {
  write(path("model"), "dense");
  fs::create_directory(path("sub"));
  const std::vector<std::string> inputs{path("model")};
  for (const std::string& same : {path("model"), path("sub/../model"), path("./model")})
    EXPECT_NMKIT_ERROR(resolve_output_path(same, inputs), ErrorCode::io_error, "is the input file");
  fs::create_hard_link(path("model"), path("hard"));
  EXPECT_NMKIT_ERROR(resolve_output_path(path("hard"), inputs), ErrorCode::io_error, "is the input file");
  EXPECT_EQ(resolve_output_path(path("other"), inputs), path("other"));
  EXPECT_EQ(resolve_output_path("relative.out"), "relative.out");  // in the current directory
  EXPECT_EQ(read(path("model")), "dense");
}

TEST_F(OutputFile, AnInterruptedWriteRemovesItsTemporaryFile) {
  // A child writes a large file; SIGINT arrives while the temporary exists. The child must die of SIGINT (the
  // default action still applies) with the temporary gone and no output in place.
  const std::string target = path("big");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::vector<std::byte> bytes(std::size_t{256} << 20, std::byte{1});
    try {
      write_file_atomically(target, bytes);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  bool signalled = false;
  for (int i = 0; i < 20000 && !signalled; ++i) {
    if (temporaries_left()) {
      ::kill(child, SIGINT);
      signalled = true;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(signalled) << "the temporary file never appeared";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer finished before the signal (status " << status << ")";
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_FALSE(temporaries_left());
  EXPECT_FALSE(fs::exists(target));
}

TEST_F(OutputFile, LeavesTheProcessSignalHandlersAsTheyWere) {
  write(path("a"), "x");
  struct sigaction current {};
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
  ASSERT_EQ(::sigaction(SIGTERM, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
}

}  // namespace
}  // namespace nmkit
